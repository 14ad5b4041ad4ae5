"""Where the tokens of a shard's samples lie in its bytes, searched once and kept.

A sample written by ``wdstream pack`` holds its token array at a fixed place in its msgpack
bytes, so a reader can view the tokens in place instead of unpacking each sample
(:func:`~wdstream.format.sample.find_token_spans` checks the layout). Searching a window's
pieces anew on every read cost more than copying their rows, so the spans are kept per
shard (the last ``limit`` shards read, per process).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from wdstream.format.sample import TokenSpans, find_token_spans
from wdstream.format.sidecar import ShardSidecar

__all__ = ["FEW", "KeptLayouts"]

FEW = 16  # a read of at most this many samples searches only them (KeptLayouts.of_local)


class KeptLayouts:
    """The token spans of the shards read last (None for a shard not in the writer's layout).

    Shards are immutable, and a span is only kept when the samples' bytes have the writer's
    layout, checked by :func:`find_token_spans` (the 13-byte ``dtype`` field must follow
    each sample's tokens exactly); a kept span is only used on bytes that pass their
    checksums like any other read.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept: OrderedDict[int, TokenSpans | None] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"_limit": self._limit}  # spans and the lock are per process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_limit"])  # type: ignore[misc]

    def _get(self, shard: int) -> tuple[bool, TokenSpans | None]:
        with self._lock:
            found = shard in self._kept
            layout = self._kept.get(shard)
            if found:
                self._kept.move_to_end(shard)
        return found, layout

    def _keep(self, shard: int, layout: TokenSpans | None) -> None:
        with self._lock:
            self._kept[shard] = layout
            self._kept.move_to_end(shard)
            while len(self._kept) > self._limit:
                self._kept.popitem(last=False)

    def of_local(
        self,
        shard: int,
        sidecar: ShardSidecar,
        a: int,
        b: int,
        begin: int,
        whole: Callable[[int], memoryview],
    ) -> TokenSpans | None:
        """Spans of samples ``[a, b)`` read from shard byte ``begin``: a local shard is
        searched once, whole (``whole(end)`` maps its first ``end`` bytes), and every read
        of it is a view of the same mapped bytes.

        The first read of a shard, when it holds few of its samples (under a quarter: the
        first batch's, read alone while the window loads), searches only those, as a remote
        read does, so a fresh loader's first batch does not wait for whole shards to be
        searched (~1 ms a shard of 8 MB); so does every read of at most ``FEW`` samples
        (the first batch's 8 samples, read alone, often hold two of one shard: the second
        searched the whole shard, 1-2.5 ms each, before the first batch). The next larger
        read searches the shard whole. (Searching every small read's samples instead cost
        a torch worker, whose window pieces are all under a quarter of a shard, ~0.3x of
        its read rate in the bench's first epochs.)"""
        found, layout = self._get(shard)
        if found and layout is not None and bool((layout.start[a:b] >= 0).all()):
            return layout.shifted(a, b, begin)
        if found and layout is None:
            return None  # searched whole: not in the writer's layout
        n = len(sidecar)
        if (not found or b - a <= FEW) and (b - a) * 4 < n:
            end = sidecar.byte_range(a, b)[1]
            spans = self.of_remote(shard, sidecar, a, b, whole(end), 0)
            return None if spans is None else spans.shifted(0, b - a, begin)
        end = sidecar.byte_range(0, n)[1] if n else 0
        layout = find_token_spans(whole(end), sidecar.offsets.astype(np.int64), sidecar.sizes)
        self._keep(shard, layout)
        return None if layout is None else layout.shifted(a, b, begin)

    def of_remote(
        self, shard: int, sidecar: ShardSidecar, a: int, b: int, buf: memoryview, begin: int
    ) -> TokenSpans | None:
        """Spans of samples ``[a, b)`` in ``buf`` (shard bytes from ``begin``): a remote shard
        is never read whole, so each read searches the samples it is the first to hold (a
        kept start of -1 marks one not searched yet), and their spans join the shard's kept
        layout: later reads (the next epoch, a node cache's local-speed reads) skip the
        search."""
        _, layout = self._get(shard)
        if layout is not None and bool((layout.start[a:b] >= 0).all()):
            return layout.shifted(a, b, begin)
        offsets = sidecar.offsets[a:b].astype(np.int64) - begin
        spans = find_token_spans(buf, offsets, sidecar.sizes[a:b])
        if spans is None:
            return None
        with self._lock:
            layout = self._kept.get(shard)
            if layout is None or layout.dtype != spans.dtype:
                n = len(sidecar)
                layout = TokenSpans(np.full(n, -1, np.int64), np.zeros(n, np.int64), spans.dtype)
            layout.start[a:b] = spans.start + begin
            layout.count[a:b] = spans.count
        self._keep(shard, layout)
        return spans
