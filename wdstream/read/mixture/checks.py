"""Which rows of each source one torch worker of a mixture reads: what it must verify.

A source's window is read whole by every worker that cuts rows from it; each worker checksums
only the samples behind its own rows, and together the workers check every row read (see
``GlobalOrder.check_only``). A mixture's chunks are arithmetic: chunk ``c`` is steps
``[cK, (c + 1)K)`` (the iteration's first chunk may begin inside one) and worker ``w`` of
``W`` makes the chunks ``c0 + w + jW`` (``c0 + jW`` when it resumes its own saved share), so
the rows a worker reads from a window follow from the schedule without walking the chunks.
"""

from __future__ import annotations

from typing import Protocol

from wdstream.read.mixture.schedule import Schedule
from wdstream.read.order.global_order import OrderConfig, Origin
from wdstream.read.order.steps import GlobalPosition

__all__ = ["MixtureOwnRows", "MixtureRows"]


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

    def forget_before(self, step: int) -> None:
        """Nothing to forget: the ranges are computed, not remembered."""

    def spans(self, source: int, epoch: int, t0: int, t1: int) -> list[tuple[int, int]]:
        """The ranges of tokens ``[t0, t1)`` of ``source``'s epoch ``epoch`` this worker
        reads (all of them where the schedule never reaches the range's end)."""
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
        out: list[tuple[int, int]] = []
        for c in range(step_lo // K, (step_hi - 1) // K + 1):
            if (c - self._first_chunk - self._phase) % self._workers:
                continue
            steps = range(max(c * K, step_lo), min((c + 1) * K, step_hi))
            if B == G:
                rows = [(r.row_at(steps.start, origin), r.row_at(steps.stop, origin))]
            else:
                rows = [(m, m + B) for m in (r.row_at(s, origin) + r.rank * B for s in steps)]
            for a, b in rows:
                got_a = max(int(sched.counts(a)[source]), lo)
                got_b = min(int(sched.counts(b)[source]), hi)
                if got_a < got_b:
                    out.append(((got_a - epoch * R) * T1, (got_b - epoch * R) * T1))
        return out
