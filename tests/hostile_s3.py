"""A lying S3 endpoint: a proxy in front of moto's S3 server that rewrites chosen answers.

Everything a test does not attack behaves as moto (real S3 semantics) does: each request is
forwarded, and a ``lie`` function sees the request and may answer it itself (never reaching
moto: "200, nothing stored"), or rewrite moto's answer (status, headers, body), or ask for a
body cut short of its ``Content-Length``, a head sent a byte at a time, or bytes appended after
the body on the kept-alive connection. Used by tests/test_storage_hostile_s3.py and
tools/faultlib/s3_lies.py; the S3 operation of a request is named by :func:`operation`.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Request:
    """One request as the proxy received it (path-style: ``/bucket/key?query``; header
    names in lower case)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.path).query, keep_blank_values=True)

    @property
    def key(self) -> str:
        """The object key (after the bucket), unquoted; "" for a bucket request."""
        return unquote(urlsplit(self.path).path).lstrip("/").partition("/")[2]

    @property
    def op(self) -> str:
        return operation(self)


@dataclass
class Reply:
    """An answer to write (header names in lower case). ``send``: body bytes to send before hanging up (None: all);
    ``extra``: bytes written after the body; ``head_trickle``: seconds between the head's
    bytes (0: at once); ``length``: the Content-Length to promise (None: the body's)."""

    status: int
    headers: dict[str, str]
    body: bytes
    send: int | None = None
    extra: bytes = b""
    head_trickle: float = 0.0
    length: int | None = None


Forward = Callable[[], Reply]
Lie = Callable[[Request, Forward], Reply]


def operation(req: Request) -> str:
    """The S3 operation a path-style request is (the ones wdstream sends)."""
    q, has_key = req.query, bool(req.key)
    if req.method == "GET":
        if not has_key:
            if "uploads" in q:
                return "ListMultipartUploads"
            return "ListObjectsV2" if "list-type" in q else "ListObjects"
        return "ListParts" if "uploadId" in q else "GetObject"
    if req.method == "HEAD":
        return "HeadObject" if has_key else "HeadBucket"
    if req.method == "PUT":
        return "UploadPart" if "partNumber" in q else "PutObject"
    if req.method == "POST":
        if "uploads" in q:
            return "CreateMultipartUpload"
        return "CompleteMultipartUpload" if "uploadId" in q else "POST"
    if req.method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in q else "DeleteObject"
    return req.method


def honest(req: Request, forward: Forward) -> Reply:
    """The lie that tells the truth: moto's answer as it is."""
    return forward()


@dataclass
class _Log:
    ops: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _any(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        req = Request(self.command, self.path, headers, body)
        with self.server.log.lock:
            self.server.log.ops.append(req.op)
        reply = self.server.lie(req, lambda: self._forward(req))
        self._write(reply)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

    def _forward(self, req: Request) -> Reply:
        host, port = self.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=30)
        skip = ("connection", "expect")
        headers = {k: v for k, v in req.headers.items() if k.lower() not in skip}
        try:
            conn.request(req.method, req.path, body=req.body or None, headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            hop = ("content-length", "connection", "transfer-encoding")
            out = {k.lower(): v for k, v in resp.getheaders() if k.lower() not in hop}
            length = resp.getheader("Content-Length") if req.method == "HEAD" else None
        finally:
            conn.close()
        return Reply(resp.status, out, body, length=int(length) if length else None)

    def _write(self, r: Reply) -> None:
        lines = [f"HTTP/1.1 {r.status} {http.client.responses.get(r.status, 'X')}"]
        lines += [f"{k}: {v}" for k, v in r.headers.items()]
        length = len(r.body) if r.length is None else r.length
        lines.append(f"Content-Length: {length}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            if r.head_trickle:
                for i in range(len(head)):
                    if self.server.stopping.wait(r.head_trickle):
                        break
                    self.wfile.write(head[i : i + 1])
                    self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(head)
            if self.command != "HEAD":
                self.wfile.write(r.body if r.send is None else r.body[: r.send])
            self.wfile.write(r.extra)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        if r.send is not None:
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    upstream: tuple[str, int]
    lie: Lie
    log: _Log
    stopping: threading.Event

    def handle_error(self, request: object, client_address: object) -> None:
        pass


class LyingS3:
    """A proxy on 127.0.0.1 in front of the S3 server at ``upstream`` (``http://host:port``)
    answering through ``lie`` (a context manager). ``lie`` may be replaced between reads."""

    def __init__(self, upstream: str, lie: Lie = honest) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.upstream = (host, int(port))
        self._server.lie = lie
        self._server.log = _Log()
        self._server.stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def lie(self) -> Lie:
        return self._server.lie

    @lie.setter
    def lie(self, lie: Lie) -> None:
        self._server.lie = lie

    @property
    def ops(self) -> list[str]:
        """The S3 operation of every request so far."""
        return list(self._server.log.ops)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> LyingS3:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def error_xml(code: str, message: str = "injected") -> bytes:
    """An S3 error document."""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message><RequestId>x</RequestId></Error>"
    ).encode()
