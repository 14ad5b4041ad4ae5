"""``TokenDataset``: the resumable ``IterableDataset`` of token batches.

It reads a :class:`~wdstream.read.order.base.BatchSequence` (per-rank streams, the global
order or a mixture, built by :func:`wdstream.read.assemble.assemble`) and slices its chunks
of ``K`` batches into batches. Used directly (``DataLoader(ds, batch_size=None)`` or
torchdata's ``StatefulDataLoader``) it yields one batch per item (``K = 1``) and owns its
position. :class:`wdstream.Loader` uses it with ``K > 1``: it passes its own position to
:meth:`TokenDataset.iter_chunks` and, with workers, a
:class:`~wdstream.read.torch.handoff.WorkerHandoff`, and slices the chunks itself.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from wdstream.format.loss import ID_BITS
from wdstream.read.assemble import (
    assemble,
    check_mixture_options,
    check_sizes,
    is_text,
    resolve_order,
    resolve_rank,
)
from wdstream.read.batches.quarantine import QuarantineLog
from wdstream.read.batches.rows import (
    IGNORE_INDEX,
    RowLabels,
    doc_ids,
    position_ids,
)
from wdstream.read.mixture.spec import is_mixture
from wdstream.read.options import ReadOptions
from wdstream.read.order.base import SequencePosition
from wdstream.read.order.global_order import Origin
from wdstream.read.order.steps import masked_rows
from wdstream.read.order.streams_context import ReaderConfig
from wdstream.read.torch.casts import batch_casts, long_copy
from wdstream.read.torch.handoff import FreshBuffers, WorkerHandoff
from wdstream.read.torch.host_buffers import HostBuffers, ReusedChunks

if TYPE_CHECKING:
    from wdstream.read.sources.packed import ShardSource
    from wdstream.read.sources.text import TextSource

__all__ = ["Chunk", "TokenDataset", "chunk_to_batches", "resolve_order", "resolve_rank"]

# (stream, tokens int32 [n*B, T+1], position_ids int32 [n*B, T] or None, cursors after each batch)
# (with a worker hand-off, tokens is the ring slot ``(worker, slot, rows)`` and positions None;
# a mixture's cursors also carry each batch's ``source`` indices, int64 numpy [B])
Chunk = tuple[int, Any, torch.Tensor | None, list[dict[str, Any]]]
_HANDOVER_S = 0.0005  # a worker's pause after its first chunk (``_after_first``)


class TokenDataset(IterableDataset):
    """Shuffled, sharded, exactly resumable batches of ``[batch_size, seq_len]`` tokens.

    Args:
        source: dataset root with ``index.json``, brace pattern of shard URLs, or a list;
            or a mixture: ``{name: dataset}`` (with ``weights``) or the path of a ``.json``
            / ``.toml`` mixture spec (``docs/MIXTURES.md``).
        seq_len: training sequence length T (rows hold T + 1 tokens).
        batch_size: rows per batch B.
        options: the reader's options as one object; or instead
        keywords: any field of :class:`~wdstream.read.options.ReadOptions` (shuffle, seed,
            rank, world_size, order, epochs, tokenizer, weights, ...), documented there; any
            other keyword is passed to the storage backend.
    """

    def __init__(
        self,
        source: str | Sequence[str] | Mapping[str, str] | ShardSource | TextSource,
        seq_len: int,
        batch_size: int,
        options: ReadOptions | None = None,
        **keywords: Any,
    ) -> None:
        if options is not None and keywords:
            raise TypeError("pass the reader's options as options= or as keywords, not both")
        opts = options if options is not None else ReadOptions.of(keywords)
        order, streams, epochs = opts.order, opts.streams, opts.epochs
        if is_mixture(source):
            check_mixture_options(opts.tokenizer, order, streams, epochs)
            order = "global"
        order = resolve_order(order, is_text(source, opts.tokenizer), streams)
        streams = 1 if streams is None else streams
        check_sizes(seq_len=seq_len, batch_size=batch_size, streams=streams,
                    shuffle_window=opts.shuffle_window, shuffle_lanes=opts.shuffle_lanes,
                    chunk_batches=opts.chunk_batches)  # fmt: skip
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be None or >= 1, got {epochs!r}")
        rank, world_size = resolve_rank(opts.rank, opts.world_size)
        self.cfg = ReaderConfig(
            seq_len=seq_len, batch_size=batch_size, shuffle=opts.shuffle, seed=opts.seed,
            rank=rank, world_size=world_size, streams=streams,
            shuffle_window=opts.shuffle_window, shuffle_lanes=opts.shuffle_lanes,
            chunk_batches=opts.chunk_batches, doc_boundaries=opts.return_doc_boundaries,
        )  # fmt: skip
        self.epochs = epochs
        parts = assemble(source, self.cfg, order, opts)
        self.sequence = parts.sequence
        self.labels = parts.labels
        self.source = parts.source  # one dataset (None for a mixture: one per source)
        self.mixture = parts.mixture
        self.packed = parts.packed  # the source again when it is one packed dataset
        self.random_access = order == "global"
        # Where this dataset is when iterated on its own: advanced by iteration, replaced by
        # ``load_state_dict``. (A Loader keeps its own and passes it to ``iter_chunks``.)
        self.position: SequencePosition = self.sequence.start(0)
        # Set by ``Loader.use``: yield chunks instead of batches, and with workers the
        # position and chunk ring they share with it.
        self.yields_chunks = False
        self.handoff: WorkerHandoff | None = None
        # Masked rows of batches yielded one by one (a Loader keeps its own record).
        self.quarantine = QuarantineLog(opts.max_quarantined)

    def use(self, handoff: WorkerHandoff | None) -> None:
        """Serve a ``Loader``: yield chunks, and with workers use ``handoff``."""
        self.yields_chunks, self.handoff = True, handoff

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Small JSON-serialisable position (see ``docs/READER.md``)."""
        return self.sequence.state_of(self.position)

    def batch_at(
        self, step: int, origin: Origin | None = None, position: Any = None
    ) -> dict[str, torch.Tensor]:
        """This rank's batch at global step ``step``: exactly what iteration yields there.

        Costs the same for any step (no replay). Steps are counted as this reader counts
        them (from ``position``'s origin, default this reader's, or ``origin``); a
        mixture's batch is read under ``position``'s schedule and carries ``source``.

        Raises:
            TypeError: for the per-rank stream order (``order="streams"``), which has no
                random access.
        """
        if not self.random_access:
            raise TypeError("batch_at needs order='global' on a packed dataset")
        if position is None:
            position = self.position
        if origin is not None:
            position = position.copy()
            position.origin = origin
        c = self.cfg
        tokens = torch.empty((c.batch_size, c.seq_len + 1), dtype=torch.int32)
        doc = np.empty(tuple(tokens.shape), dtype=bool) if c.doc_boundaries else None
        source = self.sequence.fill_step(step, position, tokens.numpy(), doc)
        positions = torch.from_numpy(position_ids(doc)) if doc is not None else None
        batch = next(chunk_to_batches(tokens, positions, c.batch_size, labels=self.labels,
                                      sources=None if source is None else [source]))  # fmt: skip
        if source is not None:
            batch["source"] = torch.from_numpy(source)
        return batch

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position taken by :meth:`state_dict` (or ``Loader.state_dict``).

        Raises:
            StateMismatchError: if the state is from another dataset or configuration, or
                is malformed or inconsistent (the message names the field and its value).
        """
        self.position = self.sequence.position_of(state)

    def state_of(self, position: SequencePosition) -> dict[str, Any]:
        """The state of ``position`` of this reader."""
        return self.sequence.state_of(position)

    def position_of(self, state: dict[str, Any]) -> SequencePosition:
        """Check ``state`` against this reader; return its position.

        Raises:
            StateMismatchError: naming the first bad field (``streams[1].offset``) and value.
        """
        return self.sequence.position_of(state)

    def set_epoch(self, epoch: int) -> None:
        """Put every stream at the start of ``epoch`` (for plain ``DataLoader`` workers)."""
        self.position = self.sequence.start(epoch)

    def epoch_of(self, position: SequencePosition) -> int:
        """The epoch ``position`` is in."""
        return self.sequence.epoch_of(position)

    def begin(self, position: SequencePosition) -> int | None:
        """Set and return the stop of the iteration starting at ``position``."""
        return self.sequence.begin(position, self.epochs)

    def batches_per_epoch(self, epoch: int | None = None) -> int:
        """Batches this rank yields in ``epoch`` (default: the current one, or a mixture's
        current iteration); equal on every rank.

        Raises:
            TypeError: for raw text without ``batches_per_epoch`` (no count before reading),
                or a mixture without a stop rule.
        """
        if epoch is None:
            return self.sequence.length(self.position)
        return self.sequence.batches_per_epoch(epoch)

    def __len__(self) -> int:
        return self.batches_per_epoch()

    # ---- iteration ---------------------------------------------------------------------
    def iter_chunks(self, position: SequencePosition | None = None) -> Iterator[Chunk]:
        """Yield this process's chunks, advancing ``position`` (default: this dataset's;
        in a worker of a Loader, the position the loader published).

        In a Loader's worker the reads also stop once the training process left this
        iteration (:meth:`WorkerHandoff.left`): the chunk being made then ends the worker's
        iteration, no error raised and nothing handed out (nobody takes it: torch's end, or
        the next iteration's reset, which drops what the workers sent before it)."""
        info = get_worker_info()
        worker = (info.id, info.num_workers) if info is not None else None
        left: Callable[[], bool] | None = None
        if info is not None and self.handoff is not None:
            left = functools.partial(self.handoff.left, self.handoff.iteration())
            position = self.sequence.position_from_dict(self.handoff.position())
            self.position = position
            self.sequence.stop_reads_when(left)
        elif position is None:
            position = self.position
        handoff = self.handoff if info is not None else None
        c = self.cfg
        buffers: Any
        if handoff is not None and info is not None:
            buffers = handoff.buffers(info.id)
        elif info is not None:  # a torch worker's chunks go to shared memory
            buffers = FreshBuffers(c.seq_len, c.doc_boundaries, shared=True)
        else:  # sliced in this process: reused once their batches are cut
            buffers = ReusedChunks(c.chunk_batches * c.batch_size, c.seq_len, c.doc_boundaries)
        chunks = self.sequence.chunks(position, worker, buffers, self.epochs)
        try:
            for s, i, tokens, positions, cursors in chunks:
                if handoff is not None:
                    yield s, buffers.reference(i, tokens), None, cursors
                else:
                    yield s, tokens, positions, cursors
        except CancelledError:
            if left is None or not left():
                raise
            # The training process left: the chunk's reads stopped (its windows are dropped).

    def first_chunk(self, position: SequencePosition) -> Chunk | None:
        """The first chunk (one step) of an iteration from ``position``, made in this
        process with no thread left behind, ``position`` advanced past it; None where the
        iteration has no step (:meth:`BatchSequence.first_chunk`: global order only)."""
        buffers = FreshBuffers(self.cfg.seq_len, self.cfg.doc_boundaries, shared=False)
        made = self.sequence.first_chunk(position, buffers, self.epochs)
        if made is None:
            return None
        s, _, tokens, positions, cursors = made
        return s, tokens, positions, cursors

    def __iter__(self) -> Iterator[Any]:
        if not self.yields_chunks:
            return self._batches()
        chunks = self.iter_chunks()
        if self.handoff is not None and get_worker_info() is not None:
            return _started(chunks)
        return chunks

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """One batch per item (``DataLoader(ds, batch_size=None)``, ``StatefulDataLoader``)."""
        for _, tokens, positions, cursors in self.iter_chunks():
            batches = chunk_to_batches(tokens, positions, self.cfg.batch_size, labels=self.labels,
                                       sources=[c.get("source") for c in cursors])  # fmt: skip
            # The position counted the chunk's masked rows as it was filled.
            before = self.position.quarantined - sum(masked_rows(c) for c in cursors)
            for cursor, batch in zip(cursors, batches, strict=False):
                self.quarantine.admit(cursor, before, self.cfg.batch_size)
                before += masked_rows(cursor)
                if "source" in cursor:
                    batch["source"] = torch.from_numpy(cursor["source"])
                yield batch


def _started(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """``chunks`` with its first chunk made now, in a Loader's torch worker.

    torch calls ``iter(dataset)`` in a worker as it starts, then waits for the loader's
    first request, which comes only once every worker has been started (forking each one
    of a torch-sized training process costs 10-25 ms). A worker making its first chunk
    now makes it while the next worker is forked, instead of after the request (the
    first batch used to wait for worker 0's whole first chunk after the last fork). What
    that chunk raises is raised where it would have been: at its request.
    """
    try:
        first = next(chunks)
    except StopIteration:
        return iter(())
    except Exception as exc:  # noqa: BLE001 - raised again, unchanged, at the request
        return _raising(exc)
    return itertools.chain((first,), _after_first(chunks))


def _after_first(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """The chunks after the first, made once the first is on its way: torch's worker hands
    a chunk to its queue's feeder thread, which sends it once it holds the GIL, and the next
    chunk's fill held it for its whole length (1-3 ms, at the switch interval of 5 ms)
    while the loader waited for the first batch. A short sleep lets the message go first."""
    time.sleep(_HANDOVER_S)
    yield from chunks


def _raising(exc: Exception) -> Iterator[Chunk]:
    """An iterator whose first item raises ``exc``."""
    yield from ()
    raise exc


def chunk_to_batches(
    tokens: torch.Tensor,
    positions: torch.Tensor | None,
    batch_size: int,
    pin: bool = False,
    labels: RowLabels | None = None,
    buffers: HostBuffers | None = None,
    sources: Sequence[np.ndarray | None] | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Slice a chunk into batches: int64 contiguous ``input_ids``/``labels`` [B, T].

    ``position_ids`` (int64 [B, T]), ``cu_seqlens`` (int32, flat over the batch: the start
    of every piece plus ``B * T`` at the end) and ``doc_ids`` (int32 [B, T], -1 on padding)
    are added when ``positions`` is given. ``labels``: the dataset's target rule
    (:mod:`wdstream.read.batches.rows`: -100 on best-fit padding and, if chosen, document ends).
    ``buffers``: reused arrays for the int64 copies (the ``Loader``'s training process; the
    batches are then ``from_numpy`` tensors, which torch workers could not send).
    ``sources``: per batch, a mixture's row source indices (which rows carry a stored mask).
    """
    n = tokens.shape[0] // batch_size * batch_size
    # Ids carrying a loss mask lose it here, once per chunk (wdstream.format.loss): on the
    # CPU inside the two int64 copies (RowLabels.split_chunk).
    no_loss = stored = None
    if labels is not None:
        tokens, no_loss, stored = labels.split_chunk(tokens[:n])
    ids, targets = tokens[:n, :-1], tokens[:n, 1:]
    casts = batch_casts(ids, targets, stored, batch_size, pin, buffers)
    # The padding and document-end rules, where any row follows them (a stored mask decides
    # its rows alone) or document ids need the padding.
    rules = labels is not None and (labels.rules_apply() or positions is not None)
    if stored is not None and rules:  # they read the ids without the bit
        tokens = torch.from_numpy(stored & ID_BITS)
    for j in range(n // batch_size):
        part = slice(j * batch_size, (j + 1) * batch_size)
        rows = tokens[part]
        input_ids, target_ids = next(casts)
        batch = {"input_ids": input_ids, "labels": target_ids}
        padding = labels.padding(rows) if labels is not None and rules else None
        masked = None
        if labels is not None and (rules or no_loss is not None):
            src = sources[j] if sources is not None and j < len(sources) else None
            masked = labels.masked(rows, padding, None if no_loss is None else no_loss[part], src)
        if masked is not None:
            batch["labels"].masked_fill_(masked, IGNORE_INDEX)
        if positions is not None:
            pos = long_copy(positions[part], pin, buffers)
            flat = pos.reshape(-1)
            starts = torch.nonzero(flat == 0).reshape(-1)
            batch["position_ids"] = pos
            batch["cu_seqlens"] = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(
                torch.int32
            )
            batch["doc_ids"] = doc_ids(pos, padding)
        yield batch
