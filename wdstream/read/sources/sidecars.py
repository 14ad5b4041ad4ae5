"""A packed source's shard sidecars: read where a shard is first read, checked, kept.

A :class:`~wdstream.read.sources.packed.ShardSource` plans from ``index.json`` alone; a
shard's ``.idx`` sidecar (each sample's byte span, tokens and CRC32C) is read only when
the shard's samples are. :class:`ShardSidecars` reads it once (or, without one, scans the
tar), checks it against the shard's index entry, and keeps it with the prefix sums of its
token counts in a per-process LRU of ``limit`` shards (~16 B a sample each).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from wdstream.format.index import DatasetIndex, ShardEntry
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.sources.damage import scanned_sidecar
from wdstream.read.sources.fetches import stoppable
from wdstream.read.sources.shards import parse_sidecar
from wdstream.read.sources.stores import StoreCache
from wdstream.read.sources.vouch import refuse_missing_sidecar

__all__ = ["ShardSidecars", "SidecarEntry"]

SidecarEntry = tuple[ShardSidecar, np.ndarray]  # a sidecar, its tokens' prefix sums [0, ...]


class ShardSidecars:
    """The sidecars of a packed source's shards, by shard number.

    Args:
        stores: the source's stores.
        urls: ``(root, name)`` of each shard.
        names: each shard's sidecar name (beside it).
        index: the dataset's index (None: shards opened by URL without one).
        entries: each shard's entry in ``index``.
        checksums: whether the source verifies samples (a sidecar without checksums then
            warns once that its samples are read unchecked).
        where: a shard's URL, for messages.
        limit: the shards whose sidecars stay in memory.
    """

    def __init__(
        self,
        stores: StoreCache,
        urls: Sequence[tuple[str, str]],
        names: Sequence[str],
        index: DatasetIndex | None,
        entries: Sequence[ShardEntry] | None,
        checksums: bool,
        where: Callable[[int], str],
        limit: int,
    ) -> None:
        self._stores = stores
        self._urls = urls
        self._names = names
        self._index = index
        self._entries = entries
        self._checksums = checksums
        self._where = where
        self._limit = limit
        self._unchecked_warned = False
        self._cache: OrderedDict[int, SidecarEntry] = OrderedDict()
        self._lock = threading.Lock()
        self._outside: Callable[[], bool] | None = None  # see stop_when

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """The shards whose sidecars are in memory."""
        return len(self._cache)

    def get(self, shard: int) -> SidecarEntry:
        """The sidecar of ``shard`` and its token prefix sums (read on a miss).

        Raises:
            CorruptShardError, OSError: it cannot be read, or fails its checks.
        """
        with self._lock:
            hit = self._cache.get(shard)
            if hit is not None:
                self._cache.move_to_end(shard)
                return hit
        if self._outside is not None:
            return stoppable(lambda: self.load(shard)[0], self._outside)
        return self.load(shard)[0]

    def stop_when(self, outside: Callable[[], bool] | None) -> None:
        """Make a miss's read (:meth:`get`) end with ``CancelledError`` once ``outside()`` is
        true, the read left to end on its own (:func:`~wdstream.read.sources.fetches.stoppable`).

        A torch worker's: a window's metadata (a docs-mode pack's token counts) needs its
        shards' sidecars, read in the worker's own thread where it picks the windows to read
        ahead, outside any window read's stop; a stalled sidecar GET there held the worker
        past the training process's ``break`` until torch killed it (5 s). None: read in line."""
        self._outside = outside

    def held(self, shard: int) -> SidecarEntry | None:
        """The sidecar of ``shard`` if it is in memory (no read, the LRU order left)."""
        with self._lock:
            return self._cache.get(shard)

    def load(self, shard: int) -> tuple[SidecarEntry, str]:
        """Read shard ``shard``'s sidecar (or scan the tar without one) into the cache;
        returns the cache entry and the sha256 of the bytes read (sidecar, else tar)."""
        root, name = self._urls[shard]
        store = self._stores.get(root)
        index_entry = self._entries[shard] if self._entries is not None else None
        try:
            version = self._index.version if self._index is not None else None
            sidecar, sha = parse_sidecar(store, self._names[shard], index_entry, version)
        except FileNotFoundError:
            refuse_missing_sidecar(self._index, store.child_url(self._names[shard]))
            sidecar, sha = scanned_sidecar(store.read(name), self._where(shard))
        if sidecar.crc32c is None and self._checksums and not self._unchecked_warned:
            self._unchecked_warned = True
            warnings.warn(
                f"{self._where(shard)}: format v1 shard (or no sidecar): samples carry no "
                "checksum and are read unchecked; repack with this wdstream to get per-sample "
                "CRC32C checks",
                stacklevel=2,
            )
        entry = (sidecar, np.concatenate([[0], np.cumsum(sidecar.tokens, dtype=np.int64)]))
        with self._lock:
            self._cache[shard] = entry
            while len(self._cache) > self._limit:
                self._cache.popitem(last=False)
        return entry, sha
