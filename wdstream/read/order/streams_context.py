"""The interface between ``TokenDataset`` and a source kind's per-rank token streams.

``TokenDataset`` serves ``streams`` cursors round-robin for two kinds of source: packed shards
(:class:`wdstream.read.order.streams.ReaderContext`) and raw text tokenised on the fly
(:class:`wdstream.read.order.text_streams.TextContext`). Both implement :class:`StreamContext`,
whose streams implement :class:`Stream`; this module writes that contract down, with the
configuration both take and the copy both use to cut rows out of a window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

__all__ = ["ReaderConfig", "Stream", "StreamContext", "copy_window"]


@dataclass(frozen=True)
class ReaderConfig:
    """Everything that determines the batch order (all of it goes into the state's config)."""

    seq_len: int
    batch_size: int
    shuffle: bool
    seed: int
    rank: int
    world_size: int
    streams: int
    shuffle_window: int
    shuffle_lanes: int
    chunk_batches: int
    doc_boundaries: bool


def copy_window(
    tokens: np.ndarray,
    doc_start: np.ndarray | None,
    pos: int,
    flat: np.ndarray,
    flat_ds: np.ndarray | None,
    o: int,
    stop: int,
) -> int:
    """Copy a window's tokens from ``pos`` into ``flat[o:stop]`` (and its doc starts into
    ``flat_ds``) as far as the window reaches; returns how many (0: the window is used up)."""
    take = max(0, min(stop - o, len(tokens) - pos))
    flat[o : o + take] = tokens[pos : pos + take]
    if flat_ds is not None:
        assert doc_start is not None
        flat_ds[o : o + take] = doc_start[pos : pos + take]
    return take


class Stream(Protocol):
    """One resumable token stream: rows written batch by batch, a cursor after each."""

    def cursor(self) -> dict[str, int]:
        """The position after the last batch produced (JSON-serialisable)."""
        ...

    def fill(
        self, tokens: np.ndarray, doc_start: np.ndarray | None, n: int
    ) -> list[dict[str, int]]:
        """Write the next ``n`` batches into ``tokens``; the cursor after each (fewer when
        the stream's epoch ends early, raw text only)."""
        ...

    def close(self) -> None:
        """Drop buffers and wait for any read-ahead."""
        ...


class StreamContext(Protocol):
    """Per-process pieces of one source kind, shared by its streams."""

    @property
    def cursor_keys(self) -> tuple[str, ...]:
        """The keys of a cursor, in order."""
        ...

    @property
    def lockstep(self) -> bool:
        """True when every stream yields the same batches per epoch (turns can be checked)."""
        ...

    def start_cursor(self, epoch: int = 0) -> dict[str, int]:
        """The cursor at the start of ``epoch``."""
        ...

    def stream(self, stream: int, cursor: dict[str, int]) -> Stream:
        """Stream number ``stream`` resumed at ``cursor``."""
        ...

    def config(self) -> dict[str, Any]:
        """State config keys of this source kind (beyond the shared ones)."""
        ...

    def chunk_size(self, cursor: dict[str, int]) -> int:
        """Batches in the next chunk of a stream at ``cursor``."""
        ...

    def batches_per_stream(self, epoch: int) -> int:
        """Batches every stream yields in ``epoch`` (TypeError where unknown in advance)."""
        ...

    def check_cursor(self, stream: int, cursor: dict[str, int]) -> None:
        """Raise StateMismatchError unless ``cursor`` is a position stream ``stream`` reaches."""
        ...

    def lead(self, workers: int) -> None:
        """This process, worker 0 of ``workers``, makes the iteration's first chunk (the
        first batch waits for it alone): its first fill may use all the workers' threads."""
        ...
