"""HTTP(S) store: ranged GETs with resuming retries, HEAD for sizes, PUT for writes.

Plain HTTP has no listing, so readers start from ``index.json`` (or explicit shard URLs)
and :meth:`HttpStore.list` raises :class:`ListingNotSupportedError`. Writes buffer the
object and send one ``PUT`` when the ``with`` block exits cleanly; whether the server makes
that PUT atomic is up to the server (wdstream's test server writes to a temporary file and
renames it).

A server that ignores ``Range`` answers ``200`` with the whole object; the store then skips
to the requested offset and closes the connection as soon as it has the bytes it asked for,
instead of downloading the rest.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, cast
from urllib.parse import quote, urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter

from wdstream.errors import ListingNotSupportedError
from wdstream.storage.body import iter_limited, iter_stream, socket_body
from wdstream.storage.http_errors import HttpStatusError, check_read, check_status, is_transient
from wdstream.storage.http_get import DirectGet, Reply
from wdstream.storage.http_head import codings
from wdstream.storage.ranges import bad_answer, decimal, promised_by_range
from wdstream.storage.remote import RemoteStore
from wdstream.storage.retry import (
    Readable,
    RemoteReadError,
    RemoteWriteError,
    Retrier,
    RetryPolicy,
    redact_url,
)

__all__ = ["HttpStore", "ListingNotSupportedError"]

_CHUNK = 1 << 20
# Connections the GETs' pool keeps per process: above the reader's concurrent ranged reads
# (16 fetch threads, and the read-ahead), so a connection is never dropped for want of room.
_POOL = 32
# Objects up to this size are PUT from memory; larger ones are streamed from the spool file.
_SPOOL = 16 << 20


# Answers to a PUT that mean the server takes no writes at all (a read-only static server:
# ``python -m http.server`` answers 501), not that this one object was refused.
_NO_PUT = (405, 501)


class _Body:
    """A sized, re-readable request body, so ``requests`` sends Content-Length (not chunked)
    and a retried PUT starts again from byte 0."""

    def __init__(self, f: Any, size: int) -> None:
        self._f, self._size = f, size
        f.seek(0)

    def __len__(self) -> int:
        return self._size

    def read(self, n: int = -1) -> bytes:
        return cast(bytes, self._f.read(n if n and n > 0 else _CHUNK))


class _Response:
    """Chunks of a streamed response; ``close()`` gives the connection back (or drops it
    when the body was not read to the end)."""

    def __init__(self, resp: Reply, chunks: Iterable[bytes]) -> None:
        self._resp, self._chunks = resp, chunks

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._chunks)

    def close(self) -> None:
        self._resp.close()


class HttpStore(RemoteStore):
    """Objects under an ``http(s)://host/path/`` prefix.

    Args:
        url: the root; ``user:pass@`` in it is used for basic auth and a query string
            (a signed token) is appended to every object URL. Neither appears in
            :attr:`url`, messages or logs.
        retries, timeout, backoff, max_backoff, deadline, min_throughput, budget: see
            :class:`RetryPolicy`.
        headers: extra request headers (e.g. ``Authorization``); never logged.
        chunk_size: bytes per socket read of a response.
        verify: TLS verification, as in ``requests``.
    """

    # Sessions and locks stay in the process that made them.
    _process_local = ("_retrier", "_local", "_lock", "_sessions", "_direct")

    def __init__(
        self,
        url: str,
        retries: int | None = None,
        timeout: float | tuple[float, float] | None = None,
        backoff: float | None = None,
        max_backoff: float | None = None,
        headers: dict[str, str] | None = None,
        chunk_size: int = _CHUNK,
        verify: bool | str = True,
        deadline: float | None = None,
        min_throughput: float | None = None,
        budget: float | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) URL: {redact_url(url)!r}")
        self._parts = parts
        self.url = redact_url(url).rstrip("/")
        self.policy = RetryPolicy.from_options(
            retries, timeout, backoff, max_backoff, deadline, min_throughput, budget
        )
        self.headers = dict(headers or {})
        self.chunk_size = chunk_size
        self.verify = verify
        self._setup()

    def __repr__(self) -> str:
        return f"HttpStore({self.url!r})"

    def _setup(self) -> None:
        self._retrier = Retrier(self.policy, is_transient)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sessions: list[requests.Session] = []
        self._direct: tuple[int, DirectGet] | None = None

    def _new_session(self, pool: int | None = None) -> requests.Session:
        session = requests.Session()
        if pool is not None:
            adapter = HTTPAdapter(pool_connections=1, pool_maxsize=pool)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        session.headers.update(self.headers)
        session.headers["Accept-Encoding"] = "identity"  # byte ranges of the raw object
        session.verify = self.verify
        self._environment_once(session)
        with self._lock:
            self._sessions.append(session)
        return session

    def _session(self) -> requests.Session:
        # requests.Session is not documented as thread-safe: one per thread and per process
        # (a forked worker makes its own), for HEAD, PUT, DELETE and the GETs that
        # DirectGet leaves to requests.
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.session, local.pid = self._new_session(), os.getpid()
        return cast(requests.Session, local.session)

    def _direct_get(self) -> DirectGet:
        """The GETs' :class:`DirectGet`: one per process, shared by its threads. Its pool
        is urllib3's, which is thread-safe, so a connection opened by one fetch thread serves
        the next GET of any other: a fresh loader's 16 fetch threads used to open a session
        and a connection each (0.5 ms of CPU per session and the connection's set-up, ~14 an
        epoch of the bench), now the epoch opens as many as its GETs in flight at once."""
        direct, pid = self._direct, os.getpid()
        if direct is None or direct[0] != pid:
            with self._lock:
                direct = self._direct
            if direct is None or direct[0] != pid:
                session = self._new_session(pool=_POOL)
                get = DirectGet(session, self._object_url(""), self._timeout, self.policy.deadline)
                direct = (pid, get)
                with self._lock:
                    self._direct = direct
        return direct[1]

    def _environment_once(self, session: requests.Session) -> None:
        """What ``requests`` reads from the environment on every request (proxies and
        ``NO_PROXY``, a CA bundle, ``~/.netrc``), read once for this store's host.

        Every object of a store is on one host, so the answer is the same each time; read
        per request it cost ~0.5 ms a GET (walking ``os.environ``, twice), ~15 % of the
        CPU of reading a dataset from nginx on loopback (profiled)."""
        base = urlunsplit((self._parts.scheme, self._parts.netloc, "/", "", ""))
        session.trust_env = False
        session.proxies.update(requests.utils.get_environ_proxies(base))
        if self.verify is True:
            bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
            if bundle:
                session.verify = bundle
        netrc = requests.utils.get_netrc_auth(base)
        if netrc is not None:
            session.auth = netrc

    def _object_url(self, name: str) -> str:
        p = self._parts
        path = p.path.rstrip("/") + "/" + quote(name, safe="/-_.~")
        return urlunsplit((p.scheme, p.netloc, path, p.query, ""))

    def identity(self, name: str) -> str:
        return self._object_url(name)  # with the query: ``?ds=web`` and ``?ds=code`` differ

    @property
    def _timeout(self) -> tuple[float, float]:
        return (self.policy.connect_timeout, self.policy.read_timeout)

    # -- reads ----------------------------------------------------------------------------

    def _get(self, name: str, headers: dict[str, str]) -> Reply:
        """``GET`` of object ``name``, body unread: straight to the session's pool where
        that is what ``requests`` would do (:mod:`~wdstream.storage.http_get`), else
        through ``requests``."""
        url = self._object_url(name)
        reply = self._direct_get().get(url, headers)
        if reply is None:
            resp = self._session().get(url, headers=headers, stream=True, timeout=self._timeout)
            reply = Reply.of(resp)
        return reply

    def _fetch(
        self, name: str, start: int, end: int | None
    ) -> tuple[int, Iterable[bytes] | Readable]:
        headers = {}
        if start > 0 or end is not None:
            headers["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        url = self.child_url(name)
        try:
            resp = self._get(name, headers)
        except requests.exceptions.InvalidHeader as err:  # a ValueError: never retried
            raise bad_answer(url, start, f"invalid header ({err})") from None
        if resp.status_code == 416:  # start at or past the end: nothing to read
            resp.close()
            total = decimal(resp.headers.get("Content-Range", "").rpartition("/")[2])
            if total is not None and start < total:
                raise bad_answer(url, start, f"416 for a range inside its {total} bytes")
            return 0, ()
        check_read(resp, url)
        if resp.status_code not in (200, 206):  # 204, 203 (transformed), 226 (a delta)...
            resp.close()
            raise bad_answer(url, start, f"HTTP {resp.status_code} {resp.reason}")
        te = resp.headers.get("Transfer-Encoding")
        coded = [c for c in codings([te or ""]) if c != "identity"]
        # A body we would not decode (gzip, chunked twice), or chunked where http.client's
        # own head parser (a GET left to requests) reads it as the object's bytes.
        framed = getattr(getattr(resp.raw, "_original_response", None), "chunked", None)
        if coded not in ([], ["chunked"]) or (coded and framed is False):
            resp.close()
            raise bad_answer(url, start, f"Transfer-Encoding {te!r}")
        encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            resp.close()  # asked for identity: an encoded body is not the object's bytes
            raise bad_answer(url, start, f"Content-Encoding {encoding!r} (identity asked)")
        sent = resp.headers.get("Content-Length")
        length = None if sent is None else decimal(sent.strip())
        if sent is not None and length is None:
            resp.close()
            raise bad_answer(url, start, f"Content-Length {sent!r}")
        chunks = iter_stream(resp.raw, self.chunk_size)
        if resp.status_code == 206:
            value = resp.headers.get("Content-Range")
            try:
                promised = promised_by_range(url, start, end, value, length)
            except RemoteReadError:
                resp.close()
                raise
            body = socket_body(resp.raw) if end is not None else None
            return promised, _versioned(
                body if body is not None else _Response(resp, chunks), resp.headers
            )
        # 200: the server ignored Range and sends the whole object from byte 0.
        total = length
        limit = None if end is None else max(0, end - start)
        if total is None:
            promised = 0  # unknown length: trust the stream (truncation shows as an error)
        else:
            stop = total if end is None else min(end, total)
            promised = max(0, stop - start)
        whole = _Response(resp, iter_limited(chunks, start, limit))
        return promised, _versioned(whole, resp.headers)

    def _head(self, name: str) -> requests.Response:
        url = self.child_url(name)

        def head() -> requests.Response:
            resp = self._session().head(
                self._object_url(name), timeout=self._timeout, allow_redirects=True
            )
            check_read(Reply.of(resp), url)
            return resp

        return self._retrier.call(head, "HEAD", url)

    def size(self, name: str) -> int:
        length = self._head(name).headers.get("Content-Length")
        url = self.child_url(name)
        if length is not None:
            size = decimal(length.strip())
            if size is None:
                raise RemoteReadError(f"{url}: HEAD: Content-Length {length!r}", url, "size")
            return size
        # Some servers leave Content-Length out of HEAD; a one-byte range has the total.

        def probe() -> int:
            resp = self._get(name, {"Range": "bytes=0-0"})
            resp.close()
            if resp.status_code == 416:
                return 0
            check_read(resp, url)
            total = decimal(resp.headers.get("Content-Range", "").rpartition("/")[2])
            if total is None:
                raise RemoteReadError(f"{url}: server reports no size", url, "no size")
            return total

        return self._retrier.call(probe, "size of", url)

    def exists(self, name: str) -> bool:
        try:
            self._head(name)
        except FileNotFoundError:
            return False
        return True

    def list(self) -> list[str]:
        raise ListingNotSupportedError(
            f"cannot list {self.url}: plain HTTP has no listing; read the dataset through "
            "its index.json or give explicit shard URLs"
        )

    # -- writes ---------------------------------------------------------------------------

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL)
        try:
            yield cast(BinaryIO, spool)
            # Only a clean exit gets here: an exception in the block sends nothing.
            size = spool.seek(0, os.SEEK_END)
            spool.seek(0)
            data = spool.read() if size <= _SPOOL else None
            self._put(name, data if data is not None else _Body(spool, size))
        finally:
            spool.close()

    def write_bytes(self, name: str, data: bytes) -> None:
        self._put(name, bytes(data))

    def _put(self, name: str, body: bytes | _Body) -> None:
        url = self.child_url(name)

        def put() -> None:
            if isinstance(body, _Body):
                body._f.seek(0)  # a retry resends from the start
            resp = self._session().put(
                self._object_url(name), data=body, timeout=self._timeout,
                headers={"Content-Type": "application/octet-stream"},
            )  # fmt: skip
            resp.close()
            if resp.status_code in _NO_PUT:
                raise HttpStatusError(
                    f"HTTP {resp.status_code} {resp.reason}: the server does not accept PUT; "
                    "serve the output with a server that accepts PUT, or write to a local "
                    "folder or s3://"
                )
            check_status(resp)

        self._retrier.call(put, "PUT", url, RemoteWriteError)

    def delete(self, name: str) -> None:
        url = self.child_url(name)

        def delete() -> None:
            resp = self._session().delete(self._object_url(name), timeout=self._timeout)
            resp.close()
            if resp.status_code != 404:  # already gone is what DELETE wants
                check_status(resp)

        self._retrier.call(delete, "DELETE", url, RemoteWriteError)

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
            self._direct = None
        for session in sessions:
            session.close()
        self._local = threading.local()


def _versioned(body: Any, headers: Any) -> Any:
    """``body`` marked with the object's version in this answer (ETag, else Last-Modified),
    which every answer of one read must share (``RemoteStore``)."""
    body.version = headers.get("ETag") or headers.get("Last-Modified")
    return body
