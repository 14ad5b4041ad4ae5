"""A response body read from the socket straight into the reader's buffer.

``iter_stream`` takes a body in ``read1`` chunks: each is a new ``bytes`` (a fresh allocation
of up to a chunk, its pages faulted in), and the read then joins them (a second copy). A
fresh loader's first epoch of the bench dataset from nginx on loopback (31 MB) took ~230 such
chunks, ~12 ms of CPU besides the kernel's copy (profiled, issue 35; docs/STORAGE.md).
:class:`SocketBody` instead hands the socket the caller's buffer:
one ``recv_into`` per call (``BufferedReader.readinto1``, so a call returns what one socket
read brought and a connection cut after 60 bytes still counts those 60 for the resume), and
a range's bytes are copied once, by the kernel.

Only a plain body of known length takes this path (not chunked, the length in
``Content-Length``); :func:`socket_body` says None otherwise and the caller takes chunks.
It keeps ``http.client``'s count of the bytes left, closes the response at its end and gives
the connection back to urllib3's pool, as ``urllib3.HTTPResponse`` does; failures raise the
exceptions urllib3 raises for the same failure (``ReadTimeoutError``, ``ProtocolError``,
``SSLError``), so the retries and their messages are unchanged.
"""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Iterator
from typing import Any

from urllib3.exceptions import ProtocolError, ReadTimeoutError, SSLError

__all__ = ["SocketBody", "iter_limited", "iter_stream", "socket_body"]


class SocketBody:
    """The body of one urllib3 response, read into caller buffers (see the module's text).

    Args:
        raw: the ``urllib3.HTTPResponse`` (unread, ``preload_content=False``).
        response: its ``http.client.HTTPResponse``.
    """

    def __init__(self, raw: Any, response: http.client.HTTPResponse) -> None:
        self._raw, self._response = raw, response

    def readinto(self, view: memoryview) -> int:
        """Read up to ``len(view)`` bytes of the body into ``view`` with one socket read;
        0 at the end of the body (or when the server closed it early: the caller compares
        the count with the length promised).

        Raises:
            ReadTimeoutError, ProtocolError, SSLError: as urllib3 does for the same failure.
        """
        resp = self._response
        fp, left = resp.fp, resp.length
        if fp is None or not left:
            return 0
        want = min(len(view), left)
        try:
            n = fp.readinto1(view[:want])
        except TimeoutError as err:  # socket.timeout
            raise ReadTimeoutError(self._raw._pool, None, "Read timed out.") from err
        except ssl.SSLError as err:
            raise SSLError(err) from err
        except (http.client.HTTPException, OSError) as err:
            raise ProtocolError(f"Connection broken: {err!r}", err) from err
        resp.length = left - n
        if n == 0 or resp.length == 0:
            resp.close()  # as http.client does at the end of a body
            if n:
                self._raw.release_conn()  # complete: the connection can serve the next GET
        return n

    def close(self) -> None:
        """As ``urllib3.HTTPResponse.close``: a body read to its end has already given its
        connection back; one cut short drops it (bytes of this answer are still on it)."""
        self._raw.close()
        self._raw.release_conn()


def socket_body(raw: Any) -> SocketBody | None:
    """A :class:`SocketBody` for urllib3 response ``raw``, or None where its body must be
    read in chunks (chunked or of unknown length, not a plain ``http.client`` response, or
    already partly consumed through urllib3)."""
    resp = getattr(raw, "_fp", None)
    if resp is None or resp is not getattr(raw, "_original_response", None):
        return None  # a body urllib3 wraps (a decoder, a cached body): chunks
    if not isinstance(resp, http.client.HTTPResponse):
        return None
    if resp.chunked or resp.length is None or resp.fp is None:
        return None
    if not hasattr(resp.fp, "readinto1") or getattr(raw, "_fp_bytes_read", 1) != 0:
        return None
    return SocketBody(raw, resp)


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
