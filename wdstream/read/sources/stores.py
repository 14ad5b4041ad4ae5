"""What every reader source keeps the same way: its open stores and its shard URLs.

Both sources (packed shards, raw text) read objects under a few roots through
:mod:`wdstream.storage`. A :class:`StoreCache` opens each root's store once, closes them
together, and pickles empty, so torch workers open their own connections and file maps.
With ``cache_dir`` among the options, remote stores read through the node-local block cache
(:mod:`wdstream.storage.cache`) that every worker and rank of the node shares.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import braceexpand

from wdstream.storage import Store, open_store
from wdstream.storage.cache import CachedStore, parse_cache_limit
from wdstream.storage.local import LocalStore
from wdstream.storage.urls import has_wildcard, join_url, split_url

__all__ = ["CACHE_OPTIONS", "StoreCache", "expand_urls"]

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


def expand_urls(source: str | Sequence[str], **store_options: Any) -> list[str]:
    """Expand brace patterns (``a-{000..009}.tar``) and wildcards in file names (``*.tar``).

    Wildcards match the names a store lists in the pattern's folder (local, S3; plain HTTP
    cannot list and says so), sorted; a wildcard that matches nothing is an error. The
    ``?`` of an http(s) URL starts its query string, never a wildcard (see storage/urls.py).

    Raises:
        FileNotFoundError: if a wildcard pattern matches no object.
    """
    items = [source] if isinstance(source, str) else list(source)
    urls: list[str] = []
    for url in (u for item in items for u in braceexpand.braceexpand(item)):
        root, name = split_url(url)
        if not has_wildcard(name):
            urls.append(url)
            continue
        listing = {k: v for k, v in store_options.items() if k not in CACHE_OPTIONS}
        store = open_store(root, **listing)
        try:
            names = fnmatch.filter(store.list(), name)
        finally:
            store.close()
        if not names:
            raise FileNotFoundError(f"{url}: no shard matches this pattern")
        urls += [join_url(root, n) for n in names]
    return urls
