"""A raw-socket HTTP server whose answers to GETs have hostile status lines and headers
(tests/test_storage_hostile_heads.py, tools/faultlib/http_heads.py).

``HeadServer(objects, plan)`` serves ``objects`` (name -> bytes; other paths 404, HEAD
answers the size truthfully) and writes each GET's answer by hand in the mode ``plan(n)``
names (``n``: the GET's number from 0), one of :data:`HEADS`: what a broken server, proxy
or CDN might send in place of ``206 Partial Content`` with ``Content-Range`` and
``Content-Length``. The body, where one is sent, is the asked bytes unless the mode says
otherwise. The oracle reading it must be outside wdstream (the object's bytes).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping

from tests.servers import RequestServer

# A GET of bytes [a, last] of an object of n bytes: (status line, header lines, body, close).
Answer = tuple[bytes, list[bytes], bytes, bool]
Mode = Callable[[int, int, bytes], "Answer | list[bytes | float]"]


def _ok(a: int, last: int, data: bytes, cl: bytes | None = None, cr: bytes | None = None,
        extra: tuple[bytes, ...] = (), status: bytes = b"HTTP/1.1 206 Partial Content",
        body: bytes | None = None, close: bool = False) -> Answer:  # fmt: skip
    """A correct 206 of ``[a, last]``, with ``cl``/``cr`` in place of its Content-Length /
    Content-Range values (``b"-"``: left out) and header lines ``extra`` after them."""
    piece = data[a : last + 1] if body is None else body
    cl = str(len(piece)).encode() if cl is None else cl
    cr = b"bytes %d-%d/%d" % (a, last, len(data)) if cr is None else cr
    lines = ([] if cr == b"-" else [b"Content-Range: " + cr]) + (
        [] if cl == b"-" else [b"Content-Length: " + cl]
    )
    return status, lines + list(extra), piece, close


def _chunked(body: bytes) -> bytes:
    out = b"".join(b"%x\r\n" % len(body[i : i + 999]) + body[i : i + 999] + b"\r\n"
                   for i in range(0, len(body), 999))  # fmt: skip
    return out + b"0\r\n\r\n"


def _te(value: bytes, cl: bytes | None = b"-", chunk: bool = True) -> Mode:
    def mode(a: int, last: int, data: bytes) -> Answer:
        body = data[a : last + 1]
        s, lines, _, _ = _ok(a, last, data, cl=cl, extra=(b"Transfer-Encoding: " + value,))
        return s, lines, _chunked(body) if chunk else body, True

    return mode


def _raw(head: bytes) -> Mode:
    """Exactly ``head`` (whole, with its line ends), then the asked bytes."""

    def mode(a: int, last: int, data: bytes) -> list[bytes | float]:
        cr = b"bytes %d-%d/%d" % (a, last, len(data))
        cl = b"%d" % (last + 1 - a)
        return [head.replace(b"{cr}", cr).replace(b"{cl}", cl) + data[a : last + 1]]

    return mode


# Each mode: what a GET of [a, z] (z: its last byte) is answered with. Every answer must be read as the
# asked bytes, or fail naming the URL and the byte offset.
HEADS: dict[str, Mode] = {
    "ok": lambda a, z, d: _ok(a, z, d),
    "cl twice, same": lambda a, z, d: _ok(a, z, d, extra=(b"Content-Length: %d" % (z + 1 - a),)),
    "cl twice, 3 first": lambda a, z, d: (lambda s, h, b, c: (s, [b"Content-Length: 3", *h], b, True))(*_ok(a, z, d)),
    "cl +N": lambda a, z, d: _ok(a, z, d, cl=b"+%d" % (z + 1 - a)),
    "cl -5": lambda a, z, d: _ok(a, z, d, cl=b"-5", close=True),
    "cl blanks around": lambda a, z, d: _ok(a, z, d, cl=b"   %d \t" % (z + 1 - a)),
    "cl 1 0": lambda a, z, d: _ok(a, z, d, cl=b"1 0", close=True),
    "cl hex": lambda a, z, d: _ok(a, z, d, cl=b"0x%x" % (z + 1 - a), close=True),
    "cl 40 nines": lambda a, z, d: _ok(a, z, d, cl=b"9" * 40, close=True),
    "cl 000N": lambda a, z, d: _ok(a, z, d, cl=b"000%d" % (z + 1 - a)),
    "cl superscript digits": lambda a, z, d: _ok(a, z, d, cl=b"\xb9\xb2", close=True),
    "cl 1_0": lambda a, z, d: _ok(a, z, d, cl=b"1_0", close=True),
    "cl N NUL": lambda a, z, d: _ok(a, z, d, cl=b"%d\x00" % (z + 1 - a), close=True),
    "cl empty": lambda a, z, d: _ok(a, z, d, cl=b"", close=True),
    "cr superscript": lambda a, z, d: _ok(a, z, d, cr=b"bytes \xb2-\xb3/%d" % len(d), close=True),
    "cr total superscript": lambda a, z, d: _ok(a, z, d, cr=b"bytes %d-%d/\xb9" % (a, z), close=True),
    "cr +start": lambda a, z, d: _ok(a, z, d, cr=b"bytes +%d-%d/%d" % (a, z, len(d)), close=True),
    "cr items unit": lambda a, z, d: _ok(a, z, d, cr=b"items %d-%d/%d" % (a, z, len(d)), close=True),
    "cr total below end": lambda a, z, d: _ok(a, z, d, cr=b"bytes %d-%d/%d" % (a, z, z), close=True),
    "cr past the body": lambda a, z, d: _ok(a, z, d, cr=b"bytes %d-%d/%d" % (a, z + 5, len(d)), cl=b"-", close=True),
    "cr one byte late": lambda a, z, d: _ok(a, z, d, cr=b"bytes %d-%d/%d" % (a + 1, z, len(d)), body=d[a + 1 : z + 1], close=True),
    "cr twice": lambda a, z, d: _ok(a, z, d, extra=(b"Content-Range: bytes 0-0/%d" % len(d),), close=True),
    "cr blank inside": lambda a, z, d: _ok(a, z, d, cr=b"bytes %d -%d/%d" % (a, z, len(d)), close=True),
    "chunked and cl": _te(b"chunked", cl=None),
    "chunked and cl, body not chunked": _te(b"chunked", cl=None, chunk=False),
    "chunked and a wrong cl": _te(b"chunked", cl=b"3"),
    "te 'chunked ' (blank)": _te(b"chunked "),
    "te identity, chunked": _te(b"identity, chunked"),
    "te gzip": _te(b"gzip", cl=None, chunk=False),
    "te 'chunked ', a cookie": _te(b"chunked \r\nSet-Cookie: a=b"),
    "te twice": lambda a, z, d: (lambda s, h, b, c: (s, [*h, b"Transfer-Encoding: identity", b"Transfer-Encoding: chunked"], _chunked(b), True))(*_ok(a, z, d, cl=b"-")),
    "obs-fold in cr": lambda a, z, d: _ok(a, z, d, cr=b"bytes %d-%d\r\n /%d" % (a, z, len(d)), close=True),
    "obs-fold first line": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 206 Partial Content\r\n X-A: b"),
    "line without colon first": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 206 Partial Content\r\nGarbage line", close=True),
    "line without colon last": lambda a, z, d: _ok(a, z, d, extra=(b"Garbage line",), close=True),
    "name with a blank": lambda a, z, d: _raw(b"HTTP/1.1 206 Partial Content\r\nContent-Range : {cr}\r\nContent-Length : {cl}\r\n\r\n")(a, z, d),
    "empty name": lambda a, z, d: _ok(a, z, d, extra=(b": v",), close=True),
    "From line": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 206 Partial Content\r\nFrom x", close=True),
    "NUL in a value": lambda a, z, d: _ok(a, z, d, extra=(b"X-A: a\x00b",)),
    "form feed smuggling a cl": lambda a, z, d: _ok(a, z, d, extra=(b"X-A: a\x0cContent-Length: 3",), close=True),
    "NEL smuggling a cl": lambda a, z, d: _ok(a, z, d, extra=(b"X-A: a\x85Content-Length: 3",), close=True),
    "LF line ends": lambda a, z, d: _raw(b"HTTP/1.1 206 Partial Content\nContent-Range: {cr}\nContent-Length: {cl}\n\n")(a, z, d),
    "CR line ends": lambda a, z, d: _raw(b"HTTP/1.1 206 Partial Content\rContent-Range: {cr}\rContent-Length: {cl}\r\r")(a, z, d),
    "multipart type": lambda a, z, d: _ok(a, z, d, extra=(b"Content-Type: multipart/byteranges; boundary=X",), close=True),
    "encodings identity, gzip": lambda a, z, d: _ok(a, z, d, extra=(b"Content-Encoding: identity", b"Content-Encoding: gzip"), close=True),
    "status without reason": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 206"),
    "HTTP/1.0": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.0 206 Partial Content", close=True),
    "HTTP/2": lambda a, z, d: _ok(a, z, d, status=b"HTTP/2 206 Partial Content", close=True),
    "status 2O6": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 2O6 Partial Content", close=True),
    "status +206": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 +206 Partial Content", close=True),
    "status 99": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 99 Odd", close=True),
    "status 204": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 204 No Content", close=True),
    "status 203": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 203 Non-Authoritative", close=True),
    "status 226": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 226 IM Used", close=True),
    "status 299": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 299 Odd", close=True),
    "200 whole object": lambda a, z, d: _ok(0, len(d) - 1, d, status=b"HTTP/1.1 200 OK", cr=b"-", close=True),
    "200 whole, cr of the range": lambda a, z, d: _ok(0, len(d) - 1, d, status=b"HTTP/1.1 200 OK", cr=b"bytes %d-%d/%d" % (a, z, len(d)), close=True),
    "503, Retry-After nan": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 503 Busy", extra=(b"Retry-After: nan",), body=b"", cr=b"-"),
    "503, Retry-After 1e999": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 503 Busy", extra=(b"Retry-After: 1e999",), body=b"", cr=b"-"),
    "503, Retry-After -1": lambda a, z, d: _ok(a, z, d, status=b"HTTP/1.1 503 Busy", extra=(b"Retry-After: -1",), body=b"", cr=b"-"),
    "100 Continue first": lambda a, z, d: (lambda s, h, b, c: (b"HTTP/1.1 100 Continue\r\n\r\n" + s, h, b, c))(*_ok(a, z, d)),
    "103 Early Hints first": lambda a, z, d: (lambda s, h, b, c: (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + s, h, b, c))(*_ok(a, z, d)),
    "three 1xx first": lambda a, z, d: (lambda s, h, b, c: (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX: y\r\n\r\nHTTP/1.1 199 Odd\r\n\r\n" + s, h, b, c))(*_ok(a, z, d)),
    "101 Switching Protocols": lambda a, z, d: (b"HTTP/1.1 101 Switching Protocols", [b"Upgrade: h2c", b"Connection: Upgrade"], b"", True),
    "1xx forever": lambda a, z, d: [b"HTTP/1.1 100 Continue\r\n\r\n"] * 100_000,
    "header lines forever": lambda a, z, d: [b"HTTP/1.1 206 Partial Content\r\n"] + [b"X-%d: aaaa\r\n" % i for i in range(100_000)],
    "one 20 MB header line": lambda a, z, d: [b"HTTP/1.1 206 Partial Content\r\nX-A: "] + [b"a" * 65536] * 320,
    "one 20 MB status line": lambda a, z, d: [b"HTTP/1.1 206 "] + [b"a" * 65536] * 320,
    "a header byte every 0.2 s": lambda a, z, d: [b"HTTP/1.1 206 Partial Content\r\n"] + [x for i in range(10_000) for x in (0.2, b"X-%d: a\r\n" % i)],
    "closed mid-status": lambda a, z, d: [b"HTTP/1.1 20"],
    "closed mid-header": lambda a, z, d: [b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\nContent-Le" % (a, z, len(d))],
    "closed mid-cl": lambda a, z, d: [b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: 1" % (a, z, len(d))],
    "closed after the status": lambda a, z, d: [b"HTTP/1.1 206 Partial Content\r\n"],
}  # fmt: skip


class HeadServer(RequestServer):
    """Threaded raw HTTP/1.1 server on 127.0.0.1 (a context manager).

    Args:
        objects: name -> bytes, served at ``/name`` (any query string ignored).
        plan: each GET's mode, a name of :data:`HEADS`, from the GET's number (from 0).
        head: the Content-Length value a HEAD answers with (None: the object's size).
    """

    def __init__(
        self, objects: Mapping[str, bytes], plan: Callable[[int], str], head: bytes | None = None
    ) -> None:
        self.objects, self.plan, self.head = objects, plan, head
        self.gets = 0
        self.seen: list[str] = []
        self._lock = threading.Lock()
        super().__init__()

    def _request(
        self, conn: socket.socket, method: str, path: str, headers: dict[str, str]
    ) -> bool:
        data = self.objects.get(path.split("?")[0].lstrip("/"))
        if data is None:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        elif method == "HEAD":
            size = b"%d" % len(data) if self.head is None else self.head
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: " + size + b"\r\n\r\n")
        else:
            return self._answer(conn, data, headers.get("range"))
        return True

    def _answer(self, conn: socket.socket, data: bytes, asked: str | None) -> bool:
        """Write one answer; False when the connection is to be closed."""
        a, last = 0, len(data) - 1
        if asked and asked.startswith("bytes="):
            first, _, end = asked[6:].partition("-")
            a, last = int(first), min(int(end), last) if end else last
        with self._lock:
            mode = self.plan(self.gets)
            self.gets += 1
            self.seen.append(mode)
        if a > last:
            conn.sendall(b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n")
            return True
        answer = HEADS[mode](a, last, data)
        if isinstance(answer, list):  # raw pieces (bytes, or seconds to sleep), then close
            for piece in answer:
                if self._stop.is_set():
                    return False
                if isinstance(piece, float):
                    time.sleep(piece)
                else:
                    conn.sendall(piece)
            return False
        status, lines, body, close = answer
        conn.sendall(status + b"\r\n" + b"".join(h + b"\r\n" for h in lines) + b"\r\n" + body)
        return not close
