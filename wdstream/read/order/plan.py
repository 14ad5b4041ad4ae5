"""The epoch plan: shard order, equal per-stream sample ranges, windows, batches per epoch.

Everything is computed locally from the shard counts, with no communication, so every
rank and worker derives the same plan. Worked example, 3 shards of 4 samples, 2 ranks x 1
stream, epoch order ``[2, 0, 1]``::

    epoch sequence   2.0 2.1 2.2 2.3 | 0.0 0.1 0.2 0.3 | 1.0 1.1 1.2 1.3   (12 samples)
    ranges (S=2)     [0, 6) -> rank 0          [6, 12) -> rank 1

A remainder of fewer than ``world_size * streams`` samples at the end is left out (which
samples differs by epoch as the shard order changes). Inside a range, ``m`` lanes split it
into contiguous parts; window ``w`` takes the next ``ceil(W / m)`` samples of every lane::

    range [0, 12), m=3, W=6:  lanes [0,4) [4,8) [8,12)
    window 0 = 0 1 | 4 5 | 8 9      window 1 = 2 3 | 6 7 | 10 11

and is emitted in a permutation seeded by ``(seed, epoch, rank, stream, window)``. Every
stream yields ``min`` over all ranks' streams of its full-batch count, so every rank
yields the same number of batches per epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# numpy imports numpy.random on its first use, 10-25 ms: at import here, not in a fresh
# process's first batch, nor in each torch worker (whose start seeds numpy.random).
from numpy.random import default_rng

from wdstream.read.sources.packed import ShardSource

__all__ = ["EpochPlan", "OrderWindow", "WindowGeometry", "joined"]


@dataclass(frozen=True)
class WindowGeometry:
    """How one stream's sample range is cut into lanes and windows."""

    start: int
    stop: int
    window: int
    lanes: int

    @property
    def _m(self) -> int:
        return max(1, min(self.lanes, self.stop - self.start))

    @property
    def _per_lane(self) -> int:
        return max(1, math.ceil(self.window / self._m))

    @property
    def n_windows(self) -> int:
        """Number of windows covering the range."""
        n = self.stop - self.start
        return 0 if n <= 0 else math.ceil(math.ceil(n / self._m) / self._per_lane)

    def _lanes(self) -> list[tuple[int, int]]:
        m, n = self._m, self.stop - self.start
        return [(self.start + j * n // m, self.start + (j + 1) * n // m) for j in range(m)]

    def spans(self, w: int) -> list[tuple[int, int]]:
        """Epoch-sequence spans ``[p, q)`` of window ``w``, one per non-empty lane."""
        c = self._per_lane
        out = []
        for lo, hi in self._lanes():
            p, q = lo + w * c, min(lo + (w + 1) * c, hi)
            if p < q:
                out.append((p, q))
        return out

    def tokens_before_window(self, w: int, tokens_before: Callable[[int], int]) -> int:
        """Tokens of windows ``[0, w)``; ``tokens_before(p)``: tokens of epoch positions < p."""
        if w == 0:  # no lookups: every epoch's first window (a small source's only one)
            return 0
        c = self._per_lane
        return sum(
            tokens_before(min(lo + w * c, hi)) - tokens_before(lo) for lo, hi in self._lanes()
        )

    def window_at(self, token: int, tokens_before: Callable[[int], int]) -> int:
        """The window holding the range's token ``token`` (the later one at a boundary).

        A binary search (windows are in token order), so a cursor is checked with a few
        dozen prefix lookups however long the range is.
        """
        lo, hi = 0, max(0, self.n_windows - 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.tokens_before_window(mid, tokens_before) <= token:
                lo = mid
            else:
                hi = mid - 1
        return lo


class EpochPlan:
    """Shard order and per-stream ranges of one epoch.

    Args:
        source: the shards.
        epoch: epoch number.
        seed: shuffle seed.
        shuffle: permute shards (else dataset order).
        n_ranges: ``world_size * streams``.
    """

    def __init__(
        self, source: ShardSource, epoch: int, seed: int, shuffle: bool, n_ranges: int
    ) -> None:
        self.source = source
        n = len(source)
        if shuffle:
            self.order = default_rng([seed, epoch]).permutation(n)
        else:
            self.order = np.arange(n)
        self.cum = np.concatenate([[0], np.cumsum(source.samples[self.order])]).astype(np.int64)
        self.tok_cum = np.concatenate([[0], np.cumsum(source.tokens[self.order])]).astype(np.int64)
        self.n_ranges = n_ranges
        self.range_len = int(self.cum[-1]) // n_ranges

    def range(self, g: int) -> tuple[int, int]:
        """Epoch-sequence span of global stream ``g = rank * streams + stream``."""
        return g * self.range_len, (g + 1) * self.range_len

    def pieces(self, p: int, q: int) -> list[tuple[int, int, int]]:
        """``(shard, a, b)`` pieces covering epoch positions ``[p, q)``, in order."""
        out = []
        i = int(np.searchsorted(self.cum, p, side="right")) - 1
        while p < q:
            base = int(self.cum[i])
            end = min(q, int(self.cum[i + 1]))
            if end > p:
                out.append((int(self.order[i]), p - base, end - base))
            p = max(p, end)
            i += 1
        return out

    def tokens_before(self, p: int) -> int:
        """Tokens in epoch positions ``[0, p)``."""
        if p >= self.cum[-1]:
            return int(self.tok_cum[-1])
        i = int(np.searchsorted(self.cum, p, side="right")) - 1
        return int(self.tok_cum[i]) + self.source.tokens_before(
            int(self.order[i]), p - int(self.cum[i])
        )

    def batches_per_stream(self, row_tokens: int, batch_size: int) -> int:
        """Full batches every stream yields: the minimum over all ranges."""
        bounds = [self.tokens_before(g * self.range_len) for g in range(self.n_ranges + 1)]
        tokens = np.diff(np.asarray(bounds, dtype=np.int64))
        return int((tokens // row_tokens // batch_size).min())


@dataclass(frozen=True)
class OrderWindow:
    """A window of the global order (:mod:`~wdstream.read.order.global_order`)."""

    positions: np.ndarray  # int64[n]: epoch positions of the window's samples, emitted order
    starts: np.ndarray  # int64[n + 1]: token offsets of those samples inside the window
    begin: int  # token offset of the window in the epoch's stream
    order: np.ndarray  # int64[n]: emitted sample i is the order[i]-th in lane order
    bounds: list[int]  # ``starts`` as Python ints, for bisect (no numpy call per lookup)

    @property
    def end(self) -> int:
        """Token offset of the window's end in the epoch's stream."""
        return self.begin + self.bounds[-1]


def joined(pieces: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``pieces`` (``(shard, a, b)``, in order) with each run of adjacent pieces of one shard
    (``(s, a, b), (s, b, c)``) as one: a window holding whole lanes (a dataset smaller than
    a window: a small source in a mixture, every epoch) reads each shard's samples with one
    ranged read instead of one per lane. The samples and their order are the same."""
    out: list[tuple[int, int, int]] = []
    for s, a, b in pieces:
        if out and out[-1][0] == s and out[-1][2] == a:
            out[-1] = (s, out[-1][1], b)
        else:
            out.append((s, a, b))
    return out
