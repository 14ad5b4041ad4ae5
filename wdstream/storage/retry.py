"""Retries shared by the remote stores: backoff with jitter, resuming reads, redaction.

A remote read is a loop around one backend call, ``fetch(offset, end)``, that starts a GET
of bytes ``[offset, end)`` and returns how many bytes the response promises plus an iterator
of chunks. When the body stops early (connection reset, read timeout, a proxy that cuts
the response) the loop asks only for the bytes still missing::

    want [0, 100)   GET bytes=0-99   -> 60 bytes, then the connection resets
                    GET bytes=60-99  -> 40 bytes           -> return the 100 bytes

A response that brought new bytes is resumed at once (the link works; a backoff there made a
proxy that cuts every body after 100 bytes cost 0.2 s per 100 bytes). Only failures *without
progress* sleep (backoff + jitter) and count against the retries and the time budget, so a
long read over a flaky link finishes while a dead endpoint fails
after ``retries`` attempts, or once ``budget`` seconds have passed without progress, with a
:class:`RemoteReadError` naming the URL, the byte offset and the last cause. Socket timeouts
alone cannot stop a server that trickles a byte at a time (every byte restarts the read
timeout), so each GET also has a deadline that grows with the bytes it asks for; a GET that
misses it is cut and resumed like a dropped connection, but counts as no progress. URLs and
causes are redacted before they reach a message or a log.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar, cast

import numpy as np

from wdstream.errors import RemoteReadError, RemoteStoreError, RemoteWriteError
from wdstream.storage.policy import RetryPolicy, transient_status
from wdstream.storage.redact import describe, redact_text, redact_url

__all__ = [
    "Fetch",
    "Readable",
    "RemoteReadError",
    "RemoteStoreError",
    "RemoteWriteError",
    "RetryPolicy",
    "Retrier",
    "TransientError",
    "describe",
    "redact_text",
    "redact_url",
    "transient_status",
]

log = logging.getLogger("wdstream.storage")

T = TypeVar("T")


class Readable(Protocol):
    """A body read into the caller's buffer (``body.SocketBody``): ``readinto`` returns the
    bytes one socket read brought (0 at the end); ``close`` gives the connection back."""

    def readinto(self, view: memoryview) -> int: ...

    def close(self) -> None: ...


# (bytes the response promises, the body: chunks, or a Readable when a range was asked).
# The iterator may have a close().
Fetch = Callable[[int, "int | None"], "tuple[int, Iterable[bytes] | Readable]"]


class TransientError(Exception):
    """Raised by a backend for an answer worth retrying (5xx, 429, a truncated body)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _DeadlineExceeded(TransientError):
    """A GET ran past its deadline; the bytes it brought are kept but count as no progress,
    so a server that trickles still runs out of budget."""


def _went_silent(exc: BaseException) -> bool:
    """Whether a body ended because the server stopped sending: a read timeout (urllib3's
    ``ReadTimeoutError``, requests' ``ReadTimeout``, botocore's ``ReadTimeoutError``,
    ``socket.timeout``: every client names it so), here or in the exceptions it wraps."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 8:  # a cause chain is short; bounded all the same
        if isinstance(e, TimeoutError) or any("Timeout" in c.__name__ for c in type(e).__mro__):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


class Retrier:
    """Runs backend calls under a :class:`RetryPolicy`.

    Args:
        policy: retry counts, backoff, timeouts, deadline and budget.
        is_transient: tells which exceptions are worth another attempt.
        rng: source of jitter; jitter never affects data, only when attempts happen.
        sleep: injectable for tests.
        clock: monotonic seconds, injectable for tests (deadline and budget).
    """

    def __init__(
        self,
        policy: RetryPolicy,
        is_transient: Callable[[BaseException], bool],
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.is_transient = is_transient
        self.rng = rng or random.Random()
        self.sleep = sleep
        self.clock = clock

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based): "equal jitter", so
        workers that failed together do not come back together, yet never wait zero."""
        p = self.policy
        base = min(p.max_backoff, p.backoff * (2 ** (attempt - 1)))
        wait = base / 2 + self.rng.uniform(0, base / 2)
        if retry_after is not None:
            wait = max(wait, min(retry_after, p.max_backoff))
        return wait

    def _retryable(self, exc: Exception) -> bool:
        return isinstance(exc, TransientError) or self.is_transient(exc)

    def _raise_unless_retryable(
        self,
        exc: Exception,
        what: str,
        error: type[RemoteStoreError],
        url: str,
        offset: int | None = None,
    ) -> None:
        """Raise ``error`` at once for a failure another attempt will not heal."""
        if not self._retryable(exc):
            raise error(
                f"{what} failed (not retried): {describe(exc)}", url, describe(exc), offset
            ) from None

    def _pause(
        self,
        exc: Exception,
        failures: int,
        since: float,
        what: str,
        error: type[RemoteStoreError],
        url: str,
        offset: int | None = None,
        counted: str = "attempts",
    ) -> None:
        """Sleep before the next attempt, or raise ``error`` when the retries or the time
        budget are spent (a retry that would start after the budget is not made)."""
        p = self.policy
        wait = self.delay(failures, getattr(exc, "retry_after", None))
        elapsed = self.clock() - since
        if failures > p.retries or elapsed + wait > p.budget:
            raise error(
                f"{what} failed after {failures} {counted} in {elapsed:.1f}s "
                f"(limits: {p.retries} retries, {p.budget:g}s budget); "
                f"last cause: {describe(exc)}",
                url, describe(exc), offset,
            ) from None  # fmt: skip
        log.warning(
            "%s failed (%s); retry %d/%d in %.2fs",
            what, describe(exc), failures, p.retries, wait,
        )  # fmt: skip
        self.sleep(wait)

    def call(
        self,
        fn: Callable[[], T],
        what: str,
        url: str,
        error: type[RemoteStoreError] = RemoteReadError,
    ) -> T:
        """Run ``fn`` until it succeeds, retrying transient failures.

        Raises:
            RemoteStoreError: ``error`` after the retries or the time budget, or at once for
                a permanent failure that is not a FileNotFoundError/PermissionError/ValueError.
        """
        failures = 0
        since = self.clock()
        while True:
            try:
                return fn()
            except (FileNotFoundError, PermissionError, RemoteStoreError, ValueError):
                raise
            except Exception as exc:
                self._raise_unless_retryable(exc, f"{what} {url}", error, url)
                failures += 1
                self._pause(exc, failures, since, f"{what} {url}", error, url)

    def read(self, fetch: Fetch, url: str, start: int, end: int | None) -> bytes:
        """Read ``[start, end)`` (``end=None``: to the end) through ``fetch``, resuming
        from the last byte received after every failure.

        Raises:
            RemoteReadError: after ``retries`` consecutive attempts without progress, or
                ``budget`` seconds without progress, naming ``url``, the offset of the first
                missing byte and the last cause.
        """
        if end is not None:
            return self.read_range(fetch, url, start, end).tobytes()
        parts: list[bytes] = []
        self._read(fetch, url, start, None, parts.append)
        return b"".join(parts)

    def read_range(self, fetch: Fetch, url: str, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)`` as :meth:`read` reads them, in one buffer of ``end -
        start`` bytes allocated once: a body that can ``readinto`` (:mod:`.body`) is read
        into it by the socket, chunks are copied into it. The view is shorter when the
        object ends before ``end``.

        Raises:
            RemoteReadError: as :meth:`read`.
        """
        buf = _Buffer(end - start)
        got = self._read(fetch, url, start, end, buf)
        return buf.view[: got - start] if buf.view is not None else memoryview(b"")

    def _read(
        self, fetch: Fetch, url: str, start: int, end: int | None,
        sink: _Buffer | Callable[[bytes], object],
    ) -> int:  # fmt: skip
        """The attempts of :meth:`read`: bytes go into ``sink`` (a buffer for bytes
        ``[start, end)``, or a function taking each chunk); returns the end offset reached."""
        pos = start
        failures = 0
        since = self.clock()  # when the current run of attempts without progress began
        while end is None or pos < end:
            before = pos
            began = self.clock()
            try:
                promised, chunks = fetch(pos, end)
                if end is not None and promised > end - pos:
                    close = getattr(chunks, "close", None)
                    if close is not None:
                        close()
                    raise TransientError(f"the answer promises {promised} bytes, {end - pos} asked")
                got = 0
                try:
                    for n in _landed(chunks, sink, pos - start, promised):
                        got += n
                        pos += n
                        if got != promised:
                            self._check_deadline(began, promised, got)
                finally:
                    close = getattr(chunks, "close", None)
                    if close is not None:
                        close()
                if got < promised:
                    raise TransientError(f"truncated body: {got} of {promised} bytes")
                break  # the response was complete: that is all there is
            except (FileNotFoundError, PermissionError, RemoteStoreError, ValueError):
                raise
            except Exception as exc:
                what = f"read of {url} at byte {pos}"
                self._raise_unless_retryable(exc, what, RemoteReadError, url, pos)
                # Bytes, then silence (a body shorter than promised, the rest never sent)
                # count like a deadline: kept, but no progress, or every read of such a
                # server would wait out one read timeout per attempt, without end.
                if (
                    pos > before
                    and not isinstance(exc, _DeadlineExceeded)
                    and not _went_silent(exc)
                ):
                    failures, since = 0, self.clock()  # progress: resume at once
                    log.debug("%s cut after new bytes (%s); resuming", what, describe(exc))
                    continue
                failures += 1
                counted = "attempts without progress"
                self._pause(exc, failures, since, what, RemoteReadError, url, pos, counted)
        return pos

    def _check_deadline(self, began: float, promised: int, got: int) -> None:
        """Cut a GET that has run past its deadline. The allowance grows with the bytes
        promised (or received, when the length is unknown), so a large healthy read is
        never cut while a trickle of bytes is."""
        allowed = self.policy.request_time(max(promised, got))
        took = self.clock() - began
        if took > allowed:
            raise _DeadlineExceeded(
                f"{got} of {promised or 'unknown'} bytes in {took:.2f}s (allowed {allowed:.2f}s)"
            )


class _Buffer:
    """The buffer of one ranged read, made at its first answer (not zeroed: the socket fills
    it): as long as the bytes that answer promises when the object ends before the range
    does, else the range, so a range asked past an object's end holds only what exists."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.view: memoryview | None = None

    def at(self, promised: int) -> memoryview:
        if self.view is None:
            n = promised if 0 < promised < self.size else self.size
            self.view = np.empty(n, np.uint8).data
        return self.view


def _landed(
    body: Iterable[bytes] | Readable, sink: _Buffer | Callable[[bytes], object], at: int,
    promised: int,
) -> Iterator[int]:  # fmt: skip
    """Put a response body into ``sink`` from its offset ``at``: a :class:`Readable` is read
    into the buffer (one socket read per piece), chunks are copied into it or handed to a
    function. Yields the size of each piece as it lands, so bytes that arrived before a
    failure count for the resume."""
    if isinstance(sink, _Buffer) and promised > 0 and at + promised > len(sink.at(promised)):
        raise TransientError(
            f"the answer promises {promised} bytes past byte {at}, more than exist"
        )
    readinto = getattr(body, "readinto", None)
    if readinto is not None:  # given only for a range: ``sink`` is its buffer
        view = cast(_Buffer, sink).at(promised)[at : at + promised]
        got = 0
        while got < promised:
            n = readinto(view[got:])
            if not n:
                return  # cut short: the caller sees fewer bytes than promised
            got += n
            yield n
        return
    for chunk in cast("Iterable[bytes]", body):
        if isinstance(sink, _Buffer):
            view = sink.at(promised)
            if at + len(chunk) > len(view):
                raise TransientError(f"the answer sent more than the {len(view)} bytes asked")
            view[at : at + len(chunk)] = chunk
            at += len(chunk)
        else:
            sink(chunk)
        yield len(chunk)
