"""The one interface between wdstream and where bytes live (local disk, S3, HTTP).

Writers and readers only ever talk to a :class:`Store` rooted at a dataset location, by
*relative names* (``"data-000000.tar"``, ``"index.json"``). Adding a backend means
implementing this class; nothing above it changes.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import BinaryIO

__all__ = ["Store"]


class Store(abc.ABC):
    """A flat namespace of immutable objects under one root URL.

    Writes are atomic: an object appears under its final name only once it is complete,
    so a reader (or a rerun of an interrupted pack) never sees half of one.
    """

    url: str  # the root, for messages

    @abc.abstractmethod
    def read(self, name: str) -> bytes:
        """Return the whole object. Raises FileNotFoundError if it does not exist."""

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
