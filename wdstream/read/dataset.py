"""``TokenDataset``: the resumable ``IterableDataset`` of token batches.

A rank's data is ``streams`` independent :class:`~wdstream.read.stream.TokenStream` s served
round-robin in chunks of ``K`` batches (chunks are aligned to multiples of ``K`` inside
each epoch, the last chunk of an epoch may be shorter)::

    streams=4, K=2, nb=3:   s0 b0 b1 | s1 b0 b1 | s2 .. | s3 .. | s0 b2 | s1 b2 | s2 b2 | s3 b2 | next epoch

With ``W`` torch workers (``W`` divides ``streams``), worker ``i`` serves the streams
``(next_stream + i + j * W) % streams`` in that order, one chunk per message, so torch's
in-order worker round-robin reproduces exactly the single-process order above.

Used directly (``DataLoader(ds, batch_size=None)`` or torchdata's ``StatefulDataLoader``)
it yields one batch per item (``K = 1``). :class:`wdstream.Loader` uses it with ``K > 1``
and slices the chunks in the main process.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from wdstream.errors import StateMismatchError
from wdstream.read.context import ReaderConfig, StreamContext
from wdstream.read.mixture import MixtureReader
from wdstream.read.mixture_sources import open_sources
from wdstream.read.mixture_spec import is_mixture, mixture_spec
from wdstream.read.order import OrderConfig, Origin
from wdstream.read.rows import IGNORE_INDEX, RowLabels, doc_ids, row_labels
from wdstream.read.sequence import GlobalPosition, GlobalReader
from wdstream.read.source import ShardSource
from wdstream.read.state import (
    STATE_VERSION,
    Position,
    check_iter_stop,
    check_turns,
    mismatch,
    parse_state,
)
from wdstream.read.stream import ReaderContext
from wdstream.read.text.source import TextSource
from wdstream.read.text.stream import TextContext
from wdstream.tokenizers import Tokenizer

__all__ = ["Chunk", "TokenDataset", "chunk_to_batches", "resolve_order", "resolve_rank"]

# (stream, tokens int32 [n*B, T+1], position_ids int32 [n*B, T] or None, cursors after each batch)
# (with a shared ring, tokens is the slot ``(worker, slot, rows)`` and positions None; a
# mixture's cursors also carry each batch's ``source`` indices, int64 numpy [B])
Chunk = tuple[int, Any, torch.Tensor | None, list[dict[str, Any]]]


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: explicit, else ``torch.distributed``, else env vars, else 0/1."""
    if rank is None or world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    return rank, world_size


def _position_ids(doc_start: np.ndarray) -> np.ndarray:
    """Per-row positions restarting at every piece start and at each row start."""
    starts = doc_start[:, :-1].copy()
    starts[:, 0] = True
    idx = np.arange(starts.shape[1], dtype=np.int32)
    last = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    return idx - last


def _long(x: torch.Tensor, pin: bool) -> torch.Tensor:
    """A contiguous int64 copy of ``x`` (page-locked if ``pin``).

    On the CPU the cast goes through numpy: one thread, in the caller's. torch's own cast
    splits a chunk over its intra-op OpenMP threads, and on a busy 2-core host waking that
    team cost 10-45x the copy (12 ms instead of 0.26 ms for a [128, 2048] chunk, measured).
    """
    if x.device.type != "cpu":
        return x.to(torch.int64, memory_format=torch.contiguous_format)
    out = torch.empty(tuple(x.shape), dtype=torch.int64, pin_memory=pin)
    np.copyto(out.numpy(), x.numpy())
    return out


def chunk_to_batches(
    tokens: torch.Tensor,
    positions: torch.Tensor | None,
    batch_size: int,
    pin: bool = False,
    labels: RowLabels | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Slice a chunk into batches: int64 contiguous ``input_ids``/``labels`` [B, T].

    ``position_ids`` (int64 [B, T]), ``cu_seqlens`` (int32, flat over the batch: the start
    of every piece plus ``B * T`` at the end) and ``doc_ids`` (int32 [B, T], -1 on padding)
    are added when ``positions`` is given. ``labels``: the dataset's target rule
    (:mod:`wdstream.read.rows`: -100 on best-fit padding and, if chosen, document ends).
    """
    n = tokens.shape[0] // batch_size * batch_size
    # One int64 conversion per chunk, not per batch: each batch is a contiguous row slice of
    # it (two calls per chunk instead of two per batch, in the training loop's thread).
    all_ids, all_targets = _long(tokens[:n, :-1], pin), _long(tokens[:n, 1:], pin)
    for j in range(n // batch_size):
        rows = tokens[j * batch_size : (j + 1) * batch_size]
        batch = {
            "input_ids": all_ids[j * batch_size : (j + 1) * batch_size],
            "labels": all_targets[j * batch_size : (j + 1) * batch_size],
        }
        padding = labels.padding(rows) if labels is not None else None
        masked = labels.masked(rows, padding) if labels is not None else None
        if masked is not None:
            batch["labels"].masked_fill_(masked, IGNORE_INDEX)
        if positions is not None:
            pos = _long(positions[j * batch_size : (j + 1) * batch_size], pin)
            flat = pos.reshape(-1)
            starts = torch.nonzero(flat == 0).reshape(-1)
            batch["position_ids"] = pos
            batch["cu_seqlens"] = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(
                torch.int32
            )
            batch["doc_ids"] = doc_ids(pos, padding)
        yield batch


def _new_buffer(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    if not shared:
        return torch.empty(shape, dtype=dtype)
    # Allocate straight into shared memory (as torch's default_collate does) so sending the
    # chunk to the main process does not copy it again.
    numel = int(np.prod(shape))
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel)
    return torch.empty(0, dtype=dtype).new(storage).view(shape)


class TokenDataset(IterableDataset):
    """Shuffled, sharded, exactly resumable batches of ``[batch_size, seq_len]`` tokens.

    Args:
        source: dataset root with ``index.json``, brace pattern of shard URLs, or a list;
            or a mixture: ``{name: dataset}`` (with ``weights``) or the path of a ``.json``
            / ``.toml`` mixture spec (``docs/MIXTURES.md``).
        seq_len: training sequence length T (rows hold T + 1 tokens).
        batch_size: rows per batch B.
        shuffle: permute shards per epoch and shuffle samples in windows.
        seed: the one seed of all randomness.
        rank: this rank (default: ``torch.distributed``, else ``RANK``, else 0).
        world_size: number of ranks (default: ``torch.distributed``, else ``WORLD_SIZE``, else 1).
        streams: ``order="streams"``: independent streams of this rank (a multiple of the
            worker count; default 1). Giving it with ``order=None`` selects that order.
        epochs: epochs per ``iter()`` (None: forever); each ``iter()`` continues where the last
            one stopped, so ``for e in range(E): for b in ds`` with ``epochs=1`` walks E epochs.
        shuffle_window: samples per shuffle window.
        shuffle_lanes: interleaved lanes a window is drawn from.
        chunk_batches: batches per message (K); 1 when used directly.
        return_doc_boundaries: add ``position_ids``, ``cu_seqlens`` and ``doc_ids`` to each
            batch.
        mask_doc_ends: -100 as the target after each document's last token; None: on for
            ``--mode bestfit`` datasets (whose padding targets are always -100), off
            otherwise (``wdstream.read.rows``).
        tokenizer: read raw text (JSON Lines, ``.txt`` or text tar shards) and tokenize it on
            the fly with this tokenizer (see ``docs/READER.md``, "Raw text"); None: ``source``
            is packed token shards.
        text_key: raw text: JSON field holding the text (dotted for nested fields).
        batches_per_epoch: raw text: batches every rank yields per epoch (a multiple of
            ``streams``; a stream that runs out first raises). Without it each stream stops
            when its files run out, so ranks may yield different counts.
        on_error: raw text: ``"raise"`` on a bad record (naming file and line) or ``"skip"``.
        eos: raw text: append ``<|endoftext|>`` to every document.
        tokenize_threads: raw text: threads of one batched tokenizer call.
        order: ``"global"``: one global batch sequence, the same batches for any world size
            and worker count with the same global batch, resumable on another world size,
            with ``batch_at`` (packed datasets only; ``docs/READER.md``). ``"streams"``:
            per-rank streams (the order depends on the world size and ``streams``; the only
            order for raw text). None (default): global for packed datasets, streams for raw
            text or when ``streams`` is given.
        weights: a mixture's ``{name: weight}``, or a schedule ``[(step, {name: weight})]``.
        stop: a mixture's stop rule: None (forever), ``"first_exhausted"`` or
            ``"all_exhausted"`` (``docs/MIXTURES.md``).
        store_options: passed to the storage backend.
    """

    def __init__(
        self,
        source: str | Sequence[str] | Mapping[str, str] | ShardSource | TextSource,
        seq_len: int,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        streams: int | None = None,
        epochs: int | None = None,
        shuffle_window: int = 1024,
        shuffle_lanes: int = 8,
        chunk_batches: int = 1,
        return_doc_boundaries: bool = False,
        tokenizer: str | Tokenizer | None = None,
        text_key: str = "text",
        batches_per_epoch: int | None = None,
        on_error: str = "raise",
        eos: bool = True,
        tokenize_threads: int | None = None,
        order: str | None = None,
        mask_doc_ends: bool | None = None,
        weights: Any = None,
        stop: str | None = None,
        **store_options: Any,
    ) -> None:
        mixed = is_mixture(source)
        if mixed:
            _check_mixture_options(tokenizer, order, streams, epochs)
            order = "global"
        elif weights is not None or stop is not None:
            raise ValueError("weights= and stop= are options of a mixture (a mapping of "
                             "sources or a spec file); this source is one dataset")  # fmt: skip
        text = tokenizer is not None or isinstance(source, TextSource)
        order = resolve_order(order, text, streams)
        streams = 1 if streams is None else streams
        _check_sizes(seq_len=seq_len, batch_size=batch_size, streams=streams,
                     shuffle_window=shuffle_window, shuffle_lanes=shuffle_lanes,
                     chunk_batches=chunk_batches)  # fmt: skip
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be None or >= 1, got {epochs!r}")
        rank, world_size = resolve_rank(rank, world_size)
        self.cfg = ReaderConfig(
            seq_len=seq_len, batch_size=batch_size, shuffle=shuffle, seed=seed, rank=rank,
            world_size=world_size, streams=streams, shuffle_window=shuffle_window,
            shuffle_lanes=shuffle_lanes, chunk_batches=chunk_batches,
            doc_boundaries=return_doc_boundaries,
        )  # fmt: skip
        self.epochs = epochs
        self.source: ShardSource | TextSource  # one dataset (a mixture has one per source)
        self._ctx: StreamContext
        self.sequence: GlobalReader | None = None
        self.mixture: MixtureReader | None = None
        if mixed:
            spec = mixture_spec(source, weights, stop)
            sources = open_sources(spec, **store_options)
            self.labels = _mixture_labels(spec.names, sources, seq_len, mask_doc_ends)
            self.mixture = self.sequence = MixtureReader(
                spec, sources, _order_config(self.cfg), rank, batch_size, chunk_batches,
                return_doc_boundaries,
            )  # fmt: skip
        else:
            assert not isinstance(source, Mapping)
            self.source = _open_source(
                source, tokenizer, batches_per_epoch, text_key=text_key, on_error=on_error,
                eos=eos, **store_options,
            )  # fmt: skip
            index = self.source.index if isinstance(self.source, ShardSource) else None
            self.labels = row_labels(index, seq_len, mask_doc_ends)
            if isinstance(self.source, TextSource):
                self._ctx = TextContext(self.source, self.cfg, batches_per_epoch, tokenize_threads)
            else:
                self._ctx = ReaderContext(self.source, self.cfg)
            if order == "global":
                self.sequence = _global_reader(self.source, self.cfg)
        # Where this reader is: advanced by iteration, replaced by ``load_state_dict``.
        self.position: Position | GlobalPosition = self._start(0)
        # Set by ``Loader``: chunks instead of batches, and the start position in shared
        # memory (workers, persistent or not, read it at every ``iter()``).
        self._yield_chunks = False
        self._shared: torch.Tensor | None = None
        # Set by ``Loader`` with workers: per worker a ring of chunk slots in shared memory
        # ([workers, slots, K*B, T+1] int32, and int32 positions), so a message is a slot
        # number instead of a fresh shared-memory tensor (which costs more than the data).
        self._ring: tuple[torch.Tensor, torch.Tensor | None] | None = None

    # ---- state -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """What a state must match to be loaded here."""
        c = self.cfg
        return {
            "dataset": self.source.fingerprint, "seed": c.seed, "world_size": c.world_size,
            "rank": c.rank, "streams": c.streams, "seq_len": c.seq_len, "batch_size": c.batch_size,
            "shuffle": c.shuffle, "shuffle_window": c.shuffle_window,
            "shuffle_lanes": c.shuffle_lanes, "chunk_batches": c.chunk_batches,
            **self._ctx.config(),
        }  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Small JSON-serialisable position (see ``docs/READER.md``)."""
        return self.state_of(self.position)

    def batch_at(
        self, step: int, origin: Origin | None = None, position: GlobalPosition | None = None
    ) -> dict[str, torch.Tensor]:
        """This rank's batch at global step ``step``: exactly what iteration yields there.

        Costs the same for any step (no replay). Steps are counted as this reader counts
        them (from its loaded state's origin when the global batch size changed); a
        mixture's batch is read under ``position``'s schedule (default: this reader's) and
        carries ``source``.

        Raises:
            TypeError: for the per-rank stream order (``order="streams"``), which has no
                random access.
        """
        if self.sequence is None:
            raise TypeError("batch_at needs order='global' on a packed dataset")
        if position is None:
            assert isinstance(self.position, GlobalPosition)
            position = self.position
        if origin is None:
            origin = position.origin
        c = self.cfg
        tokens = torch.empty((c.batch_size, c.seq_len + 1), dtype=torch.int32)
        doc = np.empty(tuple(tokens.shape), dtype=bool) if c.doc_boundaries else None
        source = None
        if self.mixture is not None:
            rows = self.mixture.rank_rows(step, 1, origin)
            source = self.mixture.fill_rows(rows, position, tokens.numpy(), doc)
        else:
            self.sequence.fill(step, origin, tokens.numpy(), doc)
        positions = torch.from_numpy(_position_ids(doc)) if doc is not None else None
        batch = next(chunk_to_batches(tokens, positions, c.batch_size, labels=self.labels))
        if source is not None:
            batch["source"] = torch.from_numpy(source)
        return batch

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position taken by :meth:`state_dict` (or ``Loader.state_dict``).

        Raises:
            StateMismatchError: if the state is from another dataset or configuration, or
                is malformed or inconsistent (the message names the field and its value).
        """
        self.position = self.position_of(state)

    def state_of(self, position: Position | GlobalPosition) -> dict[str, Any]:
        """The state of ``position`` of this reader: the one place the format is written."""
        if isinstance(position, GlobalPosition):
            assert self.sequence is not None
            return self.sequence.state_of(position)
        worker = list(position.worker) if position.worker is not None else None
        return {
            "version": STATE_VERSION,
            "config": self.config(),
            "streams": [dict(c) for c in position.cursors],
            "next_stream": position.next_stream,
            "chunk_left": self._ctx.chunk_size(position.cursors[position.next_stream]),
            "iter_stop": position.iter_stop,
            "worker": worker,
        }

    def position_of(self, state: dict[str, Any]) -> Position | GlobalPosition:
        """Check ``state`` against this reader and its epoch plans; return its position.

        Everything a state holds is checked (``wdstream.read.state``): shape and types,
        the config, every cursor against the plan (one sidecar read or so per stream for
        docs-mode shards), the round-robin turns, the iteration's stop and ``chunk_left``.

        Raises:
            StateMismatchError: naming the first bad field (``streams[1].offset``) and value.
        """
        if self.sequence is not None:
            return self.sequence.position_of(state)
        position, chunk_left = parse_state(state, self.config(), self._ctx.cursor_keys)
        for t, cursor in enumerate(position.cursors):
            self._ctx.check_cursor(t, cursor)
        if self._ctx.lockstep:
            check_turns(position, self._ctx.batches_per_stream, self.cfg.chunk_batches)
            check_iter_stop(position, self.epochs)
        want = self._ctx.chunk_size(position.cursors[position.next_stream])
        if chunk_left != want:
            raise mismatch(
                "chunk_left", chunk_left, f"streams[{position.next_stream}] has {want} left"
            )
        return position

    def set_epoch(self, epoch: int) -> None:
        """Put every stream at the start of ``epoch`` (for plain ``DataLoader`` workers)."""
        self.position = self._start(epoch)

    def _start(self, epoch: int) -> Position | GlobalPosition:
        if self.sequence is not None:
            return self.sequence.start(epoch)
        return Position([self._ctx.start_cursor(epoch) for _ in range(self.cfg.streams)])

    def epoch_of(self, position: Position | GlobalPosition) -> int:
        """The epoch ``position`` is in."""
        if isinstance(position, GlobalPosition):
            assert self.sequence is not None
            return self.sequence.epoch_of(position)
        return position.epoch

    def begin(self, position: Position | GlobalPosition) -> int | None:
        """Set and return the stop epoch of the iteration starting at ``position``."""
        if isinstance(position, GlobalPosition):
            assert self.sequence is not None
            return self.sequence.begin(position, self.epochs)
        return position.begin(self.epochs)

    def batches_per_epoch(self, epoch: int | None = None) -> int:
        """Batches this rank yields in ``epoch`` (default: the current one); equal on every rank.

        Raises:
            TypeError: for raw text without ``batches_per_epoch`` (no count before reading).
        """
        if self.mixture is not None:
            assert isinstance(self.position, GlobalPosition)
            return self.mixture.iteration_length(self.position)
        if epoch is None:
            epoch = self.epoch_of(self.position)
        if self.sequence is not None:
            return self.sequence.batches_per_epoch(epoch)
        return self.cfg.streams * self._ctx.batches_per_stream(epoch)

    def __len__(self) -> int:
        return self.batches_per_epoch()

    # ---- iteration ---------------------------------------------------------------------
    def _schedule(self) -> tuple[list[int], int | None]:
        """This process's stream order and the epoch at which this ``iter()`` stops."""
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        S = self.cfg.streams
        if S % nw:
            raise ValueError(f"streams={S} must be a multiple of the number of workers {nw}")
        pos = self.position
        assert isinstance(pos, Position)
        if pos.worker is not None and list(pos.worker) == [wid, nw]:
            first = pos.next_stream  # a worker's own saved state (StatefulDataLoader)
        elif pos.worker is not None and pos.worker[1] != 1:
            raise StateMismatchError(
                f"state was taken in worker {pos.worker[0]} of {pos.worker[1]}, "
                f"restored in worker {wid} of {nw}"
            )
        else:
            first = (pos.next_stream + wid) % S
        order = [(first + j * nw) % S for j in range(S // nw)]
        stop = pos.begin(self.epochs)
        pos.worker = (wid, nw) if info is not None else None
        pos.next_stream = first
        return order, stop

    def iter_chunks(self) -> Iterator[Chunk]:
        """Yield this process's chunks in round-robin order, advancing the position."""
        info = get_worker_info()
        shared = info is not None
        if shared and self._shared is not None:
            # The loader's position, checked by the loader before it started the workers.
            n = int.from_bytes(self._shared[:8].numpy().tobytes(), "little")
            blob = json.loads(self._shared[8 : 8 + n].numpy().tobytes())
            self.position = type(self.position).from_dict(blob)
        ring = self._ring if shared else None
        if isinstance(self.position, GlobalPosition):
            yield from self._global_chunks(
                info.id if info else 0, info.num_workers if info else 1, ring, shared
            )
            return
        order, stop = self._schedule()
        pos, cfg = self.position, self.cfg
        assert isinstance(pos, Position)
        wid = pos.worker[0] if pos.worker is not None else 0
        streams = {s: self._ctx.stream(s, pos.cursors[s]) for s in order}
        try:
            for i in itertools.count():
                s = order[i % len(order)]
                if stop is not None and pos.cursors[s]["epoch"] >= stop:
                    if all(pos.cursors[t]["epoch"] >= stop for t in order):
                        pos.iter_stop = None  # finished: the next iter() continues after it
                        return
                    # Raw text: streams end their epochs at different batch counts. A
                    # finished stream still takes its turn, as an empty chunk, so the turn
                    # order (and a restored worker rotation) stays that of all streams.
                    pos.next_stream = order[(i + 1) % len(order)]
                    yield s, _empty_chunk(ring, wid, i, cfg.seq_len), None, []
                    continue
                n = self._ctx.chunk_size(pos.cursors[s])
                rows = n * cfg.batch_size
                ref: Any
                if ring is not None:
                    slot = i % ring[0].shape[1]
                    tokens = ring[0][wid, slot, :rows]
                    positions = ring[1][wid, slot, :rows] if ring[1] is not None else None
                    ref = (wid, slot, rows)
                else:
                    tokens = _new_buffer((rows, cfg.seq_len + 1), torch.int32, shared)
                    positions = (
                        _new_buffer((rows, cfg.seq_len), torch.int32, shared)
                        if cfg.doc_boundaries
                        else None
                    )
                    ref = tokens
                doc = np.empty((rows, cfg.seq_len + 1), dtype=bool) if cfg.doc_boundaries else None
                cursors = streams[s].fill(tokens.numpy(), doc, n)
                if len(cursors) < n:  # raw text: the epoch ended early (a shorter chunk)
                    rows = len(cursors) * cfg.batch_size
                    tokens = tokens[:rows]
                    positions = positions[:rows] if positions is not None else None
                    doc = doc[:rows] if doc is not None else None
                    ref = (wid, ref[1], rows) if ring is not None else tokens
                if doc is not None:
                    assert positions is not None
                    positions.numpy()[:] = _position_ids(doc)
                pos.cursors[s] = dict(cursors[-1])
                pos.next_stream = order[(i + 1) % len(order)]
                if ring is not None:
                    yield s, ref, None, cursors
                else:
                    yield s, tokens, positions, cursors
        finally:
            for st in streams.values():
                st.close()

    def _buffer(
        self, ring: Any, wid: int, i: int, rows: int, shared: bool
    ) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
        """Where this process's ``i``-th chunk of ``rows`` rows is written, and its reference:
        a slot of the shared ring (workers of a Loader) or fresh tensors."""
        cfg = self.cfg
        if ring is not None:
            slot = i % ring[0].shape[1]
            positions = ring[1][wid, slot, :rows] if ring[1] is not None else None
            return (wid, slot, rows), ring[0][wid, slot, :rows], positions
        tokens = _new_buffer((rows, cfg.seq_len + 1), torch.int32, shared)
        positions = (
            _new_buffer((rows, cfg.seq_len), torch.int32, shared) if cfg.doc_boundaries else None
        )
        return tokens, tokens, positions

    def _global_chunks(self, wid: int, nw: int, ring: Any, shared: bool) -> Iterator[Chunk]:
        """This process's chunks of the global sequence (chunk ``j`` by worker ``j % nw``)."""
        assert self.sequence is not None and isinstance(self.position, GlobalPosition)
        self.sequence.begin(self.position, self.epochs)

        def buffer(i: int, rows: int) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
            return self._buffer(ring, wid, i, rows, shared)

        chunks = self.sequence.chunks(self.position, wid, nw, buffer, _position_ids)
        try:
            for ref, tokens, positions, cursors in chunks:
                if ring is not None:
                    yield -1, ref, None, cursors
                else:
                    yield -1, tokens, positions, cursors
        finally:
            self.sequence.release()
        self.position.iter_stop = None  # finished: the next iter() continues after it

    def __iter__(self) -> Iterator[Any]:
        if self._yield_chunks:
            yield from self.iter_chunks()
            return
        for _, tokens, positions, cursors in self.iter_chunks():
            batches = chunk_to_batches(tokens, positions, self.cfg.batch_size, labels=self.labels)
            for cursor, batch in zip(cursors, batches, strict=False):
                if "source" in cursor:
                    batch["source"] = torch.from_numpy(cursor["source"])
                yield batch


def _check_sizes(**sizes: int) -> None:
    for name, v in sizes.items():
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v!r}")


def _open_source(
    source: str | Sequence[str] | ShardSource | TextSource,
    tokenizer: str | Tokenizer | None,
    batches_per_epoch: int | None,
    text_key: str,
    on_error: str,
    eos: bool,
    **store_options: Any,
) -> ShardSource | TextSource:
    """Packed token shards, or raw text when a tokenizer is given (or a TextSource)."""
    if isinstance(source, TextSource):
        return source
    if tokenizer is not None:
        if isinstance(source, ShardSource):
            raise TypeError("tokenizer= reads raw text files, not a ShardSource of token shards")
        return TextSource(
            source, tokenizer, text_key=text_key, on_error=on_error, eos=eos, **store_options
        )
    if batches_per_epoch is not None:
        raise ValueError(
            "batches_per_epoch is for raw-text sources (tokenizer=...); packed shards get "
            "equal per-rank counts from their index"
        )
    return source if isinstance(source, ShardSource) else ShardSource(source, **store_options)


def _empty_chunk(ring: Any, wid: int, i: int, seq_len: int) -> Any:
    """Tokens of a chunk of no batches (a ring reference when workers use the ring)."""
    if ring is not None:
        return (wid, i % ring[0].shape[1], 0)
    return torch.empty((0, seq_len + 1), dtype=torch.int32)


def resolve_order(order: str | None, raw_text: bool, streams: int | None) -> str:
    """The batch order: as given, else global for packed data unless ``streams`` was given.

    Raises:
        ValueError: for an unknown order, the global order on raw text, or ``streams`` with
            the global order (it has no per-rank streams).
    """
    if order is None:
        order = "streams" if raw_text or streams is not None else "global"
    if order not in ("streams", "global"):
        raise ValueError(f"order must be 'streams' or 'global', got {order!r}")
    if order == "global" and raw_text:
        raise ValueError(_GLOBAL_NEEDS_INDEX)
    if order == "global" and streams is not None:
        raise ValueError(
            f"streams={streams} is a setting of order='streams'; the global order's batches "
            "do not depend on streams or workers"
        )
    return order


_GLOBAL_NEEDS_INDEX = (
    "order='global' (and with it batch_at, explain and resuming on another world size) needs "
    "a packed dataset: its index gives every sample's place. Raw text is read in per-rank "
    "streams (order='streams'); pack it with `wdstream pack` for the global order"
)


def _order_config(cfg: ReaderConfig) -> OrderConfig:
    return OrderConfig(
        seq_len=cfg.seq_len, global_batch=cfg.world_size * cfg.batch_size, shuffle=cfg.shuffle,
        seed=cfg.seed, shuffle_window=cfg.shuffle_window, shuffle_lanes=cfg.shuffle_lanes,
    )  # fmt: skip


def _global_reader(source: ShardSource | TextSource, cfg: ReaderConfig) -> GlobalReader:
    """The global batch sequence of a packed dataset, for ``order="global"``."""
    if not isinstance(source, ShardSource):
        raise ValueError(_GLOBAL_NEEDS_INDEX)
    return GlobalReader(
        source, _order_config(cfg), cfg.rank, cfg.batch_size, cfg.chunk_batches,
        cfg.doc_boundaries,
    )  # fmt: skip


def _check_mixture_options(
    tokenizer: Any, order: str | None, streams: int | None, epochs: int | None
) -> None:
    """A mixture reads packed sources in the global order and ends by its stop rule.

    Raises:
        ValueError: naming the option that does not apply to a mixture.
    """
    if tokenizer is not None:
        raise ValueError("a mixture reads packed datasets; pack raw text first (tokenizer=)")
    if order not in (None, "global") or streams is not None:
        raise ValueError("a mixture is read in the global order; order='streams' and "
                         "streams= do not apply")  # fmt: skip
    if epochs is not None:
        raise ValueError(
            "epochs= counts epochs of one dataset; a mixture's sources each walk their own "
            "epochs: pass stop='first_exhausted' or stop='all_exhausted' (default None: "
            "forever) instead"
        )


def _mixture_labels(
    names: list[str], sources: list[ShardSource], seq_len: int, mask_doc_ends: bool | None
) -> RowLabels | None:
    """The one target rule of a mixture's rows (every source's must agree).

    Raises:
        ValueError: naming two sources whose packing needs different target rules.
    """
    rules = [row_labels(s.index, seq_len, mask_doc_ends) for s in sources]
    for name, rule in zip(names, rules, strict=True):
        if rule != rules[0]:
            raise ValueError(
                f"sources {names[0]!r} and {name!r} need different target rules ({rules[0]} "
                f"vs {rule}); pack them in the same mode, or pass mask_doc_ends"
            )
    return rules[0]
