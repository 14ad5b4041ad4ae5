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
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from wdstream.errors import RemoteReadError, RemoteStoreError, RemoteWriteError

__all__ = [
    "Fetch",
    "RemoteReadError",
    "RemoteStoreError",
    "RemoteWriteError",
    "RetryPolicy",
    "Retrier",
    "TransientError",
    "describe",
    "iter_limited",
    "iter_stream",
    "redact_text",
    "redact_url",
    "transient_status",
]

log = logging.getLogger("wdstream.storage")

T = TypeVar("T")

# (bytes the response promises, chunks of the body). The iterator may have a close().
Fetch = Callable[[int, "int | None"], "tuple[int, Iterable[bytes]]"]


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


@dataclass(frozen=True)
class RetryPolicy:
    """How hard a remote store tries, and for how long (docs/STORAGE.md says why these).

    Attributes:
        retries: attempts after the first one before giving up (per read: consecutive
            attempts that brought no new byte).
        backoff: first delay in seconds; doubles per attempt up to ``max_backoff``.
        max_backoff: cap of one delay (also caps a server's ``Retry-After``).
        connect_timeout: seconds to open a connection.
        read_timeout: seconds to wait for the next bytes of a response.
        deadline: seconds one GET may take from connecting to its last byte, plus
            ``bytes / min_throughput``; a GET past it is cut and resumed.
        min_throughput: bytes per second a GET is expected to sustain beyond ``deadline``.
        budget: seconds an operation may go without progress, over all its attempts; no
            retry starts after it (an attempt in flight still ends by its own timeouts).
    """

    retries: int = 5
    backoff: float = 0.25
    max_backoff: float = 10.0
    connect_timeout: float = 5.0
    read_timeout: float = 15.0
    deadline: float = 30.0
    min_throughput: float = float(1 << 20)
    budget: float = 60.0

    @classmethod
    def from_options(
        cls,
        retries: int | None = None,
        timeout: float | tuple[float, float] | None = None,
        backoff: float | None = None,
        max_backoff: float | None = None,
        deadline: float | None = None,
        min_throughput: float | None = None,
        budget: float | None = None,
    ) -> RetryPolicy:
        """Build a policy from ``open_store`` options; ``timeout`` is one number or a
        ``(connect, read)`` pair; options left as None keep their defaults.

        Raises:
            ValueError: for a negative count or delay, or a time limit that is not > 0.
        """
        kw: dict[str, float | int] = {}
        if retries is not None:
            if retries < 0:
                raise ValueError(f"retries must be >= 0, got {retries!r}")
            kw["retries"] = int(retries)
        if backoff is not None:
            if backoff < 0:
                raise ValueError(f"backoff must be >= 0, got {backoff!r}")
            kw["backoff"] = float(backoff)
        if max_backoff is not None:
            kw["max_backoff"] = float(max_backoff)
        if timeout is not None:
            connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
            if connect <= 0 or read <= 0:
                raise ValueError(f"timeout must be > 0, got {timeout!r}")
            kw["connect_timeout"], kw["read_timeout"] = float(connect), float(read)
        limits = {"deadline": deadline, "min_throughput": min_throughput, "budget": budget}
        for key, value in limits.items():
            if value is not None:
                if value <= 0:
                    raise ValueError(f"{key} must be > 0, got {value!r}")
                kw[key] = float(value)
        return cls(**kw)  # type: ignore[arg-type]

    def request_time(self, nbytes: int) -> float:
        """Seconds one GET of ``nbytes`` may take, connect to last byte."""
        return self.deadline + nbytes / self.min_throughput


# Statuses that repeating the same request cannot fix although they are 5xx: the server does
# not implement the method or HTTP version (501, 505), is misconfigured (506, 508, 510),
# wants a captive-portal login (511), or is out of space (507, which outlasts any backoff).
_PERMANENT_5XX = frozenset({501, 505, 506, 507, 508, 510, 511})
# 4xx that do heal: the server timed out waiting for us (408), too early (425), throttling.
_TRANSIENT_4XX = frozenset({408, 425, 429})


def transient_status(status: int) -> bool:
    """Whether an HTTP status is worth another attempt of the same request."""
    return status in _TRANSIENT_4XX or (status >= 500 and status not in _PERMANENT_5XX)


_USERINFO = re.compile(r"(?<=//)[^/@\s'\"]+@")
_QUERY = re.compile(r"\?[^\s'\"()<>]+")
# Header-looking secrets a library might echo in an exception text. A quoted value is
# dropped whole; an unquoted Authorization value loses its scheme and its credentials.
_SECRET_FIELDS = re.compile(
    r"(?i)(authorization|x-amz-security-token|x-amz-credential|x-amz-signature|"
    r"signature|aws_secret_access_key|aws_access_key_id|password|token)"
    r"(['\"]?\s*[:=]\s*)"
    r"('[^']*'|\"[^\"]*\"|[^\s'\",&}]+)"
)
_AUTH_UNQUOTED = re.compile(
    r"(?i)(authorization['\"]?\s*[:=]\s*)([^\s'\"][^\s'\",&}]*(?:\s+[^\s'\",&}]+)?)"
)


def redact_url(url: str) -> str:
    """The URL with ``user:pass@`` and any query string (presigned signatures) removed."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "<redacted>" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact_text(text: str) -> str:
    """Scrub URL credentials, query strings and secret-looking fields from free text."""
    text = _USERINFO.sub("***@", text)
    text = _QUERY.sub("?<redacted>", text)
    text = _AUTH_UNQUOTED.sub(r"\1<redacted>", text)
    return _SECRET_FIELDS.sub(r"\1\2<redacted>", text)


def describe(exc: BaseException) -> str:
    """One-line, redacted description of an exception, for messages and logs."""
    text = str(exc) or exc.__class__.__name__
    # botocore's ClientError text names the S3 error code but not the HTTP status.
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status:
            text = f"HTTP {status}: {text}"
    name = exc.__class__.__name__.lstrip("_")  # a private class still reads as a name
    return f"{name}: {redact_text(text)}"[:500]


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
        parts: list[bytes] = []
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
                    for chunk in chunks:
                        parts.append(chunk)
                        got += len(chunk)
                        pos += len(chunk)
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
        return b"".join(parts)

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


def iter_limited(chunks: Iterator[bytes], skip: int, limit: int | None) -> Iterator[bytes]:
    """Drop the first ``skip`` bytes of a stream and stop after ``limit`` more: turns a
    whole-object answer from a server that ignored ``Range`` into the requested slice
    without reading the rest of the body."""
    for chunk in chunks:
        if skip:
            if len(chunk) <= skip:
                skip -= len(chunk)
                continue
            chunk, skip = chunk[skip:], 0
        if limit is not None:
            if len(chunk) >= limit:
                if limit:
                    yield chunk[:limit]
                return
            limit -= len(chunk)
        yield chunk


def iter_stream(raw: Any, chunk_size: int) -> Iterator[bytes]:
    """Chunks of a raw (urllib3) response body, as they arrive.

    ``read1`` returns what one socket read brought, so when the connection drops the bytes
    received so far have already been handed over and a retry resumes after them; a plain
    ``read(n)`` would wait for ``n`` bytes and lose them all in the exception. Without
    ``read1`` (urllib3 < 2), small reads bound the loss.
    """
    read1 = getattr(raw, "read1", None)
    while True:
        data = read1(chunk_size) if read1 is not None else raw.read(min(chunk_size, 64 << 10))
        if not data:
            return
        yield data
