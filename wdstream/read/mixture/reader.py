"""A mixture of packed datasets as one global batch sequence: exact proportions, per-source
epochs, weight schedules, O(1) resume and elastic resume.

Every source ``i`` is its own global row stream (:class:`~wdstream.read.order.global_order.GlobalOrder`
with a global batch of 1 row, seeded by ``SeedSequence([seed, i])``): epochs of ``R_i``
rows, each shuffled on its own, one after the other. The schedule
(:mod:`~wdstream.read.mixture.schedule`) decides which source gives each row of the one
endless mixture sequence, and that row's index in its source, in O(1)::

    mixture rows   0    1    2    3    4    5    6    7 ...     (interleave 0.6 / 0.4)
    source         web  code web  code web  web  code web
    source index   0    0    1    1    2    3    2    4
    web row k = row k % R_web of web's epoch k // R_web (small sources repeat: upsampling)

Global step ``s`` is mixture rows ``[row(s), row(s) + G)`` with ``row(s) = origin.row +
(s - origin.step) * G``; rank ``r`` takes ``B`` contiguous of them, as in the global order.
Rows are cut at the reader's ``seq_len`` from every source, whatever its packed length.
There are no mixture epochs: ``stop`` ends an iteration when the first source reaches a new
epoch (``"first_exhausted"``) or when every source has (``"all_exhausted"``), or never.

The state (``docs/MIXTURES.md``) holds the step, the origin, and the schedule pieces already
begun; on resume the pieces from the saved step on come from the new arguments, so a run
can re-weight its future (annealing), while any change to its past is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from wdstream.errors import StateMismatchError
from wdstream.read.mixture.checks import MixtureOwnRows, row_at
from wdstream.read.mixture.cursors import chunk_cursors
from wdstream.read.mixture.fill import fill_block, fill_rows
from wdstream.read.mixture.interleave import MIXTURE_ORDER_VERSION
from wdstream.read.mixture.schedule import Schedule, SchedulePiece, parse_weights
from wdstream.read.mixture.seal import mixture_seal
from wdstream.read.mixture.sources import source_seed
from wdstream.read.mixture.spec import MixtureSpec
from wdstream.read.mixture.state import (
    MIXTURE_STATE_VERSION,
    MixturePosition,
    parse_mixture_state,
)
from wdstream.read.order.base import ChunkBuffers, Cursor, DocStarts, FilledChunk, Worker
from wdstream.read.order.global_order import ORDER_VERSION, GlobalOrder, OrderConfig, Origin
from wdstream.read.order.identity import check_identity, rows_fingerprint
from wdstream.read.order.state_fields import SEAL_KEY
from wdstream.read.order.step_check import check_step
from wdstream.read.order.steps import GlobalPosition, StepChunks
from wdstream.read.order.window_data import Hit
from wdstream.read.sources.packed import ShardSource

__all__ = ["MixturePosition", "MixtureReader"]

_ORDER_VERSION = (MIXTURE_ORDER_VERSION, ORDER_VERSION)  # a state's ``order_version``


class MixtureReader:
    """One rank's view of a mixture's global sequence (see the module docstring).

    Args:
        spec: names, sources, weights or schedule, stop rule.
        sources: the opened sources (:func:`open_sources`), in spec order.
        cfg: the sequence parameters; ``seed`` is the mixture's, sources derive theirs.
        rank: this rank.
        batch_size: rows per rank and step (B).
        chunk_batches: steps per chunk (K).
        doc_boundaries: also return where document pieces start.
        quarantine: ``on_corrupt="mask"`` in every source (:class:`GlobalOrder`).

    Raises:
        ValueError: for a bad schedule, or a source too small for one row.
    """

    def __init__(
        self,
        spec: MixtureSpec,
        sources: list[ShardSource],
        cfg: OrderConfig,
        rank: int,
        batch_size: int,
        chunk_batches: int,
        doc_boundaries: bool,
        quarantine: bool = False,
    ) -> None:
        self.names = spec.names
        self.stop = spec.stop
        self.cfg = cfg
        self.schedule_args = parse_weights(spec.weights, self.names)
        self.orders = []
        for i, (name, src) in enumerate(zip(self.names, sources, strict=True)):
            one = OrderConfig(cfg.seq_len, 1, cfg.shuffle, source_seed(cfg.seed, i),
                              cfg.shuffle_window, cfg.shuffle_lanes)  # fmt: skip
            try:
                self.orders.append(GlobalOrder(src, one, quarantine))
            except ValueError as exc:
                raise ValueError(f"source {name!r}: {exc}") from None
        self.rows_per_epoch = [o.rows_per_epoch for o in self.orders]
        self.row_tokens = cfg.seq_len + 1
        self.rank, self.batch_size = rank, batch_size
        self.chunk_batches, self.doc_boundaries = chunk_batches, doc_boundaries
        self._schedules: dict[tuple[SchedulePiece, ...], Schedule] = {}
        # The pieces last asked for (a chunk's, by identity: no hash) and their schedule.
        self._last_schedule: tuple[tuple[SchedulePiece, ...], Schedule] | None = None

    @property
    def steps(self) -> StepChunks:
        """Made on each use: one kept here was a reference cycle (``read/weak_calls.py``)."""
        return StepChunks(self)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_schedules"] = {}  # rebuilt on use (tables are cached per process)
        state["_last_schedule"] = None
        return state

    # ---- steps, rows, schedule ---------------------------------------------------------
    def row_at(self, step: int, origin: Origin) -> int:
        """The first mixture row of global step ``step``."""
        return row_at(step, origin, self.cfg.global_batch)

    def schedule(self, position: GlobalPosition) -> Schedule:
        assert isinstance(position, MixturePosition)
        last = self._last_schedule
        if last is not None and last[0] is position.pieces:
            return last[1]
        sched = self._schedules.get(position.pieces)
        if sched is None:
            sched = self._schedules[position.pieces] = Schedule(position.pieces)
        self._last_schedule = (position.pieces, sched)
        return sched

    def future_pieces(self, after: int, origin: Origin) -> list[SchedulePiece]:
        """The argument schedule's pieces from step ``after`` on, placed by ``origin``.

        Raises:
            ValueError: a piece's step is one the run never reaches (:func:`check_step`),
                so its weights could never apply; named here, not at the first batch.
        """
        pieces = []
        for j, (s, w) in enumerate(self.schedule_args):
            if s >= after:
                try:
                    check_step(s, origin.step, origin.row, self.cfg.global_batch)
                except ValueError as exc:
                    raise ValueError(f"schedule piece {j}: {exc}") from None
                pieces.append(SchedulePiece(s, self.row_at(s, origin), w))
        return pieces

    def start(self, epoch: int) -> MixturePosition:
        if epoch:
            raise ValueError("a mixture has no epochs of its own (each source has its own)")
        return MixturePosition(pieces=tuple(self.future_pieces(0, Origin())))

    # ---- counts, progress, stop rules --------------------------------------------------
    def epoch_of(self, position: GlobalPosition) -> int:
        return 0

    def batches_per_epoch(self, epoch: int) -> int:
        raise TypeError("a mixture has no epochs: use len(loader) with a stop rule")

    def consumed(self, position: GlobalPosition) -> np.ndarray:
        """Rows of each source before ``position`` (int64 [K])."""
        return self.schedule(position).counts(self.row_at(position.step, position.origin))

    def progress(self, position: GlobalPosition) -> dict[str, dict[str, Any]]:
        """Per source: its epoch, rows and tokens (``seq_len`` per row) consumed before
        ``position``, the rows of its current epoch done, and its weight now."""
        sched = self.schedule(position)
        row = self.row_at(position.step, position.origin)
        piece = sched.pieces[sched.piece_at(row)]
        total = sum(piece.weights)
        out = {}
        for i, (name, n) in enumerate(zip(self.names, sched.counts(row).tolist(), strict=True)):
            r = self.rows_per_epoch[i]
            out[name] = {"epoch": n // r, "rows": n, "tokens": n * self.cfg.seq_len,
                         "epoch_rows": n % r, "rows_per_epoch": r,
                         "weight": piece.weights[i] / total}  # fmt: skip
        return out

    def stop_step(self, position: GlobalPosition) -> int:
        """Where an iteration starting at ``position`` stops (``self.stop`` is set): before
        the first later step holding the first row of a new epoch of the first source
        (``first_exhausted``) or of the last source (``all_exhausted``) to get there."""
        sched, g = self.schedule(position), self.cfg.global_batch
        after_first = sched.counts(self.row_at(position.step + 1, position.origin))
        steps = []
        for i, r in enumerate(self.rows_per_epoch):
            nxt = -(-int(after_first[i]) // r) * r  # first epoch start after the first step
            row = sched.row_of(i, nxt)
            if row is not None:
                steps.append(position.origin.step + (row - position.origin.row) // g)
        if not steps:
            raise ValueError("no source gives another row under this schedule")
        return min(steps) if self.stop == "first_exhausted" else max(steps)

    def begin(self, position: GlobalPosition, epochs: int | None) -> int | None:
        if self.stop is None:
            position.iter_stop = None
        elif position.iter_stop is None:
            position.iter_stop = self.stop_step(position)
        return position.iter_stop

    def iteration_length(self, position: GlobalPosition) -> int:
        """Steps from ``position`` to the end of its iteration.

        Raises:
            TypeError: without a stop rule (the mixture runs forever).
        """
        if self.stop is None:
            raise TypeError(
                "a mixture without a stop rule runs forever, so it has no length; pass "
                "stop='first_exhausted' or stop='all_exhausted' for a finite iteration"
            )
        stop = position.iter_stop if position.iter_stop is not None else self.stop_step(position)
        return stop - position.step

    def length(self, position: GlobalPosition) -> int:
        return self.iteration_length(position)

    def stopped(self, position: GlobalPosition) -> bool:
        """Whether the iteration ends at ``position`` (its stop step reached)."""
        return position.iter_stop is not None and position.step >= position.iter_stop

    def chunks(
        self, position: GlobalPosition, worker: Worker, buffers: ChunkBuffers, epochs: int | None
    ) -> Iterator[FilledChunk]:
        """This process's chunks from ``position`` on (:meth:`StepChunks.chunks`); each
        cursor also carries its batch's ``source`` indices."""
        return self.steps.iterate(position, worker, buffers, epochs)

    def chunk_size(self, position: GlobalPosition) -> int:
        """Steps to the next multiple of K (or the iteration's stop)."""
        k = self.chunk_batches
        n = k - position.step % k
        if position.iter_stop is not None:
            n = min(n, position.iter_stop - position.step)
        return n

    # ---- rows --------------------------------------------------------------------------
    def rank_rows(self, first: int, n: int, origin: Origin) -> np.ndarray:
        """This rank's mixture rows of steps ``[first, first + n)``, in order (int64)."""
        g, b = self.cfg.global_batch, self.batch_size
        if b == g:  # one rank: the steps' rows are contiguous
            row = self.row_at(first, origin)
            return np.arange(row, row + n * g, dtype=np.int64)
        starts = self.row_at(first, origin) + np.arange(n, dtype=np.int64) * g + self.rank * b
        return (starts[:, None] + np.arange(b, dtype=np.int64)[None, :]).reshape(-1)

    def locate(self, rows: np.ndarray, position: GlobalPosition) -> list[tuple[int, int, int]]:
        """``(source, source epoch, row in that epoch)`` of each mixture row."""
        src, idx = self.schedule(position).locate(rows)
        r = np.asarray(self.rows_per_epoch, dtype=np.int64)[src]
        return list(zip(src.tolist(), (idx // r).tolist(), (idx % r).tolist(), strict=True))

    def fill_rows(
        self,
        rows: np.ndarray,
        position: GlobalPosition,
        tokens: np.ndarray,
        doc_start: np.ndarray | None,
    ) -> tuple[np.ndarray, list[Hit]]:
        """Mixture rows ``rows`` (increasing) into ``tokens`` ([len(rows), T + 1]) in one
        pass over all sources (:func:`~wdstream.read.mixture.fill.fill_rows`); returns
        their sources and the rows masked (:meth:`GlobalOrder.fill`)."""
        return fill_rows(self.schedule(position), self.orders, rows, tokens, doc_start)

    def fill_chunk(
        self, first: int, n: int, position: GlobalPosition, tokens: np.ndarray, doc: DocStarts
    ) -> list[Cursor]:
        b = self.batch_size
        if b == self.cfg.global_batch:  # one rank: the steps' rows are consecutive
            row = row_at(first, position.origin, b)
            src, hits = fill_block(self.schedule(position), self.orders, row, n * b, tokens, doc)
        else:
            rows = self.rank_rows(first, n, position.origin)
            src, hits = self.fill_rows(rows, position, tokens, doc)
        return chunk_cursors(first, n, b, self.rank, hits, src)

    def verify_own_rows(
        self, position: GlobalPosition, worker: int, workers: int
    ) -> MixtureOwnRows | None:
        """With several workers, each source's order verifies only this worker's rows."""
        if workers <= 1:
            return None
        scope = MixtureOwnRows(self, position, worker, workers)
        for i, order in enumerate(self.orders):
            order.data.check_only(functools.partial(scope.spans, i))
        return scope

    def verify_all_rows(self) -> None:
        for order in self.orders:
            order.data.check_only(None)

    def release(self) -> None:
        for order in self.orders:
            order.data.release()

    def stop_reads_when(self, outside: Callable[[], bool] | None) -> None:
        for order in self.orders:
            order.data.stop_when(outside)

    def read_mode(self, background: bool = True, alone: bool = True) -> None:
        for order in self.orders:
            order.data.read_mode(background, alone)

    def first_chunk(
        self, position: GlobalPosition, buffers: ChunkBuffers, epochs: int | None
    ) -> FilledChunk | None:
        """The iteration's first chunk made here, no thread left (:meth:`StepChunks.first_chunk`)."""
        return self.steps.first_chunk(position, buffers, epochs)

    def fill_step(
        self, step: int, position: GlobalPosition, tokens: np.ndarray, doc: DocStarts
    ) -> np.ndarray:
        """This rank's rows of global ``step`` under ``position``'s schedule; their sources.

        Raises:
            TypeError, ValueError: ``step`` is no step of this run (:func:`check_step`).
        """
        o = position.origin
        step = check_step(step, o.step, o.row, self.cfg.global_batch)
        return self.fill_rows(self.rank_rows(step, 1, position.origin), position, tokens, doc)[0]

    # ---- state -------------------------------------------------------------------------
    def position_from_dict(self, d: dict[str, Any]) -> MixturePosition:
        return MixturePosition.from_dict(d)

    def config(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "sources": [[n, o.source.identity.state()] for n, o in zip(self.names, self.orders,
                                                                         strict=True)],
            "seed": c.seed, "seq_len": c.seq_len, "shuffle": c.shuffle,
            "shuffle_window": c.shuffle_window, "shuffle_lanes": c.shuffle_lanes,
            "global_batch": c.global_batch, "stop": self.stop,
        }  # fmt: skip

    def state_of(self, position: GlobalPosition) -> dict[str, Any]:
        assert isinstance(position, MixturePosition)
        o = position.origin
        begun = [
            [p.step, p.row, list(p.weights)] for p in position.pieces if p.step < position.step
        ]
        state = position.state(MIXTURE_STATE_VERSION, "mixture", self.config(),
                               {"step": o.step, "row": o.row}, schedule=begun)  # fmt: skip
        state["order_version"] = list(_ORDER_VERSION)
        state["next_rows"] = self.next_rows(
            self.row_at(position.step, o),
            tuple(p for p in position.pieces if p.step < position.step),
        )
        state[SEAL_KEY] = mixture_seal(state)
        return state

    def next_rows(self, row: int, begun: tuple[SchedulePiece, ...]) -> str:
        """The fingerprint of each source's next row before mixture row ``row`` under the
        pieces ``begun`` before it: independent of pieces not begun (they may change on
        resume), yet any change to the interleave or a source's order changes it."""
        counts = (
            self.schedule(MixturePosition(pieces=begun)).counts(row)
            if begun
            else np.zeros(len(self.orders), dtype=np.int64)
        )
        ids = []
        for i, (order, c) in enumerate(zip(self.orders, counts.tolist(), strict=True)):
            epoch, r = divmod(c, order.rows_per_epoch)
            ids += [(i, *x) for x in order.row_ids(epoch, r, 1)]
        return rows_fingerprint(ids)

    def position_of(self, state: Any) -> MixturePosition:
        """Check ``state`` and return the position it continues from here, under the saved
        schedule up to the saved step and this reader's schedule from there on.

        Raises:
            StateMismatchError: naming the key for a malformed state, one of other sources,
                seed, ``seq_len``, shuffle or stop rule, or a schedule whose pieces before
                the saved step differ from the state's.
        """
        saved = parse_mixture_state(state, self.config(), [o.source for o in self.orders])
        step, g = saved.step, self.cfg.global_batch
        past = [(p.step, p.weights) for p in saved.pieces]
        mine = [(s, w) for s, w in self.schedule_args if s < step]
        if past != mine:
            raise StateMismatchError(
                f"schedule: the weights before the saved step {step} differ from the state's "
                f"(state: {_show(past, self.names)}; now: {_show(mine, self.names)}); only "
                f"pieces at step >= {step} may change on resume"
            )
        origin, stop = saved.origin, saved.iter_stop
        if saved.global_batch != g:
            stop_row = None if stop is None else row_at(stop, origin, saved.global_batch)
            origin = Origin(step, 0, row_at(step, origin, saved.global_batch))
            if stop_row is not None:
                stop = max(step, origin.step + (stop_row - origin.row) // g)
        if isinstance(state, dict) and "order_version" in state:
            row = row_at(step, saved.origin, saved.global_batch)
            check_identity(state, list(_ORDER_VERSION), lambda: self.next_rows(row, saved.pieces))
        pieces = (*saved.pieces, *self.future_pieces(step, origin))
        return MixturePosition(step, origin, stop, saved.worker, saved.skips, saved.quarantined,
                               pieces=pieces)  # fmt: skip

    def skip_steps(self, position: GlobalPosition, n: int) -> MixturePosition:
        """``position`` with ``n`` data steps skipped (:meth:`GlobalPosition.skip`)."""
        assert isinstance(position, MixturePosition)
        return position.skipped(n)

    def data_step(self, position: GlobalPosition, training_step: int) -> int:
        """The data step of ``training_step`` (:meth:`GlobalPosition.data_step`)."""
        return position.data_step(training_step)


def _show(pieces: list[tuple[int, tuple[int, ...]]], names: list[str]) -> str:
    def one(w: tuple[int, ...]) -> str:
        t = sum(w)
        return " ".join(f"{n} {x}/{t}" for n, x in zip(names, w, strict=True))

    return ", ".join(f"from step {s}: {one(w)}" for s, w in pieces) or "no pieces"
