"""The hand-off between a ``Loader`` and its torch workers, one public object both use.

The loader publishes its position in a shared-memory blob before it starts an iteration
(workers, persistent or not, read it at every ``iter()``), and gives every worker a ring of
chunk slots in shared memory (``[workers, slots, K*B, T+1]`` int32, and int32 positions), so
a worker's message is a slot number instead of a fresh shared-memory tensor (which costs
more than the data). Without a hand-off (no workers, or ``TokenDataset`` used directly)
chunks go into fresh tensors (:class:`FreshBuffers`). :func:`worker_start` is each worker's
first act.

It also tells the workers when the training process has left an iteration (a ``break``,
its iterator closed or collected, an error): two int64 words in shared memory, the number
of the iteration last published and that of the last one left. A worker's reads look at
them while they wait (:meth:`WorkerHandoff.left`, through
:class:`~wdstream.read.sources.fetches.ReadStop`), so a worker blocked in a stalled read
ends its chunk at once and takes torch's end (an index ``None``, or the next iteration's
reset) instead of being killed at torch's 5 s join. Numbered, a stop never reaches a later
iteration's reads, and neither a flag to clear nor a message to miss is left behind.
"""

from __future__ import annotations

import gc
import json
import mmap
import multiprocessing as mp
from typing import Any

import numpy as np
import torch

from wdstream.read.order.base import SequencePosition

__all__ = ["FreshBuffers", "RingBuffers", "WorkerHandoff", "forked_workers", "worker_start"]

_BASE_BYTES, _CURSOR_BYTES = 1 << 12, 512
_SCHEDULE_BYTES = 1 << 18  # a mixture's schedule: thousands of pieces of a few sources


def new_buffer(shape: tuple[int, ...], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialised tensor, allocated straight into shared memory if ``shared`` (as
    torch's ``default_collate`` does) so sending it to the main process does not copy it."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    numel = int(np.prod(shape))
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel)
    return torch.empty(0, dtype=dtype).new(storage).view(shape)


def forked_workers(context: Any) -> bool:
    """Whether torch workers made with ``multiprocessing_context`` (a torch ``DataLoader``
    option: None, a start method's name or a context) are forked: they then inherit this
    process's memory maps, and no buffer need be sent to them."""
    if context is None:  # the default start method, read without fixing it
        method = mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]
    else:
        method = context if isinstance(context, str) else context.get_start_method()
    return method == "fork"


def inherited_buffer(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed tensor in an anonymous shared memory map, for forked workers to inherit.

    torch's shared memory (:func:`new_buffer`) reserves a file's pages in ``/dev/shm`` as
    it makes one (``fallocate``: ~2 ms for a ring of 8 MB, before the first worker can be
    forked); a map's pages are made as they are first written, by whoever fills them.
    """
    numel = int(np.prod(shape))
    size = numel * torch.empty(0, dtype=dtype).element_size()
    return torch.frombuffer(mmap.mmap(-1, max(1, size)), dtype=dtype, count=numel).view(shape)


def worker_start(worker_id: int) -> None:
    """A torch worker's first act: the objects it inherited go out of its garbage
    collector's reach (:func:`gc.freeze`, as the ``gc`` docs advise for forked children).

    A forked worker holds a copy of the whole training process (~170,000 objects after
    ``import torch``), and the full collection that process owes fires in the worker as
    soon as it has made a few thousand objects of its own, often in its first chunk: it
    walks every inherited object and, writing to each one's header, copies every page they
    lie on (100-250 ms per worker measured, and memory). The worker's own objects are
    collected as ever; the inherited ones are the parent's to collect.
    """
    gc.freeze()


class FreshBuffers:
    """Fresh tensors per chunk (in shared memory inside a worker without a ring)."""

    def __init__(self, seq_len: int, doc_boundaries: bool, shared: bool) -> None:
        self.seq_len, self.doc_boundaries, self.shared = seq_len, doc_boundaries, shared

    def take(self, i: int, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        if rows == 0:  # a stream passing its turn
            return torch.empty((0, self.seq_len + 1), dtype=torch.int32), None
        tokens = new_buffer((rows, self.seq_len + 1), torch.int32, self.shared)
        positions = (
            new_buffer((rows, self.seq_len), torch.int32, self.shared)
            if self.doc_boundaries
            else None
        )
        return tokens, positions

    def reference(self, i: int, tokens: torch.Tensor) -> Any:
        """What is sent for the chunk: the tensor itself."""
        return tokens


class RingBuffers:
    """One worker's slots of the shared ring: chunk ``i`` goes into slot ``i % slots``."""

    def __init__(self, ring: tuple[torch.Tensor, torch.Tensor | None], worker: int) -> None:
        self.ring, self.worker = ring, worker

    def take(self, i: int, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        tokens, positions = self.ring
        slot = i % tokens.shape[1]
        pos = positions[self.worker, slot, :rows] if positions is not None else None
        return tokens[self.worker, slot, :rows], pos

    def reference(self, i: int, tokens: torch.Tensor) -> Any:
        """What is sent for the chunk: ``(worker, slot, rows)``."""
        return (self.worker, i % self.ring[0].shape[1], tokens.shape[0])


class WorkerHandoff:
    """The loader's position and the chunk ring, shared with its workers.

    Args:
        workers: torch workers.
        slots: ring slots per worker (a worker runs at most ``prefetch_factor`` chunks
            ahead of the one being sliced, so ``prefetch_factor + 2`` are never overwritten
            early).
        rows: rows per chunk (``K * B``).
        seq_len: T.
        doc_boundaries: also a ring of positions.
        streams: streams per rank (each cursor takes room in the position blob).
        schedule: the position carries a mixture's schedule pieces.
        forked: the workers are forked (:func:`forked_workers`): the buffers are memory
            maps they inherit (:func:`inherited_buffer`), else torch's shared memory,
            which is sent to them.
    """

    def __init__(
        self,
        workers: int,
        slots: int,
        rows: int,
        seq_len: int,
        doc_boundaries: bool,
        streams: int,
        schedule: bool,
        forked: bool = False,
    ) -> None:
        size = _BASE_BYTES + _CURSOR_BYTES * streams + (_SCHEDULE_BYTES if schedule else 0)
        self.blob = (
            inherited_buffer((size,), torch.uint8)
            if forked
            else torch.zeros(size, dtype=torch.uint8).share_memory_()
        )
        # [iteration last published, iteration last left] (see the module's text).
        self.iterations = (
            inherited_buffer((2,), torch.int64)
            if forked
            else torch.zeros(2, dtype=torch.int64).share_memory_()
        )
        self._words: np.ndarray | None = None  # their numpy view, made per process (left)

        def ring(shape: tuple[int, ...]) -> torch.Tensor:
            # Made in shared memory (share_memory_ would copy a private buffer there: the
            # ring is MBs, ~5 ms before the first batch); a slot's pages are touched when
            # filled.
            if forked:
                return inherited_buffer(shape, torch.int32)
            return new_buffer(shape, torch.int32, shared=True)

        shape = (workers, slots, rows)
        tokens = ring((*shape, seq_len + 1))
        positions = ring((*shape, seq_len)) if doc_boundaries else None
        self.ring = (tokens, positions)

    def publish(self, position: SequencePosition) -> None:
        """Write ``position`` for the workers of the next iteration.

        Raises:
            ValueError: if it does not fit the blob (a schedule of too many pieces).
        """
        blob = json.dumps(position.to_dict()).encode()
        if len(blob) + 8 > self.blob.numel():
            raise ValueError(
                f"the reader's position takes {len(blob):,} bytes, more than the "
                f"{self.blob.numel() - 8:,} the workers are handed (a schedule of too many "
                "pieces?); use fewer schedule pieces or num_workers=0"
            )
        out = self.blob.numpy()  # (torch's first slice assignment in a process: ~0.5 ms)
        out[:8] = np.frombuffer(len(blob).to_bytes(8, "little"), dtype=np.uint8)
        out[8 : 8 + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        self.iterations[0] += 1  # after the position: a worker reads both at its iter()

    def iteration(self) -> int:
        """The number of the iteration last published (a worker's, read at its ``iter()``)."""
        return int(self.iterations[0])

    def leave(self, iteration: int) -> None:
        """The training process left iteration ``iteration``: its workers' reads stop (never
        a later one's: an earlier iterator ended late leaves the number where it is)."""
        if int(self.iterations[1]) < iteration:
            self.iterations[1] = iteration

    def left(self, iteration: int) -> bool:
        """Whether the training process left iteration ``iteration``. A worker's reads look
        at it every 50 ms while they wait for a GET: through a numpy view of the words, as
        indexing the tensor cost ~200 us of CPU a look (cold, after each 50 ms sleep)
        against ~25 us."""
        words = self._words
        if words is None:
            words = self._words = self.iterations.numpy()
        return int(words[1]) >= iteration

    def __getstate__(self) -> dict[str, Any]:
        """The shared tensors (sent to spawned workers); not the numpy view, a copy there."""
        return {**self.__dict__, "_words": None}

    def position(self) -> dict[str, Any]:
        """The published position, as :meth:`SequencePosition.to_dict` wrote it."""
        n = int.from_bytes(self.blob[:8].numpy().tobytes(), "little")
        out: dict[str, Any] = json.loads(self.blob[8 : 8 + n].numpy().tobytes())
        return out

    def buffers(self, worker: int) -> RingBuffers:
        """Worker ``worker``'s slots."""
        return RingBuffers(self.ring, worker)

    def resolve(self, ref: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tokens and positions of a chunk a worker sent as ``(worker, slot, rows)``."""
        w, slot, rows = ref
        pos = self.ring[1][w, slot, :rows] if self.ring[1] is not None else None
        return self.ring[0][w, slot, :rows], pos
