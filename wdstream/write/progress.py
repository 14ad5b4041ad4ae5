"""Progress bar for ``pack``: tqdm with MB/s, docs/s and tokens/s, only when asked.

Given the inputs' total size (``DocumentReader.source_total``) tqdm also shows the
percentage and an ETA; the position is then the bytes read *as stored*
(``DocumentReader.source_bytes``: compressed bytes for ``.gz``/``.zst``), so the two match.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Progress"]


class Progress:
    """tqdm bar with docs/s, tokens/s and MB/s, only when asked (a terminal).

    Args:
        enabled: show a bar at all; when False every method does nothing.
        total: bytes the positions passed to :meth:`update` count up to, if known (stdin
            has no size); with it tqdm shows a percentage and an ETA.
    """

    def __init__(self, enabled: bool, total: int | None = None) -> None:
        self._bar: Any = None
        self._docs = self._tokens = 0
        self._t0 = time.perf_counter()
        self._last = 0
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                desc="pack",
                dynamic_ncols=True,
            )

    def update(self, position: int, docs: int, tokens: int) -> None:
        """Move the bar to ``position`` input bytes, adding ``docs`` and ``tokens`` packed."""
        if self._bar is None:
            return
        self._docs += docs
        self._tokens += tokens
        self._bar.update(position - self._last)
        self._last = position
        dt = max(time.perf_counter() - self._t0, 1e-9)
        self._bar.set_postfix_str(
            f"{self._docs / dt:,.0f} docs/s {self._tokens / dt:,.0f} tok/s", refresh=False
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
