"""The read path every object store shares: whole and ranged GETs through the retrier.

A backend supplies ``_fetch(name, start, end)`` (one request, returning the promised length
and the body's chunks); this class turns it into ``read``/``read_range`` that resume from
the last byte received after a failure (see ``retry.Retrier.read``).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any

import urllib3

from wdstream.errors import RemoteReadError
from wdstream.storage.base import Store
from wdstream.storage.retry import Fetch, Readable, Retrier, TransientError

__all__ = ["NETWORK_ERRORS", "RemoteStore"]

# Failures of one request that another attempt may heal, whichever client library sent it
# (each backend adds its own library's errors).
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    TransientError,
    urllib3.exceptions.ProtocolError,
    urllib3.exceptions.ReadTimeoutError,
    ConnectionError,
    TimeoutError,
)


class RemoteStore(Store):
    """A :class:`Store` whose reads are retried, resumable requests.

    A backend's clients, sessions and locks belong to the process that made them: it names
    them in ``_process_local``, makes them in ``_setup``, and a copy sent to another process
    (a DataLoader worker, a Ray task) leaves them behind and makes its own.
    """

    _retrier: Retrier
    _process_local: tuple[str, ...] = ()  # attributes ``_setup`` makes, never sent along

    @abc.abstractmethod
    def _setup(self) -> None:
        """Make the per-process state: the retrier, clients or sessions, locks."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in self._process_local:
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    @abc.abstractmethod
    def _fetch(
        self, name: str, start: int, end: int | None
    ) -> tuple[int, Iterable[bytes] | Readable]:
        """Issue one GET for ``[start, end)``; return the promised byte count and the body:
        its chunks, or (only for a range, ``end`` given) a :class:`Readable` that reads into
        the caller's buffer."""

    def read(self, name: str) -> bytes:
        return self._retrier.read(self._one_version(name), self.child_url(name), 0, None)

    def read_range(self, name: str, start: int, end: int) -> bytes:
        return self.read_range_view(name, start, end).tobytes()

    def read_range_view(self, name: str, start: int, end: int) -> memoryview:
        """The bytes in one buffer the body was read into (no chunks joined: the socket
        writes into it, see :mod:`~wdstream.storage.body`), read-only."""
        if start < 0 or end < start:
            raise ValueError(f"bad byte range [{start}, {end}) of {self.child_url(name)}")
        if end == start:
            return memoryview(b"")

        return self._retrier.read_range(
            self._one_version(name), self.child_url(name), start, end
        ).toreadonly()

    def _one_version(self, name: str) -> Fetch:
        """``_fetch`` of ``name`` for the attempts of one read, which must all answer from one
        version of the object (a body's ``version``: its ETag or Last-Modified, where the
        backend gives one): a retry that resumes in another version would splice the two.

        Raises:
            RemoteReadError: naming the object, the byte offset and both versions.
        """
        seen: list[object] = []

        def fetch(a: int, b: int | None) -> tuple[int, Iterable[bytes] | Readable]:
            promised, body = self._fetch(name, a, b)
            version = getattr(body, "version", None)
            if version is not None:
                if seen and seen[0] != version:
                    close = getattr(body, "close", None)
                    if close is not None:
                        close()
                    url = self.child_url(name)
                    why = f"the object changed during the read ({seen[0]} -> {version})"
                    raise RemoteReadError(f"{url} at byte {a}: {why}", url, why, a)
                seen.append(version)
            return promised, body

        return fetch
