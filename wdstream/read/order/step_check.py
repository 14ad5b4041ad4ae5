"""The one check every global step argument goes through (no torch: ``explain`` uses it).

``batch_at`` of one dataset and of a mixture, ``global_batch_at``, ``explain``,
``explain_mixture`` and the steps of a mixture's weight schedule all take steps from users;
each passes them through :func:`check_step`, so a bad step gets the same clear error
everywhere instead of an ``OverflowError`` in one place and a wrong batch in another.
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["ROW_LIMIT", "check_step"]

# Rows of a run are numbered with int64 (numpy, torch, the state's positions), so a step
# whose rows, counted from the run's origin, pass 2**63 is no step a run can reach.
ROW_LIMIT = 1 << 63


def check_step(step: Any, origin_step: int, origin_row: int, global_batch: int) -> int:
    """``step`` as a global step a run counting from ``(origin_step, origin_row)`` in steps of
    ``global_batch`` rows can reach, the one check every place a step enters goes through
    (``batch_at`` of one dataset and of a mixture, ``global_batch_at``, ``explain``).

    A bool, float or string is refused even where Python would accept it as an index
    (``True`` is not step 1); a step before the origin, or one whose last row passes
    ``ROW_LIMIT`` counted from the origin, is refused with the range that is valid.

    Raises:
        TypeError: ``step`` is not an integer.
        ValueError: ``step`` is outside ``[origin_step, last]``.
    """
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step must be an integer, got {type(step).__name__} {step!r:.60}")
    step = int(step)
    last = origin_step + (ROW_LIMIT - origin_row) // global_batch - 1
    if not origin_step <= step <= last:
        raise ValueError(
            f"step {step} is outside the steps this run can reach, [{origin_step}, {last}] "
            f"(from its origin step {origin_step}, {global_batch} rows a step, rows numbered "
            "below 2**63)"
        )
    return step
