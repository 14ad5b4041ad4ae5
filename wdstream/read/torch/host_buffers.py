"""Reused arrays for what the training process makes per chunk and per batch.

Every batch a ``Loader`` hands over is cast to int64 in the training process
(``input_ids`` and ``labels``), and without workers the chunks are filled there too (int32
rows). Fresh arrays of a chunk's size come from ``mmap``: each of their pages is faulted in
and zeroed by the kernel when first written and unmapped again when the batches are
dropped, ~1,000 page faults a chunk (30 a batch of 8 x 2,048 tokens: the training
process's CPU per batch 117 vs 62 us at 2 workers, measured). Whether glibc happens to
serve them from its heap instead depends on what the process freed before (its mmap
threshold rises after a large free), which is not ours to rely on.

An array is reused only when nothing handed out still uses it: the batches and chunks are
``torch.from_numpy`` tensors (of the array or of a view of it), whose storage keeps the
array alive, so the array's Python reference count says whether any tensor made from it
(by the caller too) is still alive.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

__all__ = ["HostBuffers", "ReusedChunks"]

# The list's reference, the loop variable's and getrefcount's argument: nobody else's.
_UNUSED_REFS = 3


class HostBuffers:
    """At most ``keep`` arrays, each handed out again once unused.

    A free array of another shape or dtype (a first or last chunk is shorter) makes way
    for the one asked for, so the arrays kept are bounded by count, not by how many shapes
    occur. The default covers what a ``Loader`` has alive at once: the batch the caller
    holds and the next one (``input_ids``, ``labels`` and ``position_ids`` of each).
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._arrays: list[np.ndarray] = []

    def int64(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised int64 array of ``shape`` that no live tensor uses."""
        return self.array(shape, np.dtype(np.int64))

    def array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype`` that no live tensor uses."""
        free_other = None
        for arr in self._arrays:  # (enumerate's reused tuple would hold one more reference)
            if sys.getrefcount(arr) == _UNUSED_REFS:
                if arr.shape == shape and arr.dtype == dtype:
                    return arr
                free_other = arr
        new = np.empty(shape, dtype=dtype)
        if free_other is not None:
            self._arrays = [new if a is free_other else a for a in self._arrays]
        elif len(self._arrays) < self.keep:
            self._arrays.append(new)
        return new


class ReusedChunks:
    """Chunk buffers (``read.order.base.ChunkBuffers``) for chunks filled in the training
    process (no torch workers): int32 rows of ``rows`` rows at most, reused once no
    tensor of a chunk is alive.

    Every array has room for a whole chunk and a chunk takes its first rows: the first
    chunks of an iteration are shorter (one step, then up to the next multiple of
    ``chunk_batches``), and arrays of their exact sizes would each be new. A fresh
    process's short epoch filled ~26 new chunks of 1 MB (1,500 page faults of its ~6,000);
    two or three arrays are alive at once (the chunk being sliced, the one being filled).
    """

    def __init__(self, rows: int, seq_len: int, doc_boundaries: bool, keep: int = 4) -> None:
        self.rows, self.seq_len, self.doc_boundaries = rows, seq_len, doc_boundaries
        self._tokens, self._positions = HostBuffers(keep), HostBuffers(keep)

    def take(self, i: int, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """int32 tokens ``[rows, T + 1]`` (and positions ``[rows, T]`` with document
        boundaries), uninitialised, in arrays no live tensor uses."""
        if rows == 0:  # a stream passing its turn
            return torch.empty((0, self.seq_len + 1), dtype=torch.int32), None
        room = max(rows, self.rows)
        int32 = np.dtype(np.int32)
        tokens = self._tokens.array((room, self.seq_len + 1), int32)[:rows]
        if not self.doc_boundaries:
            return torch.from_numpy(tokens), None
        positions = self._positions.array((room, self.seq_len), int32)[:rows]
        return torch.from_numpy(tokens), torch.from_numpy(positions)

    def reference(self, i: int, tokens: torch.Tensor) -> Any:
        """What is yielded for the chunk: the tensor itself."""
        return tokens
