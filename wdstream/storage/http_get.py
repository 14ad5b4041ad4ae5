"""The HTTP store's GETs without ``requests``' per-request layers, on the session's own pool.

``requests.Session.get`` prepares, merges settings, builds a ``Response`` and extracts cookies
on every call: about half the CPU of a ranged GET from nginx on loopback (profiled, issue 35).
Every object of a store is on one host, with the same headers, auth, TLS settings and proxies,
so :class:`DirectGet` asks the session once what it would send (the prepared headers, the
urllib3 connection pool with its TLS context) and then sends each GET straight to that pool,
as ``HTTPAdapter.send`` does, mapping urllib3's exceptions to the ones ``requests`` raises.

What the shortcut cannot do exactly as ``requests`` does, it leaves to ``requests``: a session
with a proxy for the host never takes it, and an answer that redirects or sets a cookie
switches the session to ``requests`` for good (that GET is sent again through it, which then
follows the redirect and keeps the cookie as before).

Socket timeouts bound each read, not an answer: a server that sends its status line and
headers a byte at a time restarts the read timeout with every byte and never ends (the
body's bytes are bounded by the retrier's deadline, but the headers arrive before the body
exists). The pool's connections therefore read an answer's head under a deadline
(:class:`_HeadDeadline`): past it, the read times out like a silent server. The S3 store's
botocore client gets the same connections (:func:`head_deadline`).
"""

from __future__ import annotations

import functools
import http.client
import io
import socket
import time
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from requests.utils import requote_uri, select_proxy
from urllib3.exceptions import (
    ClosedPoolError,
    ConnectTimeoutError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from wdstream.storage import http_head

__all__ = ["DirectGet", "Reply", "head_deadline"]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class Reply:
    """The parts of an answer the store reads, from ``requests`` or urllib3 alike."""

    __slots__ = ("headers", "raw", "reason", "status_code")

    def __init__(self, raw: Any, status: int, reason: str | None, headers: Any) -> None:
        self.raw, self.status_code, self.reason, self.headers = raw, status, reason, headers

    @classmethod
    def of(cls, resp: requests.Response) -> Reply:
        return cls(resp.raw, resp.status_code, resp.reason, resp.headers)

    def close(self) -> None:
        """As ``requests.Response.close``: a body not read to its end drops the connection;
        one read to its end has already gone back to the pool."""
        self.raw.close()
        release = getattr(self.raw, "release_conn", None)
        if release is not None:
            release()


class DirectGet:
    """GETs of one session's host straight to its urllib3 pool (see the module's text).

    Args:
        session: the store's session of this thread and process, fully configured.
        root: the store's root URL (any object URL of the store has its host).
        timeout: ``(connect, read)`` seconds.
        head_deadline: seconds an answer's status line and headers may take to arrive.
    """

    def __init__(
        self, session: requests.Session, root: str, timeout: tuple[float, float],
        head_deadline: float = 30.0,
    ) -> None:  # fmt: skip
        self._session = session
        self.enabled = select_proxy(root, session.proxies) is None and not session.cookies
        prepared = session.prepare_request(requests.Request("GET", root))
        self._headers = dict(prepared.headers)  # defaults, the store's headers, the auth
        adapter = session.get_adapter(root)
        self._pool: Any = None
        if isinstance(adapter, HTTPAdapter):
            self._pool = adapter.get_connection_with_tls_context(
                prepared, session.verify, proxies=session.proxies, cert=session.cert
            )
            adapter.cert_verify(self._pool, root, session.verify, session.cert)
            self._pool.ConnectionCls = _with_head_deadline(self._pool.ConnectionCls, head_deadline)
            self._retries = adapter.max_retries
        else:
            self.enabled = False  # a mounted custom adapter: only requests knows it
        self._timeout = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        self._targets: dict[str, str] = {}

    def get(self, url: str, headers: dict[str, str]) -> Reply | None:
        """The answer to ``GET url`` with ``headers`` added, body not yet read; None when
        ``requests`` must send this GET (and, from now on, every other)."""
        if not self.enabled:
            return None
        target = self._targets.get(url)
        if target is None:
            parts = urllib3.util.parse_url(requote_uri(url))
            target = self._targets[url] = parts.request_uri
        sent = {**self._headers, **headers} if headers else self._headers
        try:
            resp = self._pool.urlopen(
                "GET", target, headers=sent, redirect=False, assert_same_host=False,
                preload_content=False, decode_content=False, retries=self._retries,
                timeout=self._timeout, chunked=False,
            )  # fmt: skip
        except (ProtocolError, OSError) as err:
            raise requests.ConnectionError(err) from err
        except MaxRetryError as err:
            raise _requests_error(err) from err
        except ClosedPoolError as err:
            raise requests.ConnectionError(err) from err
        except urllib3.exceptions.ProxyError as err:
            raise requests.exceptions.ProxyError(err) from err
        except urllib3.exceptions.SSLError as err:
            raise requests.exceptions.SSLError(err) from err
        except ReadTimeoutError as err:
            raise requests.ReadTimeout(err) from err
        except urllib3.exceptions.InvalidHeader as err:
            raise requests.exceptions.InvalidHeader(err) from err
        reply = Reply(resp, resp.status, resp.reason, resp.headers)
        redirect = resp.status in _REDIRECTS and "Location" in resp.headers
        if redirect or "Set-Cookie" in resp.headers:
            reply.close()
            self.enabled = False
            return None
        return reply


class _DeadlineIO(socket.SocketIO):
    """A connection's socket reads, under a deadline until ``stop`` is set to None: each
    read waits at most the time left (and the read timeout), so a trickle ends there."""

    def __init__(self, sock: socket.socket, stop: float) -> None:
        super().__init__(sock, "rb")
        self._socket = sock
        self.stop: float | None = stop
        self._timeout = sock.gettimeout()

    def readinto(self, b: Any) -> int | None:
        if self.stop is not None:
            left = self.stop - time.monotonic()
            if left <= 0:
                raise TimeoutError("the answer's head took past its deadline")
            t = self._timeout
            self._socket.settimeout(left if t is None else min(t, left))
        return super().readinto(b)

    def end_deadline(self) -> None:
        self.stop = None
        self._socket.settimeout(self._timeout)


class _HeadDeadline(http.client.HTTPResponse):
    """An answer whose status line and headers must arrive within ``deadline`` seconds (a
    class attribute, set per pool); its body is read as usual. Its headers are parsed by
    :func:`~wdstream.storage.http_head.begin` (``email``'s parser only for odd lines)."""

    deadline = 30.0

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp.close()  # http.client's reader, unread: ours replaces it
        sock._io_refs += 1  # type: ignore[attr-defined]  # as sock.makefile("rb") does
        self._io = _DeadlineIO(sock, time.monotonic() + self.deadline)
        self.fp = io.BufferedReader(self._io)

    def begin(self) -> None:
        try:
            http_head.begin(self)  # as super().begin(), headers without email's parser
        finally:
            self._io.end_deadline()


@functools.lru_cache(maxsize=64)
def _with_head_deadline(cls: Any, deadline: float) -> Any:
    """Connection class ``cls`` whose answers' heads have ``deadline`` seconds (botocore's
    swaps in its own response class only after a ``100 Continue``, for uploads). Made once
    per class and deadline: a class is a reference cycle (its ``__mro__``), and one made per
    store was freed only by the collector, ~10 KB for each store dropped."""
    response = type("_HeadDeadline", (_HeadDeadline,), {"deadline": deadline})
    return type(cls.__name__, (cls,), {"response_class": response})


def head_deadline(client: Any, deadline: float) -> None:
    """Make botocore ``client``'s new connections read each answer's head under ``deadline``
    seconds, as :class:`DirectGet`'s do. botocore's pools are urllib3's, their classes in
    its session's ``_pool_classes_by_scheme``; where that is missing (another botocore), the
    client is left as it is."""
    from botocore import awsrequest

    classes = getattr(
        getattr(client._endpoint, "http_session", None), "_pool_classes_by_scheme", None
    )
    if not isinstance(classes, dict):
        return
    for scheme, pool in (("http", awsrequest.AWSHTTPConnectionPool),
                         ("https", awsrequest.AWSHTTPSConnectionPool)):  # fmt: skip
        classes[scheme] = _pool_with_head_deadline(pool, deadline)


@functools.lru_cache(maxsize=64)
def _pool_with_head_deadline(pool: Any, deadline: float) -> Any:
    """Pool class ``pool`` whose connections are :func:`_with_head_deadline`'s (made once
    per class and deadline, as that is)."""
    conn = _with_head_deadline(pool.ConnectionCls, deadline)
    return type(pool.__name__, (pool,), {"ConnectionCls": conn})


def _requests_error(err: MaxRetryError) -> requests.RequestException:
    """What ``HTTPAdapter.send`` raises for urllib3's ``MaxRetryError``."""
    reason = err.reason
    if isinstance(reason, ConnectTimeoutError) and not isinstance(reason, NewConnectionError):
        return requests.ConnectTimeout(err)
    if isinstance(reason, urllib3.exceptions.ResponseError):
        return requests.exceptions.RetryError(err)
    if isinstance(reason, urllib3.exceptions.ProxyError):
        return requests.exceptions.ProxyError(err)
    if isinstance(reason, urllib3.exceptions.SSLError):
        return requests.exceptions.SSLError(err)
    return requests.ConnectionError(err)
