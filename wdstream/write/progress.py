"""Progress of ``pack``: a tqdm bar on a terminal, periodic one-line reports elsewhere.

Given the inputs' total size (``DocumentReader.source_total``) tqdm also shows the
percentage and an ETA; the position is then the bytes read *as stored*
(``DocumentReader.source_bytes``: compressed bytes for ``.gz``/``.zst``), so the two match.

Off a terminal (a Slurm or CI log) a bar's carriage returns make one endless line that
appears only when the pack ends, so there a line is printed every
``WDSTREAM_PROGRESS_SECONDS`` (default 10) seconds instead.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from wdstream.words import count

__all__ = ["Progress", "wanted"]

_DEFAULT_SECONDS = 10.0


def wanted(progress: bool | None) -> bool:
    """Whether ``pack`` reports progress: ``progress`` if given, else when stderr is a
    terminal or the environment asks for it (``WDSTREAM_PROGRESS=1``)."""
    if progress is not None:
        return progress
    return sys.stderr.isatty() or os.environ.get("WDSTREAM_PROGRESS", "") == "1"


def _period() -> float:
    """Seconds between progress lines off a terminal (``WDSTREAM_PROGRESS_SECONDS``)."""
    value = os.environ.get("WDSTREAM_PROGRESS_SECONDS", "")
    try:
        return max(0.0, float(value)) if value else _DEFAULT_SECONDS
    except ValueError:
        raise ValueError(
            f"WDSTREAM_PROGRESS_SECONDS must be a number of seconds, got {value!r}"
        ) from None


class Progress:
    """Docs/s, tokens/s and MB/s of a pack, only when asked: a tqdm bar on a terminal,
    else a line every few seconds.

    Args:
        enabled: report at all; when False every method does nothing.
        total: bytes the positions passed to :meth:`update` count up to, if known (stdin
            has no size); with it tqdm shows a percentage and an ETA.
        shards: how many shards are committed so far (for the lines off a terminal).
    """

    def __init__(
        self, enabled: bool, total: int | None = None, shards: Callable[[], int] | None = None
    ) -> None:
        self._bar: Any = None
        self._lines = False
        self._docs = self._tokens = 0
        self._t0 = self._printed = time.perf_counter()
        self._last = 0
        self._total = total
        self._shards = shards
        if enabled and not sys.stderr.isatty():
            self._lines, self._period = True, _period()
        elif enabled:
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
        """Move to ``position`` input bytes, adding ``docs`` and ``tokens`` packed."""
        if self._bar is None and not self._lines:
            return
        self._docs += docs
        self._tokens += tokens
        now = time.perf_counter()
        dt = max(now - self._t0, 1e-9)
        if self._lines:
            self._last = position
            if now - self._printed >= self._period:
                self._printed = now
                print(self._line(dt), file=sys.stderr, flush=True)
            return
        self._bar.update(position - self._last)
        self._last = position
        self._bar.set_postfix_str(
            f"{self._docs / dt:,.0f} docs/s {self._tokens / dt:,.0f} tok/s", refresh=False
        )

    def _line(self, seconds: float) -> str:
        """One report: documents, tokens, input MB/s, shards, and the share read if known."""
        done = f" ({100 * self._last / self._total:.0f} %)" if self._total else ""
        shards = f", {count(self._shards(), 'shard')}" if self._shards is not None else ""
        return (
            f"pack: {seconds:,.1f} s{done}: {count(self._docs, 'document')}, "
            f"{count(self._tokens, 'token')}, {self._last / 1e6 / seconds:,.1f} MB/s{shards}"
        )

    def close(self) -> None:
        """Close the bar (a terminal); nothing to close for lines."""
        if self._bar is not None:
            self._bar.close()
