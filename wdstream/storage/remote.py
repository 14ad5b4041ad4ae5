"""The read path every object store shares: whole and ranged GETs through the retrier.

A backend supplies ``_fetch(name, start, end)`` (one request, returning the promised length
and the body's chunks); this class turns it into ``read``/``read_range`` that resume from
the last byte received after a failure (see ``retry.Retrier.read``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable

from wdstream.storage.base import Store
from wdstream.storage.retry import Retrier

__all__ = ["RemoteStore"]


class RemoteStore(Store):
    """A :class:`Store` whose reads are retried, resumable requests."""

    _retrier: Retrier

    @abc.abstractmethod
    def _fetch(self, name: str, start: int, end: int | None) -> tuple[int, Iterable[bytes]]:
        """Issue one GET for ``[start, end)``; return the promised byte count and the chunks."""

    def read(self, name: str) -> bytes:
        return self._retrier.read(
            lambda a, b: self._fetch(name, a, b), self.child_url(name), 0, None
        )

    def read_range(self, name: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise ValueError(f"bad byte range [{start}, {end}) of {self.child_url(name)}")
        if end == start:
            return b""
        return self._retrier.read(
            lambda a, b: self._fetch(name, a, b), self.child_url(name), start, end
        )
