"""What every reader source keeps the same way: its open stores and its fingerprint.

Both sources (packed shards, raw text) read objects under a few roots through
:mod:`wdstream.storage`. A :class:`StoreCache` opens each root's store once, closes them
together, and pickles empty, so torch workers open their own connections and file maps.
With ``cache_dir`` among the options, remote stores read through the node-local block cache
(:mod:`wdstream.storage.cache`) that every worker and rank of the node shares.
"""

from __future__ import annotations

import hashlib
from typing import Any

from wdstream.storage import Store, open_store
from wdstream.storage.cache import CachedStore, parse_cache_limit
from wdstream.storage.local import LocalStore

__all__ = ["CACHE_OPTIONS", "StoreCache", "fingerprint"]

CACHE_OPTIONS = ("cache_dir", "cache_limit")  # the node cache's, not a store's


class StoreCache:
    """One :class:`Store` per root, opened on first use with ``options``.

    ``cache_dir`` and ``cache_limit`` (default ``"50GB"``) are taken out of the options:
    remote roots are then wrapped in a :class:`~wdstream.storage.cache.CachedStore`; local
    roots are read directly (the cache would only copy local disk to local disk).
    """

    def __init__(self, **options: Any) -> None:
        self.options = options
        self._stores: dict[str, Store] = {}
        rest = dict(options)
        self._cache_dir: str | None = rest.pop("cache_dir", None)
        self._cache_limit = parse_cache_limit(rest.pop("cache_limit", "50GB"))  # fail early
        if "cache_limit" in options and self._cache_dir is None:
            raise ValueError("cache_limit needs cache_dir (the node-local folder to cache in)")
        self._open_options = rest

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}  # stores hold handles and connections: not sent

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["options"])  # type: ignore[misc]

    def get(self, root: str) -> Store:
        """The store of ``root``."""
        store = self._stores.get(root)
        if store is None:
            store = open_store(root, **self._open_options)
            if self._cache_dir is not None and not isinstance(store, LocalStore):
                store = CachedStore(store, self._cache_dir, self._cache_limit)
            self._stores[root] = store
        return store

    def url(self, root: str, name: str) -> str:
        """Full URL of object ``name`` under ``root``, for messages."""
        return self.get(root).child_url(name)

    def close(self) -> None:
        """Release every store's cached file handles / connections."""
        stores, self._stores = self._stores, {}
        for store in stores.values():
            store.close()


def fingerprint(ident: Any) -> str:
    """16 hex digits identifying a source's contents (names, sizes, hashes) for its states."""
    return hashlib.sha256(repr(ident).encode()).hexdigest()[:16]
