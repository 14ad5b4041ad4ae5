"""Markdown tables and number formatting for the report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchlib.rounds import Spread


def cell(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, Spread):
        return v.fmt()
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v).replace("|", "\\|")


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def goal(name: str, value: Spread | None, want: float, at_most: bool = False) -> str:
    """``"0 workers 0.92x (0.88–0.97) (goal ≥ 1.0x: NOT met)"``, judged on the median."""
    if value is None:
        return f"{name}: not measured"
    met = value.mid <= want if at_most else value.mid >= want
    sign = "≤" if at_most else "≥"
    return f"{name} {value.fmt()} (goal {sign} {want}x: {'met' if met else 'NOT met'})"


def millions(v: float | None) -> float | None:
    return None if v is None else v / 1e6


def ms(v: float | None) -> float | None:
    return None if v is None else v * 1000
