"""The batch-sequence interface: what the torch layer asks of any order of batches.

Three kinds implement it, each in its own module: the per-rank streams
(:class:`~wdstream.read.order.streams_sequence.StreamsSequence`), the global order
(:class:`~wdstream.read.order.global_sequence.GlobalReader`) and a mixture of packed datasets
(:class:`~wdstream.read.mixture.reader.MixtureReader`). ``TokenDataset`` and ``Loader``
know only this interface: a new kind of order is a new module, not a branch in them.

A sequence fills chunks of ``K`` batches into buffers it is given (a worker's shared-memory
ring slot or fresh tensors, :class:`ChunkBuffers`) and yields ``(stream, i, tokens,
positions, cursors)``: the stream the chunk belongs to (-1 where there are none), the
chunk's number in this process (which ring slot it used), the filled int32 rows, their
``position_ids`` or None, and the cursor after each batch. The position it advances is a
:class:`SequencePosition`, which also records each batch handed to the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

__all__ = [
    "BatchSequence",
    "ChunkBuffers",
    "Cursor",
    "DocStarts",
    "FilledChunk",
    "SequencePosition",
    "Worker",
]


Cursor = dict[str, Any]
Worker = tuple[int, int] | None  # (id, num_workers) inside a torch worker, else None
DocStarts = np.ndarray | None  # bool [rows, T + 1]: where document pieces start, if asked
# (stream or -1, chunk number in this process, tokens [n*B, T+1], positions [n*B, T] or None,
# the cursor after each of the n batches)
FilledChunk = tuple[int, int, torch.Tensor, torch.Tensor | None, list[Cursor]]


class SequencePosition(Protocol):
    """Where a sequence is: what iteration advances and a state saves."""

    iter_stop: int | None
    worker: tuple[int, int] | None

    @property
    def quarantined(self) -> int:
        """Rows masked so far (``on_corrupt="mask"``), as the state counts them."""

    def copy(self) -> Any:
        """An independent copy."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON, for the hand-off to workers (they trust it: the loader checked it)."""

    def hand_over(self, stream: int, cursors: list[Cursor], j: int) -> None:
        """Record that batch ``j`` of a chunk of ``stream`` reached the caller."""

    def pass_turn(self, stream: int) -> None:
        """Record that ``stream`` passed its turn with an empty chunk."""


P = TypeVar("P", bound=SequencePosition)


class ChunkBuffers(Protocol):
    """Where a process writes its chunks."""

    def take(self, i: int, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """int32 buffers for this process's ``i``-th chunk of ``rows`` rows: tokens
        ``[rows, T + 1]`` and, with document boundaries, positions ``[rows, T]``."""


class BatchSequence(Protocol[P]):
    """One rank's batches in order, their positions and states (see the module docstring)."""

    def start(self, epoch: int) -> P:
        """The position at the start of ``epoch``."""

    def epoch_of(self, position: P) -> int:
        """The epoch ``position`` is in."""

    def begin(self, position: P, epochs: int | None) -> int | None:
        """Set and return the stop of the iteration starting at ``position``."""

    def length(self, position: P) -> int:
        """Batches this rank yields in ``position``'s epoch (or iteration)."""

    def batches_per_epoch(self, epoch: int) -> int:
        """Batches this rank yields in ``epoch``, the same on every rank."""

    def state_of(self, position: P) -> dict[str, Any]:
        """The JSON state of ``position``."""

    def position_of(self, state: Any) -> P:
        """Check ``state`` against this sequence; return its position (or refuse it with a
        ``StateMismatchError`` naming the field)."""

    def position_from_dict(self, d: dict[str, Any]) -> P:
        """A position from :meth:`SequencePosition.to_dict` (the worker hand-off)."""

    def chunks(
        self, position: P, worker: Worker, buffers: ChunkBuffers, epochs: int | None
    ) -> Iterator[FilledChunk]:
        """This process's chunks from ``position`` on, advancing it; ``worker`` is
        ``(id, num_workers)`` inside a torch worker, None in the main process."""

    def fill_step(
        self, step: int, position: P, tokens: np.ndarray, doc: DocStarts
    ) -> np.ndarray | None:
        """This rank's rows of global ``step`` into ``tokens`` ([B, T + 1]) as iteration
        from ``position`` gives them; returns each row's source index for a mixture.

        Raises:
            TypeError: for an order without random access (per-rank streams).
        """

    def skip_steps(self, position: P, n: int) -> P:
        """A copy of ``position`` whose next batch is ``n`` data steps later, the skip
        recorded so training steps still map to data steps.

        Raises:
            TypeError: for an order without global steps (per-rank streams).
        """

    def data_step(self, position: P, training_step: int) -> int:
        """The data step ``training_step`` reads under ``position``'s skips.

        Raises:
            TypeError: for an order without global steps (per-rank streams).
        """

    def first_chunk(
        self, position: P, buffers: ChunkBuffers, epochs: int | None
    ) -> FilledChunk | None:
        """The first chunk (one step) of an iteration from ``position``, made in this
        process with no thread left behind, advancing ``position`` (None: no step left).

        Raises:
            TypeError: for an order without global steps (per-rank streams).
        """

    def release(self) -> None:
        """Drop cached window data (the end of an iteration)."""

    def stop_reads_when(self, outside: Callable[[], bool] | None) -> None:
        """Stop this process's reads also once ``outside()`` is true (a torch worker's
        iteration that the training process left: :meth:`WindowReads.stop_when`)."""
