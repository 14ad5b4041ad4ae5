"""Markdown tables and number formatting for the report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Goal:
    """One goal judged in a section of the report (collected for the summary table)."""

    name: str
    measured: str  # median (min–max), or "not measured"
    want: str  # "≥ 0.95x", "≤ 2.0 s"
    met: bool | None  # None: not measured


JUDGED: list[Goal] = []  # every goal() call since the report began (report.render resets it)


def goal(
    name: str,
    value: Spread | None,
    want: float,
    at_most: bool = False,
    unit: str = "x",
    digits: int = 2,
) -> str:
    """``"0 workers 0.92x (0.88–0.97) (goal ≥ 1.0x: NOT met)"``, judged on the median;
    ``unit`` follows the numbers (``"x"`` for a ratio, ``" µs"``, ``" s"``). Also recorded
    in :data:`JUDGED` for the report's summary of goals."""
    sign = "≤" if at_most else "≥"
    wanted = f"{sign} {want}{unit}"
    if value is None:
        JUDGED.append(Goal(name, "not measured", wanted, None))
        return f"{name}: not measured"
    met = value.mid <= want if at_most else value.mid >= want
    JUDGED.append(Goal(name, value.fmt(unit, digits), wanted, met))
    return f"{name} {value.fmt(unit, digits)} (goal {wanted}: {'met' if met else 'NOT met'})"


def millions(v: float | None) -> float | None:
    return None if v is None else v / 1e6


def ms(v: float | None) -> float | None:
    return None if v is None else v * 1000
