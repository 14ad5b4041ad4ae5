"""The deterministic interleave of a mixture: which source gives global row n, exactly.

Weights are taken as the exact numbers they were written as (``0.6`` is 3/5, ``2`` is 2,
``1 / 3`` is 1/3: a float is the simplest fraction that rounds to it), normalised to fractions ``W_i / P`` with integer ``W_i`` summing to the *period* ``P``. One
period is built once with Tijdeman's chairman-assignment rule (R. Tijdeman, "The chairman
assignment problem", Discrete Math. 32, 1980): at row ``t`` (1-based), among the sources
whose lag ``p_i t - c_i`` is at least ``s = 1 / (2K - 2)``, take the one with the smallest
``(c_i + 1 - s) / p_i``. It keeps every prefix count within ``1 - s`` of ``p_i t``, so after
any ``n`` rows every source's count differs from ``p_i n`` by less than 1. After ``P`` rows
every count is exactly ``W_i`` again and the sequence repeats::

    weights web 0.6, code 0.3, math 0.1  ->  W = (6, 3, 1), P = 10
    period:  web code web web code web math web code web   (then again)
    row n = q * P + r:  source table[r], its index in that source q * W_i + within[r]

So the source of a row and the row's index in its source are two table lookups (O(1)), and
the count of each source before any row is one ``searchsorted`` per source. Random draws
(HF ``interleave_datasets``, torchdata's weighted sampler) drift by about ``sqrt(n)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from wdstream.read.order.row_places import RowPlaces

__all__ = ["MAX_PERIOD", "MIXTURE_ORDER_VERSION", "Block", "Interleave", "exact_weights"]

# The version of the interleave above (with the sources' ``ORDER_VERSION``, a mixture
# state's ``order_version``). Bump it with any change to which source gives a row.
MIXTURE_ORDER_VERSION = 1

# Rows of one period: its tables (5 bytes a row) are built in Python once per weight vector.
MAX_PERIOD = 1 << 16
_SIMPLE_DENOMINATOR = 10**6
_BLOCKS = 1024  # blocks kept per interleave (:meth:`Interleave.block`; ~8 KB each at n=128)


class Block(NamedTuple):
    """``n`` consecutive rows at one place in the period, by source: ``source[t]`` gives
    row ``t``; ``order`` the rows grouped by source (a stable argsort of ``source``);
    ``counts[i]`` rows of source ``i`` among them; ``firsts[i] + q * weights[i]`` the index
    in source ``i`` of its first row there, ``q`` periods on (:meth:`Interleave.block`; its
    rows' indices are consecutive: the interleave gives each source's rows in index order).
    ``groups``: ``(i, counts[i], its rows' places in order)`` of each source with rows
    there, in source order (``order`` cut by source). A block is shared by every chunk at
    its place in the period (one object, not one per chunk: a fill touches fewer objects),
    so its arrays are read-only, and ``memo`` keeps what a caller derives from ``order``
    (:meth:`places`)."""

    source: np.ndarray
    order: np.ndarray
    counts: list[int]
    firsts: list[int]
    memo: dict[int, RowPlaces]
    groups: tuple[tuple[int, int, np.ndarray], ...]
    weights: tuple[int, ...]

    def places(self, row_tokens: int) -> RowPlaces:
        """Where the rows grouped by source go in a block of rows of ``row_tokens``
        tokens (``RowPlaces(order, row_tokens)``, made once per place in the period)."""
        places = self.memo.get(row_tokens)
        if places is None:
            places = self.memo[row_tokens] = RowPlaces(self.order, row_tokens)
        return places


def exact_weights(weights: Sequence[float | int], names: Sequence[str]) -> tuple[int, ...]:
    """Integer weights ``W_i`` with ``W_i / sum(W)`` exactly the normalised ``weights``.

    A float is read as the simplest fraction (denominator up to 10**6) that rounds to it,
    else as the shortest decimal that prints as it: ``0.1`` is 1/10 and ``1 / 3`` is 1/3,
    not the binary floats near them, so the proportions are those written in code or a spec.

    Raises:
        ValueError: for a negative, non-finite or non-number weight, weights summing to 0,
            or weights whose exact ratio needs a period longer than ``MAX_PERIOD`` rows.
    """
    fracs = []
    for name, w in zip(names, weights, strict=True):
        if isinstance(w, bool) or not isinstance(w, int | float):
            raise ValueError(f"weight of source {name!r} must be a number, got {w!r}")
        if isinstance(w, float) and not math.isfinite(w):
            raise ValueError(f"weight of source {name!r} must be finite, got {w!r}")
        if w < 0:
            raise ValueError(f"weight of source {name!r} must be >= 0, got {w!r}")
        fracs.append(_fraction(w))
    total = sum(fracs, Fraction(0))
    if total <= 0:
        raise ValueError(
            f"weights must sum to a positive total, got {dict(zip(names, weights, strict=True))}"
        )
    shares = [f / total for f in fracs]
    period = math.lcm(*(s.denominator for s in shares))
    if period > MAX_PERIOD:
        raise ValueError(
            f"weights {dict(zip(names, weights, strict=True))} have exact proportions that "
            f"repeat only every {period:,} rows (more than {MAX_PERIOD:,}); give weights "
            "with fewer digits (e.g. 0.62 rather than 0.6173), or small integers"
        )
    return tuple(int(s * period) for s in shares)


def _fraction(w: float | int) -> Fraction:
    if isinstance(w, int):
        return Fraction(w)
    simple = Fraction(w).limit_denominator(_SIMPLE_DENOMINATOR)
    return simple if float(simple) == w else Fraction(repr(w))


@functools.lru_cache(maxsize=32)
def _period_table(w: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(source, within)`` of every row of one period (Tijdeman's rule, exact integers)."""
    p = sum(w)
    active = [i for i, x in enumerate(w) if x > 0]
    src = np.empty(p, dtype=np.int16)
    within = np.empty(p, dtype=np.int32)
    counts = [0] * len(w)
    if len(active) == 1:
        src[:] = active[0]
        within[:] = np.arange(p)
        return src, within
    k2 = 2 * len(active) - 2  # s = 1 / k2
    for t in range(1, p + 1):
        best, best_num, best_den = -1, 0, 1
        for i in active:
            c = counts[i]
            if (w[i] * t - p * c) * k2 < p:  # lag below s: not eligible
                continue
            num = (c + 1) * k2 - 1  # (c + 1 - s) / p_i  ~  num / w_i (common factors dropped)
            if best < 0 or num * best_den < best_num * w[i]:
                best, best_num, best_den = i, num, w[i]
        assert best >= 0, "Tijdeman's rule always has an eligible source"
        src[t - 1] = best
        within[t - 1] = counts[best]
        counts[best] += 1
    assert counts == list(w)
    return src, within


class Interleave:
    """One weight vector's row sequence (see the module docstring).

    Args:
        weights: integer weights from :func:`exact_weights`.
    """

    def __init__(self, weights: tuple[int, ...]) -> None:
        self.weights = weights
        self.period = sum(weights)
        self.w = np.asarray(weights, dtype=np.int64)
        self.source, self.within = _period_table(weights)
        # int64 copies for locate: row r of a period is index q * step[r] + within[r] of
        # source[r] (one lookup per table, no casts per call).
        self._source = self.source.astype(np.int64)
        self._step = self.w[self._source]
        self._within = self.within.astype(np.int64)
        # Per source: where its rows fall inside the period (for counts and inverses).
        self.offsets = [np.flatnonzero(self.source == i) for i in range(len(weights))]
        # Per (place in the period, n): the block's sources, their stable argsort, counts
        # and the indices before it within the period (:meth:`block`).
        self._blocks: dict[tuple[int, int], Block] = {}

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Source and index inside that source of each row (counted from the start)."""
        q, r = np.divmod(rows, self.period)
        return self._source[r], q * self._step[r] + self._within[r]

    def block(self, row: int, n: int) -> tuple[Block, int]:
        """Rows ``[row, row + n)`` by source: the :class:`Block` of their place in the
        period (what :meth:`locate` and a stable argsort of its sources give, cached per
        place: a chunk of a fixed size meets a few, ``period / gcd(period, n)``) and how
        many periods on they are (``q``), so a chunk costs a few integer operations rather
        than a lookup and a sort."""
        q, r = divmod(row, self.period)
        hit = self._blocks.get((r, n))
        if hit is None:
            src, _ = self.locate(np.arange(r, r + n, dtype=np.int64))
            order = np.argsort(src, kind="stable")
            counts = np.bincount(src, minlength=len(self.weights)).tolist()
            before = [int(np.searchsorted(off, r)) for off in self.offsets]
            src.setflags(write=False)
            order.setflags(write=False)
            ends = np.cumsum(counts).tolist()
            groups = tuple(
                (i, m, order[e - m : e])
                for i, (m, e) in enumerate(zip(counts, ends, strict=True))
                if m
            )
            if len(self._blocks) >= _BLOCKS:
                self._blocks.clear()
            hit = self._blocks[r, n] = Block(src, order, counts, before, {}, groups,
                                             self.weights)  # fmt: skip
        return hit, q

    def counts(self, rows: int) -> np.ndarray:
        """Rows each source gives among the first ``rows`` rows (int64 [K])."""
        q, r = divmod(rows, self.period)
        part = [int(np.searchsorted(off, r)) for off in self.offsets]
        return q * self.w + np.asarray(part, dtype=np.int64)

    def source_counts(self, source: int, rows: np.ndarray) -> np.ndarray:
        """Rows ``source`` gives among the first ``rows[k]`` rows, for every k (int64):
        :meth:`counts` of one source at many row counts at once."""
        q, r = np.divmod(rows, self.period)
        return q * self.w[source] + np.searchsorted(self.offsets[source], r)

    def row_of(self, source: int, index: int) -> int | None:
        """The row (counted from the start) of ``source``'s ``index``-th row; None if the
        source has weight 0."""
        w = self.weights[source]
        if w == 0:
            return None
        q, r = divmod(index, w)
        return q * self.period + int(self.offsets[source][r])
