"""What the HTTP store makes of an answer's status or a ``requests`` exception: retried, a
missing object, refused access, or a failure that repeating the request cannot change
(docs/STORAGE.md, "Retry policy")."""

from __future__ import annotations

import requests

from wdstream.storage.http_get import Reply
from wdstream.storage.remote import NETWORK_ERRORS
from wdstream.storage.retry import TransientError, transient_status

__all__ = ["HttpStatusError", "check_read", "check_status", "is_transient", "retry_after"]


class HttpStatusError(Exception):
    """A status that retrying will not fix (400, 405, 501, ...)."""


def is_transient(exc: BaseException) -> bool:
    """Whether an exception from ``requests`` is worth another attempt."""
    if isinstance(exc, requests.exceptions.SSLError):
        return False  # a certificate problem does not heal by waiting
    return isinstance(
        exc,
        (
            *NETWORK_ERRORS,
            requests.ConnectionError,
            requests.Timeout,
            requests.exceptions.ChunkedEncodingError,
        ),
    )


def retry_after(resp: Reply | requests.Response) -> float | None:
    value = resp.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date; the backoff is good enough


def check_read(resp: Reply, url: str) -> None:
    """Map the status of a read to an exception (``url`` is already redacted)."""
    code = resp.status_code
    if 200 <= code < 300:
        return
    resp.close()
    if code in (404, 410):
        raise FileNotFoundError(f"no such object: {url} (HTTP {code})")
    if code in (401, 403):
        raise PermissionError(f"access denied: {url} (HTTP {code})")
    check_status(resp)


def check_status(resp: Reply | requests.Response) -> None:
    """Map a status to an exception: retryable, or one that repeating the request cannot
    change (405, 413, 501, ...), which the retrier reports at once, naming it. Writes use
    this alone: a 404 or 403 on PUT says the server will not take the object there, not
    that an object is missing, so it is a ``RemoteWriteError``, not a FileNotFoundError."""
    code = resp.status_code
    if 200 <= code < 300:
        return
    resp.close()
    if transient_status(code):
        raise TransientError(f"HTTP {code} {resp.reason}", retry_after(resp))
    raise HttpStatusError(f"HTTP {code} {resp.reason}")
