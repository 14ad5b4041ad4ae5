"""Interleaved rounds and the spread of per-round ratios.

The host's speed drifts (about 2x between runs, and within a run), so a contender is never
timed in a block of its own repeats. Each round runs every contender once, and round ``r``
starts ``r`` places further along the list, so no contender is always first (or always right
after the same neighbour)::

    round 0: memmap  wdstream  mosaicml
    round 1: wdstream  mosaicml  memmap
    round 2: mosaicml  memmap  wdstream

A ratio is taken inside each round (contender / baseline of that same round) and the report
gives the min, median and max of those per-round ratios, never a ratio of medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

Runs = Sequence[Mapping[str, Any]]  # one result per round, each with its "round" number


def interleave(contenders: Sequence[T], repeats: int) -> Iterator[tuple[int, T]]:
    """``(round, contender)`` pairs: every contender once per round, the start rotating."""
    n = len(contenders)
    for r in range(repeats):
        for i in range(n):
            yield r, contenders[(r + i) % n]


@dataclass(frozen=True)
class Spread:
    """Min, median and max of one quantity over ``n`` rounds."""

    lo: float
    mid: float
    hi: float
    n: int

    def fmt(self, suffix: str = "x", digits: int = 2) -> str:
        """``"0.92x (0.88–0.97)"``; just ``"0.92x"`` for one round."""
        mid = f"{self.mid:.{digits}f}{suffix}"
        if self.n < 2:
            return mid
        return f"{mid} ({self.lo:.{digits}f}–{self.hi:.{digits}f})"


def spread(values: Sequence[float | None]) -> Spread | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return Spread(min(vals), statistics.median(vals), max(vals), len(vals))


def by_round(runs: Runs | None) -> dict[int, Mapping[str, Any]]:
    """Successful results keyed by their round (errors left out)."""
    return {int(x["round"]): x for x in runs or () if "error" not in x and "round" in x}


def round_ratios(
    runs: Runs | None,
    base: Runs | None,
    key: str,
    inverse: bool = False,
    base_key: str | None = None,
) -> list[float]:
    """``runs[key] / base[base_key or key]`` for every round both measured.

    ``inverse`` gives ``base / runs``: for times (seconds), so that > 1 means faster.
    """
    a, b = by_round(runs), by_round(base)
    out = []
    for r in sorted(a.keys() & b.keys()):
        x, y = a[r].get(key), b[r].get(base_key or key)
        if x and y:
            out.append(y / x if inverse else x / y)
    return out


def ratio_spread(
    runs: Runs | None,
    base: Runs | None,
    key: str,
    inverse: bool = False,
    base_key: str | None = None,
) -> Spread | None:
    return spread(round_ratios(runs, base, key, inverse, base_key))


def value_spread(runs: Runs | None, key: str) -> Spread | None:
    return spread([x.get(key) for x in by_round(runs).values()])


def first_error(runs: Runs | Mapping[str, Any] | None) -> str:
    """The error, when every round of a contender failed; '' otherwise."""
    if isinstance(runs, Mapping):
        runs = [runs]
    errs = [x["error"] for x in runs or () if "error" in x]
    return errs[0] if errs and len(errs) == len(runs or ()) else ""
