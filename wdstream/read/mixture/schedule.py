"""A mixture's weight schedule: pieces of exact interleaves, each from its boundary on.

``weights`` is one ``{name: weight}`` (one piece from step 0) or a list of
``(step, {name: weight})`` pieces. SchedulePiece ``j`` starts at global row ``row_j`` (its step
times the global batch, counted from the run's origin) and interleaves its sources exactly
from there (:class:`~wdstream.read.mixture.interleave.Interleave`); every source keeps one
row counter across pieces::

    pieces (0, web .6 code .4), (1000, web .2 code .8); G = 64
    rows [0, 64000): web/code 3:2 exactly     rows [64000, ...): 1:4 exactly from row 64000
    code's index of row n >= 64000 = code rows before 64000 + code rows of the new piece

So the source and per-source index of any row are a binary search over the pieces and two
table lookups, and the inverse (where does source i's t-th row fall) is as cheap.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdstream.read.mixture.interleave import Block, Interleave, exact_weights
from wdstream.read.order.step_check import ROW_LIMIT

__all__ = ["SchedulePiece", "Schedule", "parse_weights"]


@dataclass(frozen=True)
class SchedulePiece:
    """Weights ``weights`` (exact integers, source order) in effect from global step ``step``,
    which begins at global row ``row``."""

    step: int
    row: int
    weights: tuple[int, ...]


def _piece_weights(where: str, weights: Any, names: Sequence[str]) -> tuple[int, ...]:
    if not isinstance(weights, Mapping):
        raise ValueError(f"{where}: weights must be a mapping of source name to weight, got "
                         f"{weights!r}")  # fmt: skip
    unknown = [k for k in weights if k not in names]
    if unknown:
        raise ValueError(
            f"{where}: unknown source {unknown[0]!r}; the sources are {', '.join(names)}"
        )
    missing = [n for n in names if n not in weights]
    if missing:
        raise ValueError(
            f"{where}: no weight for source {missing[0]!r} (give 0 to leave it out there)"
        )
    try:
        return exact_weights([weights[n] for n in names], names)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def parse_weights(weights: Any, names: Sequence[str]) -> list[tuple[int, tuple[int, ...]]]:
    """``weights`` (a mapping, or pieces ``(step, mapping)`` / ``{"step", "weights"}``) as
    ``[(step, exact integer weights)]``, steps strictly increasing from 0.

    Raises:
        ValueError: naming the piece and the source for an unknown or missing source, a
            negative weight, weights summing to 0, or steps not increasing from 0.
    """
    if weights is None:
        raise ValueError(
            f"a mixture needs weights: {{name: weight}} for the sources {', '.join(names)}, "
            "or a schedule [(step, {name: weight}), ...]"
        )
    if isinstance(weights, Mapping):
        return [(0, _piece_weights("weights", weights, names))]
    if isinstance(weights, str | bytes) or not isinstance(weights, Sequence) or not weights:
        raise ValueError(f"weights must be a mapping or a non-empty list of pieces, got "
                         f"{weights!r}")  # fmt: skip
    out: list[tuple[int, tuple[int, ...]]] = []
    for j, piece in enumerate(weights):
        if isinstance(piece, Mapping) and set(piece) == {"step", "weights"}:
            step, w = piece["step"], piece["weights"]
        elif isinstance(piece, Sequence) and not isinstance(piece, str) and len(piece) == 2:
            step, w = piece
        else:
            raise ValueError(
                f"schedule piece {j}: expected (step, {{name: weight}}) or "
                f"{{'step': ..., 'weights': {{...}}}}, got {piece!r}"
            )
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < ROW_LIMIT:
            raise ValueError(
                f"schedule piece {j}: step must be an integer in [0, 2**63), got {step!r:.60}"
            )
        if j == 0 and step != 0:
            raise ValueError(f"schedule piece 0 must start at step 0, got step {step}")
        if out and step <= out[-1][0]:
            raise ValueError(
                f"schedule piece {j}: steps must increase, got {step} after {out[-1][0]}"
            )
        out.append((step, _piece_weights(f"schedule piece {j} (step {step})", w, names)))
    return out


class Schedule:
    """Random access into a list of pieces (``pieces[0]`` starts at step 0, row 0).

    Args:
        pieces: the pieces, in order, rows strictly increasing.
    """

    def __init__(self, pieces: Sequence[SchedulePiece]) -> None:
        assert pieces and pieces[0].row == 0
        self.pieces = tuple(pieces)
        self.starts = [p.row for p in pieces]
        self._starts = np.asarray(self.starts, dtype=np.int64)
        self.parts = [Interleave(p.weights) for p in pieces]
        k = len(pieces[0].weights)
        base = [np.zeros(k, dtype=np.int64)]
        for j in range(1, len(pieces)):
            base.append(base[-1] + self.parts[j - 1].counts(self.starts[j] - self.starts[j - 1]))
        self.base = base

    def piece_at(self, row: int) -> int:
        """Index of the piece holding global row ``row``."""
        return bisect.bisect_right(self.starts, row) - 1

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Source and index inside that source of every global row in ``rows`` (int64)."""
        if len(self.pieces) == 1:
            return self.parts[0].locate(rows)
        src = np.empty(len(rows), dtype=np.int64)
        idx = np.empty(len(rows), dtype=np.int64)
        for j, sel, local in self._by_piece(rows):
            s, i = self.parts[j].locate(local)
            src[sel], idx[sel] = s, i + self.base[j][s]
        return src, idx

    def block(self, row: int, n: int) -> tuple[Block, int] | None:
        """Global rows ``[row, row + n)`` by source (:meth:`Interleave.block`: the block
        and its periods ``q``, indices counted from the schedule's start); None where they
        span two pieces."""
        if len(self.parts) == 1:  # mostly: the cached block as it is
            return self.parts[0].block(row, n)
        j = self.piece_at(row)
        if j + 1 < len(self.starts) and row + n > self.starts[j + 1]:
            return None
        b, q = self.parts[j].block(row - self.starts[j], n)
        if j:
            base = self.base[j].tolist()
            firsts = [f + x for f, x in zip(b.firsts, base, strict=True)]
            b = b._replace(firsts=firsts)
        return b, q

    def counts(self, row: int) -> np.ndarray:
        """Rows of each source among global rows ``[0, row)`` (int64 [K])."""
        j = self.piece_at(row)
        return self.base[j] + self.parts[j].counts(row - self.starts[j])

    def source_counts(self, source: int, rows: np.ndarray) -> np.ndarray:
        """Rows of ``source`` among global rows ``[0, rows[k])``, for every k (int64):
        :meth:`counts` of one source at many rows at once."""
        if len(self.pieces) == 1:
            return self.parts[0].source_counts(source, rows)
        out = np.empty(len(rows), dtype=np.int64)
        for j, sel, local in self._by_piece(rows):
            out[sel] = self.base[j][source] + self.parts[j].source_counts(source, local)
        return out

    def _by_piece(self, rows: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """For each piece holding some of ``rows``: its index, which of ``rows`` it holds
        (a mask), and those rows counted from the piece's start."""
        which = np.searchsorted(self._starts, rows, side="right") - 1
        for j in np.unique(which).tolist():
            sel = which == j
            yield j, sel, rows[sel] - self.starts[j]

    def row_of(self, source: int, index: int) -> int | None:
        """The global row of ``source``'s ``index``-th row; None if the schedule never
        reaches it (the source's weight is 0 from some piece on)."""
        for j in range(len(self.pieces)):
            last = j + 1 == len(self.pieces)
            if not last and index >= self.base[j + 1][source]:
                continue
            r = self.parts[j].row_of(source, index - int(self.base[j][source]))
            return None if r is None else self.starts[j] + r
        return None
