"""``Loader``: batches for the training loop, with an exact resumable cursor.

The loader runs :class:`~wdstream.read.torch.dataset.TokenDataset` in chunk mode (``K`` batches per
worker message, one int32 tensor), slices each chunk into ``[B, T]`` int64 ``input_ids`` /
``labels`` in the main process, and records a batch's stream cursor only when the batch is
handed to the caller, so batches prefetched by workers but not consumed are never lost::

    loader = Loader("data/", seq_len=2048, batch_size=8, num_workers=2)
    for step, batch in enumerate(loader):
        ...
        if step % 1000 == 0:
            save(loader.state_dict())          # a few hundred bytes of JSON

    loader = Loader("data/", ...same arguments...)
    loader.load_state_dict(saved)              # continues with the very next batch

Each ``iter()`` runs ``epochs`` epochs from where the previous one stopped (forever when
``epochs`` is None): a restored mid-epoch state finishes that epoch first.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from wdstream.errors import StateMismatchError
from wdstream.read.assemble import mesh_coordinates
from wdstream.read.batches.buckets import BucketedBatches
from wdstream.read.batches.quarantine import QuarantineEvent, QuarantineLog
from wdstream.read.option_checks import check_read_options
from wdstream.read.options import ReadOptions
from wdstream.read.order.base import SequencePosition
from wdstream.read.torch.dataset import Chunk, TokenDataset, chunk_to_batches, resolve_order
from wdstream.read.torch.device import pinned, to_device
from wdstream.read.torch.host_buffers import HostBuffers
from wdstream.read.torch.workers import TorchWorkers

if TYPE_CHECKING:
    from wdstream.tokenizers.base import Tokenizer

__all__ = ["Loader"]


def _usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class Loader:
    """Shuffled ``[batch_size, seq_len]`` token batches, equal per rank, exactly resumable.

    Args:
        source: dataset root with ``index.json``, brace pattern of shard URLs, or a list;
            or a mixture of packed datasets: ``{name: dataset}`` with ``weights``, or the
            path of a ``.json`` / ``.toml`` mixture spec (``docs/MIXTURES.md``). A mixture's
            batches carry ``source`` (int64 [B], indices into :attr:`sources`).
        seq_len: training sequence length T (may differ from the packed one).
        batch_size: rows per batch B.
        shuffle: shuffle shards per epoch and samples in windows.
        seed: the one seed of all randomness.
        num_workers: torch worker processes (0: everything in this process); default: the
            CPU cores this process may use less one (the training loop's), at most 4.
        rank: the data-parallel rank: default ``torch.distributed`` rank, else ``RANK``,
            else 0. With tensor/pipeline parallelism give ``mesh`` (or the dp rank here).
        world_size: the data-parallel size: default ``torch.distributed`` world size,
            else ``WORLD_SIZE``, else 1.
        mesh: the data-parallel dimension of a ``DeviceMesh`` (``device_mesh["dp"]``):
            rank and world size from it, so every rank of a tensor-parallel group gets the
            same batches (instead of ``rank``/``world_size``).
        epochs: epochs per ``iter()``; None (default) repeats forever with a fresh shuffle
            each epoch: pretraining counts steps, and a mixture is endless too. 1: one pass.
        streams: ``order="streams"``: independent streams per rank (default
            ``max(1, num_workers)``); a multiple of ``num_workers``. That order depends on
            ``streams``, not on the workers. Giving it with ``order=None`` selects that order.
        chunk_batches: batches per worker message (K).
        shuffle_window: samples per shuffle window.
        shuffle_lanes: lanes (distant places of the data) a window is drawn from.
        pin_memory: pin chunks in page-locked memory.
        prefetch_factor: chunks each worker keeps ready (torch ``DataLoader`` option).
        persistent_workers: keep workers alive between ``iter()`` calls.
        worker_timeout: seconds to wait for the workers' next chunk (0: forever, as torch's
            ``DataLoader``): past it a :class:`~wdstream.errors.WorkerTimeoutError` names
            each worker's state (a stopped or hung one) and the workers are ended.
        device: a CUDA device: chunks are copied there one ahead, on a side stream.
        return_doc_boundaries: add ``position_ids`` [B, T], ``cu_seqlens`` (int32) and
            ``doc_ids`` (int32 [B, T], -1 on padding).
        mask_doc_ends: -100 as the target after each document's last token; None (default):
            on for ``--mode bestfit`` datasets, off otherwise. Best-fit padding targets are
            always -100 (``wdstream.read.batches.rows``).
        drop_last: must be True: every rank yields the same number of full batches and the
            remainder is left out (see ``docs/READER.md``).
        multiprocessing_context: torch ``DataLoader`` option (e.g. ``"spawn"``).
        tokenizer: read raw text instead of packed shards and tokenize it on the fly:
            ``source`` is JSON Lines files (plain, ``.gz``, ``.zst``), ``.txt`` files or tar
            shards of ``KEY.txt`` / ``KEY.json`` samples (see ``docs/READER.md``, "Raw text").
        text_key: raw text: JSON field holding the text (dotted for nested fields).
        batches_per_epoch: raw text: batches every rank yields per epoch (a multiple of
            ``streams``); the only way to equal counts across DDP ranks without an index.
        on_error: raw text: ``"raise"`` on a bad record (naming file and line) or ``"skip"``.
        eos: raw text: append ``<|endoftext|>`` to every document.
        tokenize_threads: raw text: threads of one batched tokenizer call (default: CPU
            cores divided by the worker count).
        order: ``"global"`` (one global batch sequence: the same batches on any number of
            ranks and workers with the same global batch ``world_size * batch_size``,
            elastic resume, :meth:`batch_at`) or ``"streams"`` (per-rank streams, the only
            order for raw text). None (default): global for packed datasets, streams for raw
            text or when ``streams`` is given. See ``docs/READER.md``.
        weights: a mixture's ``{name: weight}`` (exact proportions after every row), or a
            schedule ``[(step, {name: weight}), ...]`` (exact from each boundary on).
        stop: a mixture's stop rule: None (default: forever), ``"first_exhausted"`` (an
            iteration ends before the first source starts a new epoch) or
            ``"all_exhausted"`` (before the last one does).
        max_tokens: ``--mode docs`` datasets: length-bucketed batches of whole documents
            padded to the batch's longest, at most this many input tokens each (padding
            included; a document longer than ``seq_len`` inputs is split into rows of
            ``seq_len``, never cropped), with ``attention_mask`` and ``position_ids``
            (continuing across a split document's rows; see :meth:`epoch_stats`); ``batch_size``,
            workers and the global order do not apply (read in this process). Same batch
            count on every rank, exact resume, also on another world size
            (:mod:`wdstream.read.batches.buckets`).
        on_corrupt: ``"raise"`` (default) or ``"mask"``: every row holding a token of a
            sample that cannot be read is delivered in its place masked whole (``labels``
            all -100), the rest as a clean dataset gives them; events in
            :attr:`quarantined`, logged once, counted in the state (``ReadOptions``).
        max_quarantined: with ``"mask"``: the most masked rows (int) or fraction of rows
            (float) before a ``QuarantineLimitError`` (``ReadOptions``).
        store_options: passed to the storage backend.
    """

    def __init__(
        self,
        source: str | Sequence[str] | Mapping[str, str],
        seq_len: int = 2048,
        batch_size: int = 8,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        epochs: int | None = None,
        *,
        streams: int | None = None,
        chunk_batches: int = 16,
        shuffle_window: int = 1024,
        shuffle_lanes: int = 8,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        worker_timeout: float = 0,
        device: str | torch.device | None = None,
        return_doc_boundaries: bool = False,
        drop_last: bool = True,
        multiprocessing_context: Any = None,
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
        max_tokens: int | None = None,
        on_corrupt: str = "raise",
        max_quarantined: int | float | None = None,
        mesh: Any = None,
        **store_options: Any,
    ) -> None:
        check_read_options(seq_len=seq_len, batch_size=batch_size, seed=seed, epochs=epochs,
                           num_workers=num_workers, streams=streams, chunk_batches=chunk_batches,
                           shuffle_window=shuffle_window, shuffle_lanes=shuffle_lanes,
                           max_tokens=max_tokens)  # fmt: skip
        if num_workers is None:
            num_workers = min(4, max(0, _usable_cores() - 1))
        order = resolve_order(order, tokenizer is not None, streams)
        if not drop_last:
            raise ValueError(
                "drop_last=False is not supported: ranks must yield equal batch counts"
            )
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if order == "streams":
            streams = max(1, num_workers) if streams is None else streams
        if streams is not None and num_workers and streams % num_workers:
            raise ValueError(f"streams={streams} must be a multiple of num_workers={num_workers}")
        if tokenizer is not None and tokenize_threads is None:
            tokenize_threads = max(1, (os.cpu_count() or 1) // max(1, num_workers))
        rank, world_size = mesh_coordinates(mesh, rank, world_size)
        options = ReadOptions(
            shuffle=shuffle, seed=seed, rank=rank, world_size=world_size, streams=streams,
            epochs=epochs, shuffle_window=shuffle_window, shuffle_lanes=shuffle_lanes,
            chunk_batches=chunk_batches, return_doc_boundaries=return_doc_boundaries,
            mask_doc_ends=mask_doc_ends, tokenizer=tokenizer, text_key=text_key,
            batches_per_epoch=batches_per_epoch, on_error=on_error, eos=eos,
            tokenize_threads=tokenize_threads, order=order, weights=weights, stop=stop,
            on_corrupt=on_corrupt, max_quarantined=max_quarantined, store_options=store_options,
        )  # fmt: skip
        # max_tokens batches are cut by BucketedBatches: batch_size does not apply, so the
        # global order's one-batch minimum must not refuse a small dataset (one row a rank).
        rows = batch_size if max_tokens is None else 1
        self.dataset = TokenDataset(source, seq_len, rows, options)
        self.epochs = epochs
        self.num_workers = num_workers
        self.device = torch.device(device) if device is not None else None
        self.pin_memory = pin_memory or (self.device is not None and self.device.type == "cuda")
        self._workers = TorchWorkers(self.dataset, num_workers, {
            "prefetch_factor": prefetch_factor,
            "persistent_workers": persistent_workers,
            "multiprocessing_context": multiprocessing_context,
            "timeout": worker_timeout,
        })  # fmt: skip
        self._iterating = 0  # iterators of this loader not yet finished or closed
        self._iterators: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()
        # The position after the last batch handed to the caller: the dataset runs ahead of
        # it by the chunks prefetched or being sliced, so this is the loader's own.
        self._handed: SequencePosition = self.dataset.position.copy()
        self._quarantine = QuarantineLog(max_quarantined)
        # The int64 arrays batches are cut from, reused once the caller drops them.
        self._host = HostBuffers()
        if max_tokens is not None and on_corrupt != "raise":
            raise ValueError("on_corrupt='mask' needs the global order; max_tokens batches "
                             "have no fixed place to keep a masked row in")  # fmt: skip
        self._buckets = None if max_tokens is None else self._bucketed(seq_len, max_tokens, seed)

    def _bucketed(self, seq_len: int, max_tokens: int, seed: int) -> BucketedBatches:
        """The token-budget batches of ``max_tokens`` (one packed docs-mode dataset only)."""
        source = self.dataset.packed
        if source is None:
            raise ValueError("max_tokens reads one packed dataset (--mode docs)")
        return BucketedBatches(
            source, seq_len, max_tokens, seed, self.rank, self.world_size, self.epochs
        )

    @property
    def rank(self) -> int:
        return self.dataset.cfg.rank

    @property
    def world_size(self) -> int:
        return self.dataset.cfg.world_size

    @property
    def quarantined(self) -> list[QuarantineEvent]:
        """Masked rows' events (one per row and bad sample) this loader handed out."""
        return self._quarantine.events

    @property
    def sources(self) -> list[str]:
        """A mixture's source names, in order: ``batch["source"]`` indexes this list.

        Raises:
            TypeError: for one dataset (its batches have no ``source``).
        """
        if self.dataset.mixture is None:
            raise TypeError("sources: this Loader reads one dataset, not a mixture")
        return list(self.dataset.mixture.names)

    def progress(self) -> dict[str, dict[str, Any]]:
        """A mixture's consumption so far, per source name: ``epoch``, ``rows`` and
        ``tokens`` (``seq_len`` per row) handed out, ``epoch_rows`` done of ``rows_per_epoch``,
        and its ``weight`` now (for logging).

        Raises:
            TypeError: for one dataset.
        """
        if self.dataset.mixture is None:
            raise TypeError("progress: this Loader reads one dataset, not a mixture")
        return self.dataset.mixture.progress(self._handed)  # type: ignore[arg-type]

    def epoch_stats(self, epoch: int | None = None) -> dict[str, int]:
        """``max_tokens`` batches: where every row of ``epoch`` goes (documents, the ones
        split into several rows, rows and tokens planned, served and left out; see
        :meth:`wdstream.read.batches.buckets.BucketedBatches.epoch_stats`).

        Raises:
            TypeError: without ``max_tokens`` (other orders account for rows in the docs).
        """
        if self._buckets is None:
            raise TypeError("epoch_stats: only for max_tokens (length-bucketed) batches")
        return self._buckets.epoch_stats(epoch)

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (the same on every rank); for a
        mixture with a stop rule, in the current iteration.

        Raises:
            TypeError: for raw text without ``batches_per_epoch`` (no count before reading),
                or a mixture without a stop rule (it runs forever).
        """
        if self._buckets is not None:
            return len(self._buckets)
        return self.dataset.sequence.length(self._handed)

    def state_dict(self) -> dict[str, Any]:
        """Position after the last batch handed out: small and JSON-serialisable."""
        if self._buckets is not None:
            return self._buckets.state_dict()
        return self.dataset.state_of(self._handed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batch at which ``state`` was taken.

        Raises:
            StateMismatchError: for a state of another dataset, seed, world size, rank,
                stream count or batch geometry, or a malformed or inconsistent one (the
                message names the field and its value); also for one torch worker's share
                of a ``TokenDataset`` state, which lacks the other workers' streams.
        """
        if self._buckets is not None:
            self._buckets.load_state_dict(state)
            return
        position = self.dataset.position_of(state)
        if position.worker is not None and position.worker[1] > 1:
            raise StateMismatchError(
                f"worker: {list(position.worker)} is one worker's share of a TokenDataset "
                "state (StatefulDataLoader); a Loader resumes from Loader.state_dict()"
            )
        position.worker = None
        self._handed = position

    def batch_at(self, step: int) -> dict[str, torch.Tensor]:
        """This rank's batch at global *data* step ``step``, exactly as iteration yields it, in
        the same time for any step (``order="global"`` only; see ``TokenDataset.batch_at``).
        After :meth:`skip_steps` data steps run ahead of training steps: map a training
        step with :meth:`data_step` first."""
        if self._buckets is not None:
            raise TypeError("batch_at: max_tokens batches are counted per epoch, not globally")
        batch = self.dataset.batch_at(step, None, self._handed)
        return batch if self.device is None else {k: v.to(self.device) for k, v in batch.items()}

    def skip_steps(self, n: int) -> None:
        """Skip ``n`` data steps: the next batch is data step ``k + n`` where ``k`` would have
        been next (e.g. past data that made the loss spike, after a rollback).

        The skip is recorded in the state, so training steps keep mapping to data steps
        (:meth:`data_step`) across save, restore and a change of world size or global batch.
        Call it between iterations (the next ``iter()`` starts at the new position): under
        a live iterator, which would go on from the old one, it is refused.

        Raises:
            TypeError: ``n`` is no int; for ``order="streams"`` or ``max_tokens`` batches.
            ValueError: ``n < 1``.
            RuntimeError: an iterator of this loader is still running (finish or close it).
        """
        if self._iterating:
            raise RuntimeError("skip_steps: an iterator of this loader is still running; finish "
                               "or close it (it.close(), or leave its for loop) first")  # fmt: skip
        self._check_count("skip_steps", "n", n, 1)
        self._handed = self.dataset.sequence.skip_steps(self._handed, n)

    def data_step(self, training_step: int) -> int:
        """The data step (the step ``batch_at`` takes) that training step ``training_step``
        (batches handed out, counted from 0) reads, under the skips recorded so far.

        Raises:
            TypeError: for ``order="streams"`` or ``max_tokens`` batches.
            ValueError: ``training_step < 0``.
        """
        self._check_count("data_step", "training_step", training_step, 0)
        return self.dataset.sequence.data_step(self._handed, training_step)

    def _check_count(self, method: str, name: str, value: Any, lo: int) -> None:
        """Refuse a ``value`` that is no int (nor a bool: TypeError) or below ``lo``
        (ValueError), and ``max_tokens`` batches (TypeError): they count no global steps."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{method}: {name} must be an int, got {value!r:.60}")
        if value < lo:
            raise ValueError(f"{method}: {name} must be >= {lo}, got {value}")
        if self._buckets is not None:
            raise TypeError(f"{method}: max_tokens batches are counted per epoch, not globally")

    def _chunks(self) -> Iterator[Chunk]:
        """The chunks from the handed position on: read here, or by the workers."""
        self.dataset.begin(self._handed)  # a state taken mid-iteration keeps this stop
        position = self._handed.copy()
        if self.num_workers == 0:
            return self.dataset.iter_chunks(position)
        # A state names the dataset by content (its identity digests every shard): made
        # here once, so the forked workers share it instead of each digesting every shard
        # for its first cursor (1M shards: ~3 s and ~30 MB of each worker's memory).
        self.state_dict()
        return self._workers.chunks(position)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """An iteration from the batches handed out so far on. It ends the loader's earlier
        iterators still held (not finished or closed): they would go on from their own
        position, and their torch workers, reading ahead under the same worker ids in the
        same share folder (:mod:`~wdstream.read.sources.exchange`), took this one's pieces
        (a worker then waited 60 s for a piece its double had taken)."""
        for earlier in list(self._iterators):
            earlier.close()
        iterator = self._iterate()
        self._iterators.add(iterator)
        return iterator

    def _iterate(self) -> Generator[dict[str, torch.Tensor], None, None]:
        self._iterating += 1  # skip_steps refuses to run under a live iterator
        try:
            yield from self._batches()
        finally:
            self._iterating -= 1

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        if self._buckets is not None:
            for batch in self._buckets:
                yield (
                    batch
                    if self.device is None
                    else {k: v.to(self.device) for k, v in batch.items()}
                )
            return
        chunks = self._chunks()
        cuda = self.device is not None and self.device.type == "cuda"
        if cuda:
            assert self.device is not None
            chunks = to_device(pinned(chunks), self.device)
        pin = self.pin_memory and not cuda and torch.cuda.is_available()
        B = self.dataset.cfg.batch_size
        labels = self.dataset.labels
        handed = self._handed
        for s, tokens, pos, cursors in chunks:
            if not cursors:  # a raw-text stream that finished its epochs passes its turn
                handed.pass_turn(s)
                continue
            sources = [c.get("source") for c in cursors]  # a mixture's rows' sources
            batches = chunk_to_batches(tokens, pos, B, pin, labels, self._host, sources)
            for j, batch in enumerate(batches):
                # Record the position only now, as the batch is handed over (past
                # max_quarantined it is not).
                self._quarantine.admit(cursors[j], handed.quarantined, B)
                handed.hand_over(s, cursors, j)
                if sources[j] is not None:  # a mixture: each row's source index
                    src = torch.from_numpy(sources[j])
                    batch["source"] = src if self.device is None else src.to(self.device)
                yield batch
        handed.iter_stop = None  # finished: the next iter() runs the following epochs
