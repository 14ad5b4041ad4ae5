"""A rank's share of the global batch sequence, its resume state, and random access.

The order itself is :mod:`wdstream.read.order.global_order`; this module serves it to one rank: chunks of
``K`` consecutive steps (aligned to multiples of ``K`` inside an epoch, so the next chunk's
size follows from the step alone), chunk ``j`` of an iteration made by torch worker
``j % num_workers`` -- torch hands chunks over in worker order, so every worker count gives
the same batches. The state is the global step and where counting began::

    {"version": 2, "order": "global",
     "config": {"dataset": ..., "seed": 0, "seq_len": 2048, "shuffle": true,
                "shuffle_window": 1024, "shuffle_lanes": 8, "global_batch": 64},
     "step": 41210, "origin": {"step": 0, "epoch": 0, "row": 0}, "iter_stop": null,
     "worker": null, "order_version": 1, "next_rows": "<16 hex>", "check": "<48 hex>"}

``order_version`` and ``next_rows`` name the order (:mod:`~wdstream.read.order.identity`);
``skips`` and ``quarantined`` (rows masked, ``on_corrupt="mask"``) appear once above 0. No
field depends on the rank, world size or workers: any rank of any world size with the same
global batch loads rank 0's state; with another, the run goes on from the same row (``origin``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from wdstream.errors import StateMismatchError
from wdstream.read.batches.rows import labelled_rows, row_labels
from wdstream.read.order.base import ChunkBuffers, Cursor, DocStarts, FilledChunk, Worker
from wdstream.read.order.global_order import ORDER_VERSION, GlobalOrder, OrderConfig, Origin
from wdstream.read.order.global_seal import check_seal, refuse_unsealed, seal
from wdstream.read.order.identity import IDENTITY_KEYS, check_identity, rows_fingerprint
from wdstream.read.order.state_fields import (
    SEAL_KEY,
    accept_dataset,
    dict_field,
    int_field,
    mismatch,
    same_value,
)
from wdstream.read.order.step_check import check_step
from wdstream.read.order.steps import (
    GlobalPosition,
    RowScope,
    StepChunks,
    parse_skips,
    step_cursors,
)
from wdstream.read.order.window_data import Hit
from wdstream.read.sources.packed import ShardSource

__all__ = ["GLOBAL_STATE_VERSION", "GlobalPosition", "GlobalReader", "global_batch_at"]

GLOBAL_STATE_VERSION = 2
_STATE_KEYS = ("version", "order", "config", "step", "origin", "iter_stop", "worker")


class GlobalReader:
    """One rank's view of the global sequence.

    Args:
        source: the packed dataset.
        order: the sequence (its ``global_batch`` is ``world_size * batch_size``).
        rank: this rank.
        batch_size: rows per rank and step (B).
        chunk_batches: steps per chunk (K).
        doc_boundaries: also return where document pieces start.
        quarantine: ``on_corrupt="mask"`` (:class:`GlobalOrder`).
    """

    def __init__(
        self,
        source: ShardSource,
        order: OrderConfig,
        rank: int,
        batch_size: int,
        chunk_batches: int,
        doc_boundaries: bool,
        quarantine: bool = False,
    ) -> None:
        self.order = GlobalOrder(source, order, quarantine)
        self.row_tokens = self.order.row_tokens
        self.rank, self.batch_size = rank, batch_size
        self.chunk_batches, self.doc_boundaries = chunk_batches, doc_boundaries

    @property
    def steps(self) -> StepChunks:
        """Made on each use: one kept here was a reference cycle (``read/weak_calls.py``)."""
        return StepChunks(self)

    # ---- counts ------------------------------------------------------------------------
    def epoch_of(self, position: GlobalPosition) -> int:
        return self.order.locate(position.step, position.origin)[0]

    def batches_per_epoch(self, epoch: int) -> int:
        """Steps (batches of every rank) in ``epoch``."""
        return self.order.steps_per_epoch

    def length(self, position: GlobalPosition) -> int:
        """Steps in ``position``'s epoch."""
        return self.batches_per_epoch(self.epoch_of(position))

    def begin(self, position: GlobalPosition, epochs: int | None) -> int | None:
        """Set the stop epoch of the iteration starting at ``position`` (kept mid-iteration)."""
        if epochs is None:
            position.iter_stop = None
        elif position.iter_stop is None:
            position.iter_stop = self.epoch_of(position) + epochs
        return position.iter_stop

    # ---- state -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        c = self.order.cfg
        return {
            "dataset": self.order.source.identity.state(), "seed": c.seed, "seq_len": c.seq_len,
            "shuffle": c.shuffle, "shuffle_window": c.shuffle_window,
            "shuffle_lanes": c.shuffle_lanes, "global_batch": c.global_batch,
        }  # fmt: skip

    def state_of(self, position: GlobalPosition) -> dict[str, Any]:
        o = position.origin
        origin = {"step": o.step, "epoch": o.epoch, "row": o.row}
        state = position.state(GLOBAL_STATE_VERSION, "global", self.config(), origin)
        state["order_version"] = ORDER_VERSION
        state["next_rows"] = self.next_rows(position.step, position.origin, self.order)
        state[SEAL_KEY] = seal(state)
        return state

    def next_rows(self, step: int, origin: Origin, order: GlobalOrder) -> str:
        """The fingerprint of the rows of global step ``step`` of ``order`` (its global
        batch) counted from ``origin``: the identity a state vouches for (``identity``)."""
        epoch, row = order.locate(step, origin)
        return rows_fingerprint(order.row_ids(epoch, row, order.cfg.global_batch))

    def position_of(self, state: Any) -> GlobalPosition:
        """Check ``state`` and return the position it continues from here.

        Raises:
            StateMismatchError: naming the field for a malformed state or one of another
                dataset, seed, ``seq_len`` or shuffle; a per-rank (version 1) state.
        """
        if isinstance(state, dict) and state.get("order") == "mixture":
            raise StateMismatchError(
                "order: the state is of a mixture; this loader reads one dataset: resume it "
                "with the mixture's Loader (the same sources and weights or spec file)"
            )
        if isinstance(state, dict) and state.get("version") == 1:
            raise StateMismatchError(
                "version: a version-1 state holds per-rank stream cursors, which the global "
                "order cannot continue exactly; resume it with order='streams' and the same "
                "world size, batch size and streams it was saved with, or start a new run"
            )
        sealed = isinstance(state, dict) and SEAL_KEY in state
        named = isinstance(state, dict) and any(k in state for k in IDENTITY_KEYS)
        skipped = isinstance(state, dict) and "skips" in state
        counted = isinstance(state, dict) and "quarantined" in state
        keys = (*_STATE_KEYS, *(IDENTITY_KEYS if named else ()), *((SEAL_KEY,) if sealed else ()),
                *(("skips",) if skipped else ()), *(("quarantined",) if counted else ()))  # fmt: skip
        state = dict_field("", state, keys)
        if not same_value(state["version"], GLOBAL_STATE_VERSION) or state["order"] != "global":
            raise mismatch("version", state["version"], "a global-order state (version 2)")
        mine = accept_dataset(state, self.config(), self.order.source, free=("global_batch",))
        saved = dict_field("config", state["config"], list(mine))
        diff = [k for k in mine if k != "global_batch" and not same_value(saved[k], mine[k])]
        if diff:
            what = ", ".join(f"{k}: saved {saved[k]!r}, now {mine[k]!r}" for k in diff)
            raise StateMismatchError(f"state does not belong to this reader ({what})")
        old_g = int_field("config.global_batch", saved["global_batch"], lo=1)
        raw = dict_field("origin", state["origin"], ("step", "epoch", "row"))
        origin = Origin(
            int_field("origin.step", raw["step"]),
            int_field("origin.epoch", raw["epoch"]),
            int_field("origin.row", raw["row"], hi=self.order.rows_per_epoch),
        )
        step = int_field("step", state["step"], lo=origin.step)
        stop = state["iter_stop"]
        if stop is not None:
            stop = int_field("iter_stop", stop)
        skips = parse_skips(state["skips"], step) if skipped else ()
        masked = int_field("quarantined", state["quarantined"], lo=1) if counted else 0
        if sealed:
            check_seal(state)
        old, saved_origin = self.order, origin
        if old_g != self.order.cfg.global_batch:
            old = self._old_order(old_g)
            origin = self._rebase(step, origin, old)
        if named:
            check_identity(state, ORDER_VERSION, lambda: self.next_rows(step, saved_origin, old))
        if not sealed:
            refuse_unsealed(state, skipped or counted)
        position = GlobalPosition(step, origin, stop, _worker(state["worker"]), skips, masked)
        if stop is not None and self.epoch_of(position) > stop:
            raise mismatch(
                "iter_stop", stop, f"is before the state's epoch {self.epoch_of(position)}"
            )
        return position

    def position_from_dict(self, d: dict[str, Any]) -> GlobalPosition:
        return GlobalPosition.from_dict(d)

    def skip_steps(self, position: GlobalPosition, n: int) -> GlobalPosition:
        """``position`` with ``n`` data steps skipped (:meth:`GlobalPosition.skip`)."""
        return position.skipped(n)

    def data_step(self, position: GlobalPosition, training_step: int) -> int:
        """The data step of ``training_step`` (:meth:`GlobalPosition.data_step`)."""
        return position.data_step(training_step)

    def _old_order(self, old_g: int) -> GlobalOrder:
        """This order under the saved global batch ``old_g``."""
        cfg = OrderConfig(**{**self.order.cfg.__dict__, "global_batch": old_g})
        return GlobalOrder(self.order.source, cfg)

    def _rebase(self, step: int, origin: Origin, old: GlobalOrder) -> Origin:
        """Where ``step`` stands under the old global batch: the new run's origin."""
        if origin.row >= old.rows_per_epoch:
            raise mismatch("origin.row", origin.row, "past the epoch's rows")
        epoch, row = old.locate(step, origin)
        return Origin(step, epoch, row)

    # ---- batches -----------------------------------------------------------------------
    def chunk_size(self, position: GlobalPosition) -> int:
        """Steps in the chunk starting at ``position``: to the next multiple of K in its
        epoch, or the epoch's end."""
        epoch = self.epoch_of(position)
        end = self.order.epoch_end_step(epoch, position.origin)
        start = end - self.order.steps_per_epoch  # may be before the origin: fine for K
        k = self.chunk_batches
        return min(k - (position.step - start) % k, end - position.step)

    def fill_step(
        self, step: int, position: GlobalPosition, tokens: np.ndarray, doc: DocStarts
    ) -> None:
        """This rank's rows of global step ``step``, counted from ``position``'s origin.

        Raises:
            TypeError, ValueError: ``step`` is no step of this run (:func:`check_step`).
        """
        o = position.origin
        self.fill(check_step(step, o.step, o.row, self.order.cfg.global_batch), o, tokens, doc)

    def fill(
        self, step: int, origin: Origin, tokens: np.ndarray, doc_start: np.ndarray | None
    ) -> list[Hit]:
        """This rank's rows of global step ``step`` into ``tokens`` ([B, T + 1]); the rows
        masked (:meth:`GlobalOrder.fill`)."""
        epoch, row = self.order.locate(step, origin)
        return self.order.fill(epoch, row + self.rank * self.batch_size, tokens, doc_start)

    def stopped(self, position: GlobalPosition) -> bool:
        """Whether the iteration ends at ``position`` (its stop epoch reached)."""
        return position.iter_stop is not None and self.epoch_of(position) >= position.iter_stop

    def chunks(
        self, position: GlobalPosition, worker: Worker, buffers: ChunkBuffers, epochs: int | None
    ) -> Iterator[FilledChunk]:
        """This process's chunks from ``position`` on (:meth:`StepChunks.chunks`)."""
        return self.steps.iterate(position, worker, buffers, epochs)

    def verify_own_rows(
        self, position: GlobalPosition, worker: int, workers: int
    ) -> RowScope | None:
        """With several workers, make this one verify only the samples of its own rows
        (the others verify theirs) and share window fetches with them; remote, read
        ahead only windows of its own rows. Returns what to tell as chunks are filled."""
        if workers <= 1:  # verifies all it reads; reads ahead only up to the iteration's end
            if not self.order.source.remote:
                return None
            own = _OwnRows(self, position.copy(), worker, 1)
            self.order.data.read_ahead_only(lambda e, a, b: bool(own.spans(e, a, b)))
            return own
        every = [_OwnRows(self, position.copy(), w, workers) for w in range(workers)]
        self.order.data.check_only(every[worker].spans)
        cfg = self.order.cfg
        rows = _WorkerRows(every, worker, 4 * cfg.shuffle_window // cfg.global_batch + 1)
        if self.order.source.shares_reads:
            self.order.data.share_reads(worker, rows.needers)
        return rows

    def verify_all_rows(self) -> None:
        """Back to verifying every sample read (the iteration ended)."""
        self.order.data.check_only(None)

    def rank_spans(self, first: int, n: int, origin: Origin) -> list[tuple[int, int, int]]:
        """``(epoch, t0, t1)``: the epoch token ranges of this rank's rows of steps
        ``[first, first + n)``, adjacent ranges merged."""
        B, T1 = self.batch_size, self.row_tokens
        out: list[tuple[int, int, int]] = []
        for step in range(first, first + n):
            epoch, row = self.order.locate(step, origin)
            t0 = (row + self.rank * B) * T1
            if out and out[-1][0] == epoch and out[-1][2] == t0:
                out[-1] = (epoch, out[-1][1], t0 + B * T1)
            else:
                out.append((epoch, t0, t0 + B * T1))
        return out

    def fill_chunk(
        self, first: int, n: int, position: GlobalPosition, tokens: np.ndarray, doc: DocStarts
    ) -> list[Cursor]:
        """This rank's rows of steps ``[first, first + n)`` into ``tokens`` ([n*B, T + 1]);
        returns the cursor after each step (:func:`step_cursors`)."""
        B = self.batch_size
        if B == self.order.cfg.global_batch:
            # One rank: the chunk's steps are consecutive rows of one epoch, one copy.
            epoch, row = self.order.locate(first, position.origin)
            hits = self.order.fill(epoch, row, tokens, doc)
        else:
            hits = []
            for i in range(n):
                rows = slice(i * B, (i + 1) * B)
                ds = None if doc is None else doc[rows]
                got = self.fill(first + i, position.origin, tokens[rows], ds)
                hits += [(i * B + r, bad) for r, bad in got]
        return step_cursors(first, n, B, self.rank, hits)

    def start(self, epoch: int) -> GlobalPosition:
        """The position at the start of ``epoch``."""
        return GlobalPosition(self.order.epoch_end_step(epoch - 1) if epoch else 0)

    def release(self) -> None:
        """Drop cached window data (the end of an iteration)."""
        self.order.data.release()

    def stop_reads_when(self, outside: Callable[[], bool] | None) -> None:
        """Stop the window reads also once ``outside()`` is true (:meth:`WindowReads.stop_when`)."""
        self.order.data.stop_when(outside)

    def read_mode(self, background: bool = True, alone: bool = True) -> None:
        """How windows are read (:meth:`WindowReads.read_mode`)."""
        self.order.data.read_mode(background, alone)

    def first_chunk(
        self, position: GlobalPosition, buffers: ChunkBuffers, epochs: int | None
    ) -> FilledChunk | None:
        """The iteration's first chunk made here, no thread left (:meth:`StepChunks.first_chunk`)."""
        return self.steps.first_chunk(position, buffers, epochs)


class _OwnRows:
    """The epoch token ranges one torch worker's chunks will read, known ahead of the reads.

    The read-ahead thread asks (``spans``) for the window it is about to read, which lies
    ahead of the chunk being filled: the worker's chunks are walked ahead, on a copy of its
    position, with the very generator that schedules them.
    """

    def __init__(
        self, reader: GlobalReader, position: GlobalPosition, worker: int, workers: int
    ) -> None:
        self._reader, self._origin = reader, position.origin
        self._chunks = reader.steps.own(position, worker, workers)
        self._known: deque[tuple[int, int, int, int]] = deque()  # (epoch, t0, t1, last step)
        self._ended = False
        self._lock = threading.Lock()  # asked by the read-ahead thread, pruned by the filler

    def spans(self, epoch: int, t0: int, t1: int) -> list[tuple[int, int]]:
        """The ranges of ``[t0, t1)`` of ``epoch`` this worker's chunks read."""
        with self._lock:
            while not self._ended and (not self._known or self._known[-1][:2] < (epoch, t1)):
                try:
                    first, n = next(self._chunks)
                except StopIteration:
                    self._ended = True
                    break
                last = first + n - 1
                for e, a, b in self._reader.rank_spans(first, n, self._origin):
                    self._known.append((e, a, b, last))
            return [
                (max(a, t0), min(b, t1))
                for e, a, b, _ in self._known
                if e == epoch and a < t1 and b > t0
            ]

    def forget_before(self, step: int) -> None:
        """Drop the ranges of chunks before ``step`` (filled: no window will need them)."""
        with self._lock:
            while self._known and self._known[0][3] < step:
                self._known.popleft()


class _WorkerRows:
    """Every worker's :class:`_OwnRows`, walked in one worker: which workers' chunks read
    a range (they share its fetches, :mod:`~wdstream.read.sources.exchange`)."""

    def __init__(self, every: list[_OwnRows], worker: int, margin: int) -> None:
        self._every, self._worker, self._margin = every, worker, margin

    def needers(self, epoch: int, t0: int, t1: int) -> list[int]:
        """The workers whose chunks read tokens of ``[t0, t1)`` of ``epoch``."""
        return [w for w, rows in enumerate(self._every) if rows.spans(epoch, t0, t1)]

    def forget_before(self, step: int) -> None:
        """Drop this worker's ranges of chunks before ``step`` (filled), and the others'
        before ``margin`` steps earlier: a window still to read may begin before this
        worker's position (about four windows of steps, so every worker decides alike)."""
        for w, rows in enumerate(self._every):
            rows.forget_before(step if w == self._worker else step - self._margin)


def _worker(value: Any) -> tuple[int, int] | None:
    """The ``worker`` field: None, or ``[id, num_workers]`` of one torch worker's share."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise mismatch("worker", value, "None or [worker id, num_workers] expected")
    n = int_field("worker[1]", value[1], lo=1, hi=1 << 16)
    return int_field("worker[0]", value[0], hi=n), n


def global_batch_at(
    source: str | ShardSource,
    step: int,
    *,
    seq_len: int,
    global_batch: int,
    seed: int = 0,
    shuffle: bool = True,
    shuffle_window: int = 1024,
    shuffle_lanes: int = 8,
    state: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """The whole global batch of step ``step``: every rank's rows, rank 0's first.

    The same rows ``Loader(..., order="global")`` hands out at that step on any world size
    with ``world_size * batch_size == global_batch``; ``state`` (a saved Loader state) counts
    steps as that run does (its origin after a change of global batch).

    Returns:
        ``{"input_ids", "labels"}``: int64 ``[global_batch, seq_len]``, labels as the
        Loader gives them (-100 on best-fit padding and on tokens without loss).

    Raises:
        StateMismatchError: if ``state`` belongs to another dataset or configuration.
        TypeError, ValueError: ``step`` is no step of this run (:func:`check_step`).
    """
    src = source if isinstance(source, ShardSource) else ShardSource(source)
    cfg = OrderConfig(seq_len=seq_len, global_batch=global_batch, shuffle=shuffle, seed=seed,
                      shuffle_window=shuffle_window, shuffle_lanes=shuffle_lanes)  # fmt: skip
    reader = GlobalReader(src, cfg, rank=0, batch_size=global_batch, chunk_batches=1,
                          doc_boundaries=False)  # fmt: skip
    origin = reader.position_of(state).origin if state is not None else Origin()
    rows = np.empty((global_batch, seq_len + 1), dtype=np.int32)
    reader.fill(check_step(step, origin.step, origin.row, global_batch), origin, rows, None)
    # The Loader's target rule for this dataset: the loss bit stripped, -100 on padding.
    return labelled_rows(torch.from_numpy(rows), row_labels(src.index, seq_len, None))
