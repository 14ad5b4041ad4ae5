"""Progress bar for ``pack``: tqdm with MB/s, docs/s and tokens/s, only when asked."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Progress"]


class Progress:
    """tqdm bar with docs/s, tokens/s and MB/s, only when asked (a terminal)."""

    def __init__(self, enabled: bool) -> None:
        self._bar: Any = None
        self._docs = self._tokens = 0
        self._t0 = time.perf_counter()
        self._last = 0
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                unit="B", unit_scale=True, unit_divisor=1000, desc="pack", dynamic_ncols=True
            )

    def update(self, input_bytes: int, docs: int, tokens: int) -> None:
        if self._bar is None:
            return
        self._docs += docs
        self._tokens += tokens
        self._bar.update(input_bytes - self._last)
        self._last = input_bytes
        dt = max(time.perf_counter() - self._t0, 1e-9)
        self._bar.set_postfix_str(
            f"{self._docs / dt:,.0f} docs/s {self._tokens / dt:,.0f} tok/s", refresh=False
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
