"""Real servers on 127.0.0.1 for the storage tests, with deterministic fault injection.

* :class:`FileServer`: a threaded HTTP/1.1 server over a folder: GET (honours ``Range``:
  206 + Content-Range, 416 past the end), HEAD, PUT (temporary file + rename) and DELETE.
* :class:`FaultProxy`: forwards every request to an upstream (moto's S3 server) and can
  inject the same faults, answering 503 with an S3 ``SlowDown`` error document.
* :class:`SilentServer`: accepts TCP connections and never answers (a hung endpoint).
* :class:`RequestServer`: reads requests off raw connections for servers whose answers are
  written by hand (the hostile servers of tests/hostile_http.py and tests/hostile_heads.py).
* :class:`Faults`: the knobs, shared by both. Decisions come from request counters, never
  from randomness, so a failing test fails the same way every time.
"""

from __future__ import annotations

import http
import http.client
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlsplit

_R = TypeVar("_R", bound="_Running")
_Raw = TypeVar("_Raw", bound="RawServer")

SLOWDOWN_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Faults:
    """Fault-injection knobs; counters are per server and count every request.

    Attributes:
        fail_first: answer the first n requests (any method) with ``fail_status``.
        fail_every: answer every k-th request with ``fail_status`` (0: never).
        fail_status: the status of those answers (503, with an S3 ``SlowDown`` body, by
            default; another status gets an S3 error body naming its phrase).
        cut_first: cut the body of the first n GET responses after ``cut_at`` bytes.
        cut_every: cut every k-th GET response (0: never).
        cut_at: body bytes sent before closing a cut response (the header still promises
            the full Content-Length).
        ignore_range: answer ranged GETs with 200 and the whole object.
        sent: body bytes handed to the socket so far (a counter, not a knob).
        delay: seconds to sleep before answering each request.
        trickle: send GET bodies one byte at a time, this many seconds apart (0: at once):
            every byte restarts the client's read timeout, so only a deadline stops it.
        lose_nth: (proxy) forward the n-th counted request, then answer 503 instead of the
            upstream reply: the request took effect but its answer was lost (0: never).
        methods: only requests with these methods count for the fail_*/delay knobs.
        only: only requests whose path contains this text are faulted ("": all).
        stall: a cut body is followed by silence (until the server stops) instead of a
            hang-up: the header promised more bytes than ever come.
        swap: (file server) path -> another path whose bytes are served in its place: a
            server that answers with another object.
    """

    fail_first: int = 0
    fail_every: int = 0
    fail_status: int = 503
    cut_first: int = 0
    cut_every: int = 0
    cut_at: int = 1000
    ignore_range: bool = False
    delay: float = 0.0
    trickle: float = 0.0
    lose_nth: int = 0
    methods: tuple[str, ...] = ("GET", "HEAD", "PUT", "DELETE", "POST")
    only: str = ""
    stall: bool = False
    swap: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    sent: int = 0
    _n: int = 0
    _gets: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self, **knobs: object) -> None:
        """Clear the counters and the request log; knobs not given go back to defaults."""
        with self._lock:
            self._n = self._gets = self.sent = 0
            self.requests.clear()
            for key, value in {**_DEFAULT_KNOBS, **knobs}.items():
                if not hasattr(self, key) or key.startswith("_"):
                    raise AttributeError(key)
                setattr(self, key, value)

    def decide(self, method: str, path: str, rng: str | None) -> tuple[bool, bool, bool]:
        """Log the request and return ``(answer 503, cut the body, lose the reply)``."""
        with self._lock:
            self.requests.append((method, path, rng))
            if method not in self.methods or self.only not in path:
                return False, False, False
            self._n += 1
            n = self._n
            fail = n <= self.fail_first or (self.fail_every > 0 and n % self.fail_every == 0)
            cut = False
            if method == "GET" and not fail:
                self._gets += 1
                g = self._gets
                cut = g <= self.cut_first or (self.cut_every > 0 and g % self.cut_every == 0)
        return fail, cut, n == self.lose_nth

    def count_sent(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def ranges(self, method: str = "GET") -> list[str | None]:
        """The Range headers of the logged requests with ``method``."""
        return [r for m, _, r in self.requests if m == method]


_DEFAULT_KNOBS = {
    "fail_first": 0, "fail_every": 0, "fail_status": 503, "cut_first": 0, "cut_every": 0,
    "cut_at": 1000, "ignore_range": False, "delay": 0.0, "trickle": 0.0, "lose_nth": 0,
    "methods": Faults.methods, "only": "", "stall": False, "swap": {},
}  # fmt: skip


def _error_body(status: int) -> bytes:
    """An S3-style error document: botocore reads the code from it, so a 501 must not say
    ``SlowDown`` (which is retried whatever the status)."""
    if status == 503:
        return SLOWDOWN_XML
    code = http.HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>injected HTTP {status}</Message></Error>"
    ).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # quiet tests
        pass

    def _gate(self) -> bool:
        """Apply delay / 503 faults; True when the request was answered already."""
        faults = self.server.faults
        fail, self._cut, self._lose = faults.decide(
            self.command, self.path, self.headers.get("Range")
        )
        self._faulted = faults.only in self.path
        if faults.delay and self.command in faults.methods and self._faulted:
            time.sleep(faults.delay)
        if fail:
            self._drain()
            body = _error_body(faults.fail_status)
            self.send_response(faults.fail_status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(body)
            return True
        return False

    def _drain(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send_body(
        self, status: int, headers: dict[str, str], body: bytes, length: int | None = None
    ) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command == "HEAD":
            return
        if self._cut:
            # Promise len(body) bytes, send fewer, hang up: a truncated body.
            self.wfile.write(body[: self.server.faults.cut_at])
            self.wfile.flush()
            self.close_connection = True
            if self.server.faults.stall:
                self.server.stopping.wait(120)  # silence; bounded so no thread outlives long
            return
        if self.server.faults.trickle and self.command == "GET" and self._faulted:
            self._trickle(body)
            return
        try:
            for i in range(0, len(body), 64 << 10):
                self.wfile.write(body[i : i + (64 << 10)])
                self.server.faults.count_sent(min(64 << 10, len(body) - i))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client had what it wanted and hung up

    def _trickle(self, body: bytes) -> None:
        """Send ``body`` a byte at a time until it is sent, the client hangs up or the
        server stops (so no handler thread outlives its test)."""
        self.close_connection = True
        for i in range(len(body)):
            if self.server.stopping.wait(self.server.faults.trickle):
                return
            try:
                self.wfile.write(body[i : i + 1])
            except (BrokenPipeError, ConnectionResetError):
                return
            self.server.faults.count_sent(1)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: a reader's burst of 16+ new connections
    # (windows read ahead together) overflowed it, the kernel dropped SYNs and each such
    # GET waited out the 1 s SYN retransmit (seen as ~1 s stalls in the bench's S3 rows,
    # counted by TcpExtListenDrops). Real servers listen deeper (nginx: 511; werkzeug,
    # moto's server: 128).
    request_queue_size = 128
    faults: Faults
    stopping: threading.Event

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that hangs up early (it had the bytes it wanted) is normal here.
        pass


class _FileHandler(_Handler):
    server: _FileServerImpl

    def _file(self) -> Path | None:
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        swap = self.server.faults.swap  # by the path with its query, else by the path
        rel = swap.get(unquote(self.path).lstrip("/"), swap.get(rel, rel))
        path = (self.server.root / rel).resolve()
        if self.server.root not in path.parents and path != self.server.root:
            return None
        return path

    def _auth_ok(self) -> bool:
        want = self.server.auth_header
        if want is None or self.headers.get("Authorization") == want:
            return True
        self._drain()
        self._send_body(401, {}, b"unauthorized")
        return False

    def do_GET(self) -> None:
        if self._gate() or not self._auth_ok():
            return
        path = self._file()
        if path is None or not path.is_file():
            self._send_body(404, {}, b"not found")
            return
        data = path.read_bytes()
        rng = self.headers.get("Range")
        if rng is None or self.server.faults.ignore_range:
            self._send_body(200, {"Accept-Ranges": "bytes"}, data)
            return
        first_s, _, last_s = rng.removeprefix("bytes=").partition("-")
        first = int(first_s)
        last = min(int(last_s), len(data) - 1) if last_s else len(data) - 1
        if first >= len(data):
            self._send_body(416, {"Content-Range": f"bytes */{len(data)}"}, b"")
            return
        headers = {"Content-Range": f"bytes {first}-{last}/{len(data)}"}
        self._send_body(206, headers, data[first : last + 1])

    do_HEAD = do_GET

    def do_PUT(self) -> None:
        if self._gate() or not self._auth_ok():
            return
        body = self._drain()
        path = self._file()
        if path is None:
            self._send_body(403, {}, b"forbidden")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".put-")
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
        self._send_body(201, {}, b"")

    def do_DELETE(self) -> None:
        if self._gate() or not self._auth_ok():
            return
        path = self._file()
        if path is None or not path.is_file():
            self._send_body(404, {}, b"not found")
            return
        path.unlink()
        self._send_body(204, {}, b"")


class _FileServerImpl(_Server):
    root: Path
    auth_header: str | None


class _ProxyHandler(_Handler):
    server: _ProxyServerImpl

    def _forward(self) -> None:
        with self.server.forwarding:
            self._forward_one()

    def _forward_one(self) -> None:
        if self._gate():
            return
        body = self._drain()
        host, port = self.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=30)
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in ("connection", "expect")
        }
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            length = resp.getheader("Content-Length") if self.command == "HEAD" else None
            passed = {
                k: v
                for k, v in resp.getheaders()
                if k.lower() not in ("content-length", "connection", "transfer-encoding")
            }
        finally:
            conn.close()
        if self._lose:
            self._send_body(503, {"Content-Type": "application/xml"}, SLOWDOWN_XML)
            return
        self._send_body(resp.status, passed, data, int(length) if length else None)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class _InFlight:
    """Requests a proxy is handling (a context manager per request): a delayed request
    still reaches the upstream after its client was killed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count = 0

    def __enter__(self) -> None:
        with self._cond:
            self.count += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self.count -= 1
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is being handled; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self.count == 0, timeout)


class _ProxyServerImpl(_Server):
    upstream: tuple[str, int]
    forwarding: _InFlight


class _Running:
    """Start/stop a server thread; a context manager."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        server.stopping = threading.Event()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.faults = server.faults
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FileServer(_Running):
    """Serve ``root`` over HTTP on 127.0.0.1 (a free port), with :class:`Faults`.

    Args:
        root: the folder served; PUT writes into it.
        auth_header: if set, every request must carry exactly this Authorization header.
    """

    def __init__(self, root: str | os.PathLike[str], auth_header: str | None = None) -> None:
        server = _FileServerImpl(("127.0.0.1", 0), _FileHandler)
        server.root = Path(root).resolve()
        server.auth_header = auth_header
        server.faults = Faults()
        self.root = server.root
        super().__init__(server)

    def clear(self) -> None:
        """Delete everything served (between tests sharing one server)."""
        for child in self.root.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()


class FaultProxy(_Running):
    """Forward requests to ``upstream`` (host, port), injecting :class:`Faults`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        server = _ProxyServerImpl(("127.0.0.1", 0), _ProxyHandler)
        server.upstream = upstream
        server.faults = Faults()
        server.forwarding = _InFlight()
        super().__init__(server)
        self.forwarding = server.forwarding


class RawServer:
    """A TCP server on 127.0.0.1 whose accept loop hands each connection to
    :meth:`_accepted`; :meth:`stop` closes the connections it kept. A context manager.

    Args:
        backlog: connections the kernel queues before accept (bursts of read-ahead
            connections overflowed socketserver's 5).
    """

    def __init__(self, backlog: int = 128) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=backlog)
        self._sock.settimeout(0.05)  # the accept loop checks for stop() this often
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            self._conns.append(conn)
            self._accepted(conn)

    def _accepted(self, conn: socket.socket) -> None:
        """What the server does with a new connection (kept, closed by :meth:`stop`)."""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sock.close()
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass

    def __enter__(self: _Raw) -> _Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RequestServer(RawServer):
    """A :class:`RawServer` that reads HTTP/1.1 requests off each connection (a thread per
    connection, kept alive) and hands each to :meth:`_request`, which writes the answer by
    hand: the hostile servers' shared loop (tests/hostile_http.py, tests/hostile_heads.py).
    """

    def _accepted(self, conn: socket.socket) -> None:
        threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            f = conn.makefile("rb")
            while not self._stop.is_set():
                line = f.readline()
                if not line:
                    return
                method, path = line.split()[:2]
                headers = {}
                while (h := f.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                if not self._request(conn, method.decode(), path.decode("latin-1"), headers):
                    return
        except OSError:
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _request(
        self, conn: socket.socket, method: str, path: str, headers: dict[str, str]
    ) -> bool:
        """Answer one request on ``conn``; False when the connection is to be closed."""
        raise NotImplementedError


class SilentServer(RawServer):
    """Accept TCP connections on 127.0.0.1 and never answer: a hung endpoint (a stuck
    proxy, a process stopped under SIGSTOP). The connection succeeds and small requests fit
    in the socket buffers, so a client waits only on its read timeout. A context manager.

    Attributes:
        connections: how many connections were accepted (one per request attempt).
    """

    def __init__(self) -> None:
        self.connections = 0
        super().__init__()

    def _accepted(self, conn: socket.socket) -> None:
        self.connections += 1  # kept open, never written to
