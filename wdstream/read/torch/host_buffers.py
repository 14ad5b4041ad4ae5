"""Reused int64 arrays for the batches the training process cuts out of each chunk.

Every chunk a ``Loader`` hands over is cast to int64 in the training process (``input_ids``
and ``labels`` of all its batches, two arrays of a few MB). Fresh arrays of that size come
from ``mmap``: each of their pages is faulted in and zeroed by the kernel when first written
and unmapped again when the batches are dropped, ~1,000 page faults a chunk (30 a batch of
8 x 2,048 tokens: the training process's CPU per batch 117 vs 62 us at 2 workers, measured).
Whether glibc happens to serve them from its heap instead depends on what the process freed
before (its mmap threshold rises after a large free), which is not ours to rely on.

An array is reused only when no batch handed out still holds it: the batches are
``torch.from_numpy`` views, whose storage keeps the array alive, so the array's Python
reference count says whether any tensor made from it (by the caller too) is still alive.
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["HostBuffers"]

# The list's reference, the loop variable's and getrefcount's argument: nobody else's.
_UNUSED_REFS = 3


class HostBuffers:
    """At most ``keep`` int64 arrays, each handed out again once unused.

    A free array of another shape (a first or last chunk is shorter) makes way for the
    shape asked for, so the arrays kept are bounded by count, not by how many shapes occur.
    The default covers what is alive at once: a chunk's ``input_ids`` and ``labels`` and the
    next chunk's, plus the per-batch ``position_ids`` in use and the next.
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._arrays: list[np.ndarray] = []

    def int64(self, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised int64 array of ``shape`` that no live tensor uses."""
        free_other = None
        for arr in self._arrays:  # (enumerate's reused tuple would hold one more reference)
            if sys.getrefcount(arr) == _UNUSED_REFS:
                if arr.shape == shape:
                    return arr
                free_other = arr
        new = np.empty(shape, dtype=np.int64)
        if free_other is not None:
            self._arrays = [new if a is free_other else a for a in self._arrays]
        elif len(self._arrays) < self.keep:
            self._arrays.append(new)
        return new
