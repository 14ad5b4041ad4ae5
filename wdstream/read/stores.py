"""What every reader source keeps the same way: its open stores and its fingerprint.

Both sources (packed shards, raw text) read objects under a few roots through
:mod:`wdstream.storage`. A :class:`StoreCache` opens each root's store once, closes them
together, and pickles empty, so torch workers open their own connections and file maps.
"""

from __future__ import annotations

import hashlib
from typing import Any

from wdstream.storage import Store, open_store

__all__ = ["StoreCache", "fingerprint"]


class StoreCache:
    """One :class:`Store` per root, opened on first use with ``options``."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self._stores: dict[str, Store] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}  # stores hold handles and connections: not sent

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state["options"])  # type: ignore[misc]

    def get(self, root: str) -> Store:
        """The store of ``root``."""
        store = self._stores.get(root)
        if store is None:
            store = self._stores[root] = open_store(root, **self.options)
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
