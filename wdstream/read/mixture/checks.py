"""Which rows of each source one torch worker of a mixture reads: what it must verify.

A source's window is read whole by every worker that cuts rows from it; each worker checksums
only the samples behind its own rows, and together the workers check every row read (see
``WindowReads.check_only``). A mixture's chunks are arithmetic: chunk ``c`` is steps
``[cK, (c + 1)K)`` (the iteration's first chunk may begin inside one) and worker ``w`` of
``W`` makes the chunks ``c0 + w + jW`` (``c0 + jW`` when it resumes its own saved share), so
the rows a worker reads from a window follow from the schedule without walking the chunks.
"""

from __future__ import annotations

import functools
from typing import Protocol, TypeVar

import numpy as np

from wdstream.read.mixture.schedule import Schedule
from wdstream.read.order.global_order import OrderConfig, Origin
from wdstream.read.order.steps import GlobalPosition

__all__ = ["MixtureOwnRows", "MixtureRows", "row_at"]

Steps = TypeVar("Steps", int, np.ndarray)  # one step, or many at once

# Ranges' answers kept (the least recently asked go first): a few windows of each source,
# asked again at every fill.
_KEPT = 64


class MixtureRows(Protocol):
    """What a worker's row ranges are computed from: the mixture's geometry and schedule
    (:class:`~wdstream.read.mixture.reader.MixtureReader` has them)."""

    cfg: OrderConfig
    rank: int
    batch_size: int
    chunk_batches: int
    row_tokens: int
    rows_per_epoch: list[int]

    def schedule(self, position: GlobalPosition) -> Schedule:
        """The schedule ``position`` is read under."""

    def row_at(self, step: int, origin: Origin) -> int:
        """The first mixture row of global step ``step``."""


class MixtureOwnRows:
    """The token ranges of each source's epochs that one worker's chunks read.

    Args:
        reader: the mixture reader (schedule, geometry, this rank).
        position: where the iteration starts (its schedule pieces and origin).
        worker: this worker.
        workers: the number of workers.
    """

    def __init__(
        self, reader: MixtureRows, position: GlobalPosition, worker: int, workers: int
    ) -> None:
        self._reader, self._position = reader, position.copy()
        self._first_step = position.step
        self._first_chunk = position.step // reader.chunk_batches
        self._phase = 0 if position.worker == (worker, workers) else worker
        self._workers = workers
        # Thread-safe: the fill's thread and document windows' read-ahead both ask.
        self._kept = functools.lru_cache(maxsize=_KEPT)(self._spans)

    def forget_before(self, step: int) -> None:
        """Nothing to forget: the ranges follow from the schedule (the last few asked for
        are kept, whatever the step)."""

    def spans(self, source: int, epoch: int, t0: int, t1: int) -> list[tuple[int, int]]:
        """The ranges of tokens ``[t0, t1)`` of ``source``'s epoch ``epoch`` this worker
        reads (all of them where the schedule never reaches the range's end).

        Kept once computed: a pure function of the schedule, asked for the same window at
        every fill that reads it (whether to read ahead), and ~0.5 ms a window to compute
        (a quarter of a worker's time at 3 sources, batch 8 x 2,048, when it was not kept).
        """
        return list(self._kept(source, epoch, t0, t1))  # a copy: the kept list stays intact

    def _spans(self, source: int, epoch: int, t0: int, t1: int) -> list[tuple[int, int]]:
        r, pos = self._reader, self._position
        T1, R = r.row_tokens, r.rows_per_epoch[source]
        sched = r.schedule(pos)
        lo, hi = epoch * R + t0 // T1, epoch * R + (t1 - 1) // T1 + 1  # source rows
        first_row, last_row = sched.row_of(source, lo), sched.row_of(source, hi - 1)
        if first_row is None or last_row is None:
            return [(t0, t1)]
        G, B, K, origin = r.cfg.global_batch, r.batch_size, r.chunk_batches, pos.origin
        step_lo = max(origin.step + (first_row - origin.row) // G, self._first_step)
        step_hi = origin.step + (last_row - origin.row) // G + 1
        steps = np.arange(step_lo, step_hi, dtype=np.int64)
        steps = steps[(steps // K - self._first_chunk - self._phase) % self._workers == 0]
        if not len(steps):
            return []
        if B == G:  # one rank: each of this worker's chunks is one run of rows
            new = np.flatnonzero(np.diff(steps // K)) + 1  # where the next chunk starts
            first = steps[np.concatenate(([0], new))]
            stop = steps[np.concatenate((new - 1, [len(steps) - 1]))] + 1
            a, b = row_at(first, origin, G), row_at(stop, origin, G)
        else:  # this rank's B rows of every step
            a = row_at(steps, origin, G) + r.rank * B
            b = a + B
        got_a = np.maximum(sched.source_counts(source, a), lo) - epoch * R
        got_b = np.minimum(sched.source_counts(source, b), hi) - epoch * R
        keep = got_a < got_b
        return list(zip((got_a[keep] * T1).tolist(), (got_b[keep] * T1).tolist(), strict=True))


def row_at(step: Steps, origin: Origin, g: int) -> Steps:
    """The first mixture row of step ``step`` (or of each of ``step``) counted from
    ``origin`` in steps of ``g`` rows."""
    return origin.row + (step - origin.step) * g
