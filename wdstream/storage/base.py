"""The one interface between wdstream and where bytes live (local disk, S3, HTTP).

Writers and readers only ever talk to a :class:`Store` rooted at a dataset location, by
*relative names* (``"data-000000.tar"``, ``"index.json"``). Adding a backend means
implementing this class; nothing above it changes. :class:`ForwardingStore` wraps a store
and changes only what it overrides (the node cache, the writer's full-disk messages).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO

__all__ = ["ForwardingStore", "Store"]


class Store(abc.ABC):
    """A flat namespace of immutable objects under one root URL.

    Writes are atomic: an object appears under its final name only once it is complete,
    so a reader (or a rerun of an interrupted pack) never sees half of one.
    """

    url: str  # the root, for messages

    @abc.abstractmethod
    def read(self, name: str) -> bytes:
        """Return the whole object. Raises FileNotFoundError if it does not exist."""

    def read_by_digest(self, name: str, sha256: str) -> bytes:
        """The whole object ``name``, which the caller expects to hash to ``sha256`` (a
        sidecar named by index.json): a node cache keeps such objects by that digest, so
        the node's ranks and workers fetch each once. The caller still checks the digest."""
        return self.read(name)

    @abc.abstractmethod
    def read_range(self, name: str, start: int, end: int) -> bytes:
        """Return bytes ``[start, end)`` of the object (fewer only if the object is shorter)."""

    def read_range_view(self, name: str, start: int, end: int) -> memoryview:
        """Like :meth:`read_range`, but may return a zero-copy view (local files: mmap).

        The reader's hot path uses this; the view stays valid as long as it is referenced.
        """
        return memoryview(self.read_range(name, start, end))

    def holds_range(self, name: str, start: int, end: int) -> bool:
        """Whether bytes ``[start, end)`` of ``name`` are at hand without a network round
        trip (a node-local cache holding them). Readers issue remote reads concurrently to
        hide their latency, and reads with none to hide one after the other."""
        return False

    def identity(self, name: str) -> str:
        """What tells object ``name`` apart from every other object (the full URL with its
        query string, the endpoint): a cache keys and binds its copies on it. May hold
        secrets (a signed query), so it is hashed, never shown or written out."""
        return self.child_url(name)

    def forget_range(self, name: str, start: int, end: int) -> list[str]:
        """Drop any local copy of bytes ``[start, end)`` of ``name`` so the next read goes to
        the source; returns the files dropped (none for a store that keeps no copies). A
        reader calls it when bytes fail their checksums, before reading them once more."""
        return []

    def read_source_range(self, name: str, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)`` of ``name`` from the source itself, past any local copy:
        the read after :meth:`forget_range` (a copy another thread maps meanwhile cannot
        serve it)."""
        return self.read_range_view(name, start, end)

    @abc.abstractmethod
    def size(self, name: str) -> int:
        """Size in bytes. Raises FileNotFoundError if it does not exist."""

    @abc.abstractmethod
    def exists(self, name: str) -> bool:
        """Whether a complete object with this name exists."""

    @abc.abstractmethod
    def list(self) -> list[str]:
        """Names of all complete objects under the root, sorted."""

    @abc.abstractmethod
    def writer(self, name: str) -> AbstractContextManager[BinaryIO]:
        """Context manager for writing ``name`` atomically.

        The object becomes visible under ``name`` only when the ``with`` block exits
        without an exception; on an exception (or a crash) nothing appears under ``name``.
        """

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove an object if it exists."""

    def write_bytes(self, name: str, data: bytes) -> None:
        """Atomically write a whole object."""
        with self.writer(name) as out:
            out.write(data)

    def create_if_absent(self, name: str, data: bytes) -> None:
        """Write ``data`` as ``name`` unless an object of that name exists (then leave it).

        What the writer lock is built on: the caller reads the object back to learn whose it
        is. This default checks, then writes, which leaves a window of one round trip
        between two writers (plain HTTP has nothing better); backends with a conditional
        write (S3's ``If-None-Match``, a local hard link) override it to be atomic.
        """
        if not self.exists(name):
            self.write_bytes(name, data)

    def lock_path(self, name: str) -> Path | None:
        """The local file of ``name`` when OS advisory locks (``flock``) work on it, else None.

        A lock the kernel holds dies with its process, so a writer lock there needs no
        ``--force-unlock`` after a crash; object stores have no such lock and return None.
        """
        return None

    def iter_chunks(self, name: str, chunk_size: int = 8 << 20) -> Iterator[bytes]:
        """Stream the object in large sequential chunks (for hashing and verification)."""
        total = self.size(name)
        for start in range(0, total, chunk_size):
            yield self.read_range(name, start, min(start + chunk_size, total))

    def child_url(self, name: str) -> str:
        """Full URL of ``name``, for messages."""
        return self.url.rstrip("/") + "/" + name

    def remove_partials(self) -> int:
        """Remove what killed writers left unfinished (local ``.partial`` files, S3 multipart
        uploads); returns how many. Only safe while no other writer is active (the pack lock).
        Stores that leave nothing behind (HTTP PUT is whole or nothing) have nothing to do."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing
        """Release cached handles or connections."""


class ForwardingStore(Store):
    """A store that passes every call to ``inner``; subclasses override what they change."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.url = inner, inner.url

    def read(self, name: str) -> bytes:
        return self.inner.read(name)

    def read_range(self, name: str, start: int, end: int) -> bytes:
        return self.inner.read_range(name, start, end)

    def read_by_digest(self, name: str, sha256: str) -> bytes:
        return self.inner.read_by_digest(name, sha256)

    def read_range_view(self, name: str, start: int, end: int) -> memoryview:
        return self.inner.read_range_view(name, start, end)

    def holds_range(self, name: str, start: int, end: int) -> bool:
        return self.inner.holds_range(name, start, end)

    def identity(self, name: str) -> str:
        return self.inner.identity(name)

    def forget_range(self, name: str, start: int, end: int) -> list[str]:
        return self.inner.forget_range(name, start, end)

    def read_source_range(self, name: str, start: int, end: int) -> memoryview:
        return self.inner.read_source_range(name, start, end)

    def size(self, name: str) -> int:
        return self.inner.size(name)

    def exists(self, name: str) -> bool:
        return self.inner.exists(name)

    def list(self) -> list[str]:
        return self.inner.list()

    def writer(self, name: str) -> AbstractContextManager[BinaryIO]:
        return self.inner.writer(name)

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def write_bytes(self, name: str, data: bytes) -> None:
        self.inner.write_bytes(name, data)

    def create_if_absent(self, name: str, data: bytes) -> None:
        self.inner.create_if_absent(name, data)

    def lock_path(self, name: str) -> Path | None:
        return self.inner.lock_path(name)

    def iter_chunks(self, name: str, chunk_size: int = 8 << 20) -> Iterator[bytes]:
        return self.inner.iter_chunks(name, chunk_size)

    def child_url(self, name: str) -> str:
        return self.inner.child_url(name)

    def remove_partials(self) -> int:
        return self.inner.remove_partials()

    def close(self) -> None:
        self.inner.close()
