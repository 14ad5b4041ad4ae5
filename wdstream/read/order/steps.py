"""Chunks of global steps for one process: what the global order and a mixture share.

Both serve a rank its rows of global steps in chunks of ``K`` consecutive steps, chunk ``j``
of an iteration made by torch worker ``j % num_workers`` (torch hands chunks over in worker
order, so every worker count gives the same batches). They differ in where a chunk ends,
when an iteration stops and how rows are filled: that is the :class:`StepRows` each gives
to a :class:`StepChunks` it owns (composition, not a shared base class).
"""

from __future__ import annotations

import copy
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from wdstream.read.batches.rows import position_ids
from wdstream.read.order.base import ChunkBuffers, Cursor, DocStarts, FilledChunk, Worker
from wdstream.read.order.global_order import Origin
from wdstream.read.order.state_fields import int_field, mismatch
from wdstream.read.order.window_data import Hit

__all__ = [
    "GlobalPosition",
    "RowScope",
    "StepChunks",
    "StepRows",
    "masked_rows",
    "parse_skips",
    "step_cursors",
]


_P = TypeVar("_P", bound="GlobalPosition")


@dataclass
class GlobalPosition:
    """The next global step, the origin steps are counted from, the iteration's stop epoch,
    and the steps skipped so far.

    ``step`` is the next *data* step (the one whose rows come next). ``skips`` holds
    ``(training step, n)``: at that training step (batches handed out, counted from 0)
    ``n`` data steps were skipped, so training step ``t`` reads data step
    ``t + sum(n for skips at or before t)`` (:meth:`data_step`). ``quarantined`` counts
    the rows masked so far (``on_corrupt="mask"``) by the rank that holds the position.
    """

    step: int = 0
    origin: Origin = field(default_factory=Origin)
    iter_stop: int | None = None
    worker: tuple[int, int] | None = None  # (id, num_workers) of one torch worker's share
    skips: tuple[tuple[int, int], ...] = ()
    quarantined: int = 0
    # The training process made this iteration's first step (StepChunks.first_chunk): no
    # chunk of its workers is a first batch (handed to them, not in a state).
    first_made: bool = False

    def copy(self: _P) -> _P:
        return copy.copy(self)

    def training_step(self) -> int:
        """The next training step: data steps less those skipped."""
        return self.step - sum(n for _, n in self.skips)

    def data_step(self, training_step: int) -> int:
        """The data step training step ``training_step`` reads, under the skips so far."""
        return training_step + sum(n for t, n in self.skips if t <= training_step)

    def skipped(self: _P, n: int) -> _P:
        """A copy of this position with ``n`` more steps skipped (:meth:`skip`)."""
        out = self.copy()
        out.skip(n)
        return out

    def skip(self, n: int) -> None:
        """Skip ``n`` data steps: the next batch is data step ``step + n``; recorded with the
        training step it happens at (merged with a skip at the same training step)."""
        t = self.training_step()
        if self.skips and self.skips[-1][0] == t:
            self.skips = (*self.skips[:-1], (t, self.skips[-1][1] + n))
        else:
            self.skips = (*self.skips, (t, n))
        self.step += n

    def to_dict(self) -> dict[str, Any]:
        """The hand-off to workers: they fill steps, so ``skips`` (a state's concern) stays
        in the main process and the hand-off keeps its fixed size."""
        o = self.origin
        worker = list(self.worker) if self.worker is not None else None
        return {"step": self.step, "origin": [o.step, o.epoch, o.row],
                "iter_stop": self.iter_stop, "worker": worker,
                "first_made": self.first_made}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GlobalPosition:
        worker = tuple(d["worker"]) if d["worker"] is not None else None
        return cls(d["step"], Origin(*d["origin"]), d["iter_stop"], worker,
                   first_made=d["first_made"])  # fmt: skip

    def state(
        self, version: int, order: str, config: dict[str, Any], origin: dict[str, int], **more: Any
    ) -> dict[str, Any]:
        """The JSON state of this position (the global order's and a mixture's have this form;
        ``more`` goes between the origin and the iteration's stop; ``skips`` and
        ``quarantined`` are there only once something was skipped or masked)."""
        worker = list(self.worker) if self.worker is not None else None
        skips = {"skips": [list(x) for x in self.skips]} if self.skips else {}
        masked = {"quarantined": self.quarantined} if self.quarantined else {}
        return {"version": version, "order": order, "config": config, "step": self.step,
                "origin": origin, **more, "iter_stop": self.iter_stop, "worker": worker,
                **skips, **masked}  # fmt: skip

    def hand_over(self, stream: int, cursors: list[Cursor], j: int) -> None:
        """Batch ``j`` of a chunk reached the caller: the next step is the one after it, and
        its masked rows are counted."""
        self.step = cursors[j]["step"]
        self.quarantined += masked_rows(cursors[j])

    def pass_turn(self, stream: int) -> None:
        """The global order has no streams and no empty chunks: nothing to record."""


def parse_skips(value: Any, step: int) -> tuple[tuple[int, int], ...]:
    """A state's ``skips``: ``[[training step, n >= 1], ...]`` with training steps
    increasing and none after the state's own (``step`` less all skipped).

    Raises:
        StateMismatchError: naming the entry.
    """
    if not isinstance(value, list):
        raise mismatch("skips", value, "a list of [training step, steps skipped] expected")
    out: list[tuple[int, int]] = []
    for j, x in enumerate(value):
        if not isinstance(x, list) or len(x) != 2:
            raise mismatch(f"skips[{j}]", x, "[training step, steps skipped] expected")
        t, n = int_field(f"skips[{j}][0]", x[0]), int_field(f"skips[{j}][1]", x[1], lo=1)
        if out and t <= out[-1][0]:
            raise mismatch(f"skips[{j}][0]", t, "training steps of skips increase")
        out.append((t, n))
    if out and step - sum(n for _, n in out) < out[-1][0]:
        raise mismatch("skips", value, f"skips more steps than the state's step {step} allows")
    return tuple(out)


def step_cursors(first: int, n: int, batch_size: int, rank: int, hits: list[Hit]) -> list[Cursor]:
    """The cursor after each of the steps ``[first, first + n)`` of a chunk (``{"step": k +
    1}``), with the events of the rows ``hits`` names (rows of the chunk, ``batch_size`` a
    step) under ``"quarantined"``: plain dicts (step, rank, row in the batch, shard,
    sample, byte, reason), one per row and stand-in sample, in row order; they travel with
    the chunk from a torch worker to the loader."""
    cursors: list[Cursor] = [{"step": first + i + 1} for i in range(n)]
    for r, bad in sorted(hits, key=lambda h: (h[0], h[1].shard, h[1].sample)):
        i, row = divmod(r, batch_size)
        event = {"step": first + i, "rank": rank, "row": row, "shard": bad.shard,
                 "sample": bad.sample, "byte": bad.byte, "reason": bad.reason}  # fmt: skip
        cursors[i].setdefault("quarantined", []).append(event)
    return cursors


def masked_rows(cursor: Cursor) -> int:
    """Rows of the batch after which ``cursor`` was taken that were masked (a row that holds
    tokens of two stand-in samples is one row and two events)."""
    return len({e["row"] for e in cursor.get("quarantined", ())})


class RowScope(Protocol):
    """What a worker verifying only its own rows is told as its chunks are filled."""

    def forget_before(self, step: int) -> None:
        """Chunks before ``step`` are filled: no window read from now on serves them."""


class StepRows(Protocol):
    """A rank's rows of a sequence of global steps (the global order, a mixture)."""

    batch_size: int
    row_tokens: int
    doc_boundaries: bool

    def chunk_size(self, position: GlobalPosition) -> int:
        """Steps in the chunk starting at ``position``."""

    def stopped(self, position: GlobalPosition) -> bool:
        """Whether the iteration ends at ``position``."""

    def begin(self, position: GlobalPosition, epochs: int | None) -> int | None:
        """Set and return the stop of the iteration starting at ``position``."""

    def release(self) -> None:
        """Drop cached window data (the end of an iteration)."""

    def read_mode(self, background: bool = True, alone: bool = True) -> None:
        """How windows are read: ahead in background threads (else no thread is made);
        the few samples of a cold window's rows alone first (else windows whole only)."""

    def fill_chunk(
        self, first: int, n: int, position: GlobalPosition, tokens: np.ndarray, doc: DocStarts
    ) -> list[Cursor]:
        """This rank's rows of steps ``[first, first + n)``; the cursor after each step."""

    def verify_own_rows(
        self, position: GlobalPosition, worker: int, workers: int
    ) -> RowScope | None:
        """With several workers, make this one verify only the samples of its own rows."""

    def verify_all_rows(self) -> None:
        """Back to verifying every sample read (the iteration ended)."""


class StepChunks:
    """Walks one process's chunks of a :class:`StepRows`."""

    def __init__(self, rows: StepRows) -> None:
        self.rows = rows

    def skip(self, position: GlobalPosition, chunks: int, short: bool = False) -> bool:
        """Move ``position`` past ``chunks`` chunks (the first of them one step if ``short``:
        an iteration's first chunk); False if the iteration ends first."""
        for i in range(chunks):
            if self.rows.stopped(position):
                return False
            position.step += self._size(position, short and i == 0)
        return not self.rows.stopped(position)

    def _size(self, position: GlobalPosition, short: bool) -> int:
        """Steps in the chunk starting at ``position``; one if ``short``."""
        n = self.rows.chunk_size(position)
        return min(n, 1) if short else n

    def own(self, position: GlobalPosition, worker: int, workers: int) -> Iterator[tuple[int, int]]:
        """``(first step, steps)`` of this worker's chunks from ``position`` on; at each
        yield ``position`` already names the worker's next chunk (see :meth:`chunks`).

        The first chunk of an iteration is one step, whichever process makes it (the only
        one, or torch worker 0): the first batch then waits for its own rows, not for ``K``
        steps'. The chunk after it (the next worker's) runs to the next multiple of ``K``,
        as every chunk does, so the batches and their order are the same; every worker
        walks the same chunks. A worker's own saved share continues mid-iteration, as its
        chunks were. Where the training process made the first step (``first_made``), no
        chunk of the workers is a first batch: the first runs to the next multiple of ``K``
        too (a one-step chunk would read its few samples alone, then their windows whole:
        from a remote store, a GET per sample more).
        """
        own_share = workers > 1 and position.worker == (worker, workers)
        position.worker = (worker, workers) if workers > 1 else None
        short = not own_share and not position.first_made
        if not self.skip(position, 0 if own_share else worker, short):
            return
        short = short and worker == 0
        while True:
            n = self._size(position, short)
            short = False
            first = position.step
            position.step += n
            ended = not self.skip(position, workers - 1)
            yield first, n
            if ended:
                return

    def iterate(
        self, position: GlobalPosition, worker: Worker, buffers: ChunkBuffers, epochs: int | None
    ) -> Generator[FilledChunk, None, None]:
        """An iteration from ``position`` on: its stop set, this process's chunks
        (:meth:`chunks`), the cache dropped at its end."""
        wid, nw = worker if worker is not None else (0, 1)
        self.rows.begin(position, epochs)
        try:
            yield from self.chunks(position, wid, nw, buffers)
        finally:
            self.rows.release()
        position.iter_stop = None  # finished: the next iter() continues after it

    def first_chunk(
        self, position: GlobalPosition, buffers: ChunkBuffers, epochs: int | None
    ) -> FilledChunk | None:
        """The first chunk (one step) of an iteration from ``position``, made in this
        process with nothing read in the background and no thread left behind, ``position``
        advanced past it (None: the iteration has no step).

        A ``Loader`` with workers makes its first batch so, then forks its workers, which
        go on from ``position`` as from a state taken there: forking a training process
        costs 10-25 ms of its time per worker, which the first batch no longer waits for.
        """
        self.rows.read_mode(background=False)
        chunks = self.iterate(position, None, buffers, epochs)
        try:
            made = next(chunks, None)
            position.first_made = made is not None
            return made
        finally:
            chunks.close()  # the iteration's end for this process: its windows dropped
            self.rows.read_mode()

    def chunks(
        self, position: GlobalPosition, worker: int, workers: int, buffers: ChunkBuffers
    ) -> Iterator[FilledChunk]:
        """This worker's chunks from ``position`` on.

        Chunk ``j`` of the iteration is made by worker ``j % workers``; a worker's own saved
        share (``position.worker == (worker, workers)``, from ``StatefulDataLoader``) starts
        with its own next chunk. When a chunk is handed out, ``position`` already names this
        worker's next chunk, so a state taken then resumes this worker's share exactly; at
        the end it is where the iteration ends. ``cursors`` holds ``{"step": k + 1}`` after
        each step ``k``.
        """
        r = self.rows
        B, T1 = r.batch_size, r.row_tokens
        scope = r.verify_own_rows(position, worker, workers)
        first_made = position.first_made
        if first_made:  # no chunk here is a first batch: its windows are read whole
            r.read_mode(alone=False)
        try:
            for mine, (first, n) in enumerate(self.own(position, worker, workers)):
                if scope is not None:
                    scope.forget_before(first)
                tokens, positions = buffers.take(mine, n * B)
                doc = np.empty((n * B, T1), dtype=bool) if r.doc_boundaries else None
                cursors = r.fill_chunk(first, n, position, tokens.numpy(), doc)
                position.quarantined += sum(masked_rows(c) for c in cursors)
                if doc is not None and positions is not None:
                    positions.numpy()[:] = position_ids(doc)
                yield -1, mine, tokens, positions, cursors
        finally:
            if scope is not None:
                r.verify_all_rows()
            if first_made:
                r.read_mode()
