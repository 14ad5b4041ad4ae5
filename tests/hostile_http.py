"""A raw-socket HTTP server that answers ranged GETs of one object the way a hostile or broken
server might (tests/test_storage_hostile_body.py, tools/faultlib/http_body.py).

Each answer is written by hand (no ``http.server``), so it can lie in its status, headers and
body: ``HostileServer(data, mode)`` answers GETs of any path with ``data`` (or of the path's object, when ``data`` maps
names to bytes; other paths 404) according to
``mode`` (see :data:`MODES`); ``mode`` may change per request through ``plan(n, first, last)``,
a function of the request's number and its asked range returning a mode name. ``HEAD``
answers the size truthfully.
"""

from __future__ import annotations

import gzip
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping

from tests.servers import RequestServer

# What each mode does to a GET of bytes [a, b] (inclusive, as asked):
MODES = {
    "ok": "a correct 206",
    "full200": "200 with the whole object and its Content-Length (Range ignored)",
    "full200_chunked": "200 with the whole object, chunked, no Content-Length",
    "shifted": "206 whose Content-Range and body start 7 bytes after the asked byte",
    "no_content_range": "206 without Content-Range, the body from byte 0 of the object",
    "cl_long": "Content-Length 10 more than the range, the range's bytes, then close",
    "cl_short": "Content-Range as asked, Content-Length and body 10 bytes short",
    "cr_short": "Content-Range and Content-Length of the range's first half (at least 1 byte)",
    "cr_mismatch": "Content-Range as asked, Content-Length and body 1 byte longer",
    "extra": "a correct 206 followed by 64 bytes of garbage on the kept-alive connection",
    "chunked206": "206 with Content-Range, chunked, no Content-Length",
    "gzip": "206 Content-Encoding: gzip (the range compressed), Content-Length compressed",
    "cut": "a correct 206 cut after a random part of its body",
    "changed": "a correct 206 of another version of the object (bytes differ, new ETag)",
    "slow_body": "a correct 206, one body byte every 0.2 s",
    "slow_headers": "the status line and headers one byte every 0.2 s, without end",
    "close_after_headers": "a correct 206's headers, then close",
    "416": "416 Range Not Satisfiable",
    "empty206": "206 with Content-Range as asked and Content-Length 0",
    "reset": "the connection reset at once (RST, no answer)",
    "503": "503 Service Unavailable",
}


def other(data: bytes) -> bytes:
    """Another version of the object: same size, different bytes."""
    return bytes(b ^ 0x5A for b in data)


class HostileServer(RequestServer):
    """Threaded raw HTTP/1.1 server on 127.0.0.1 (a context manager).

    Args:
        data: the object's bytes (served at every path).
        plan: the mode of each GET: a name from :data:`MODES`, or a function of (request
            number from 0, first asked byte, last asked byte or None) returning one.
        seed: seeds the cut points of ``cut``.
    """

    def __init__(
        self, data: bytes | Mapping[str, bytes], plan: str | Callable[[int, int, int | None], str],
        seed: int = 0,
    ) -> None:  # fmt: skip
        self.data = data
        self.plan = plan if callable(plan) else (lambda n, a, b, m=plan: m)
        self.rng = random.Random(seed)
        self.gets = 0
        self.seen: list[tuple[str, str | None]] = []  # (mode, Range header) per GET
        self._lock = threading.Lock()
        super().__init__()

    def _request(
        self, conn: socket.socket, method: str, path: str, headers: dict[str, str]
    ) -> bool:
        data = self._object(path)
        if data is None:
            conn.sendall(_head(404, {"Content-Length": 0}))
            return True
        return self._answer(conn, data, method, headers.get("range"))

    def _object(self, path: str) -> bytes | None:
        if isinstance(self.data, bytes):
            return self.data
        return self.data.get(path.split("?")[0].lstrip("/"))

    def _answer(self, conn: socket.socket, data: bytes, method: str, rng: str | None) -> bool:
        """Write one answer; False when the connection is to be closed."""
        if method == "HEAD":
            conn.sendall(_head(200, {"Content-Length": len(data)}))
            return True
        a, b = 0, None
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            a, b = int(first), int(last) if last else None
        with self._lock:
            n = self.gets
            self.gets += 1
            mode = self.plan(n, a, b)
            cut_frac = self.rng.random()
            self.seen.append((mode, rng))
        last = len(data) - 1 if b is None else min(b, len(data) - 1)
        if a >= len(data) and mode not in ("reset", "503", "slow_headers"):
            mode = "416"
        body = data[a : last + 1]
        cr = f"bytes {a}-{last}/{len(data)}"
        etag = '"v1"'
        if mode == "changed":
            body, etag = other(data)[a : last + 1], '"v2"'
            mode = "ok"
        if mode == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if mode == "503":
            conn.sendall(_head(503, {"Content-Length": 0}))
            return True
        if mode == "416":
            conn.sendall(_head(416, {"Content-Range": f"bytes */{len(data)}", "Content-Length": 0}))
            return True
        if mode in ("ok", "extra", "cut", "slow_body", "close_after_headers"):
            conn.sendall(
                _head(206, {"Content-Range": cr, "Content-Length": len(body), "ETag": etag})
            )
            if mode == "close_after_headers":
                return False
            if mode == "cut":
                conn.sendall(body[: int(len(body) * cut_frac)])
                return False
            if mode == "slow_body":
                for i in range(len(body)):
                    if self._stop.is_set():
                        return False
                    conn.sendall(body[i : i + 1])
                    time.sleep(0.2)
                return True
            conn.sendall(body + (b"X" * 64 if mode == "extra" else b""))
            return True
        if mode == "full200":
            conn.sendall(_head(200, {"Content-Length": len(data)}) + data)
            return True
        if mode in ("full200_chunked", "chunked206"):
            status, extra = (200, {}) if mode == "full200_chunked" else (206, {"Content-Range": cr})
            payload = data if status == 200 else body
            conn.sendall(_head(status, {**extra, "Transfer-Encoding": "chunked"}))
            for i in range(0, len(payload), 4096):
                piece = payload[i : i + 4096]
                conn.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            conn.sendall(b"0\r\n\r\n")
            return True
        if mode == "shifted":
            s = a + 7
            piece = data[s : last + 1]
            conn.sendall(_head(206, {"Content-Range": f"bytes {s}-{last}/{len(data)}",
                                     "Content-Length": len(piece)}) + piece)  # fmt: skip
            return True
        if mode == "no_content_range":
            conn.sendall(_head(206, {"Content-Length": len(body)}) + data[: len(body)])
            return True
        if mode == "cl_long":
            conn.sendall(_head(206, {"Content-Range": cr, "Content-Length": len(body) + 10}) + body)
            return False
        if mode == "cl_short":
            piece = body[:-10]
            conn.sendall(_head(206, {"Content-Range": cr, "Content-Length": len(piece)}) + piece)
            return True
        if mode == "cr_short":
            piece = body[: max(1, len(body) // 2)]
            short = f"bytes {a}-{a + len(piece) - 1}/{len(data)}"
            conn.sendall(_head(206, {"Content-Range": short, "Content-Length": len(piece)}) + piece)
            return True
        if mode == "cr_mismatch":
            piece = data[a : last + 2]
            conn.sendall(_head(206, {"Content-Range": cr, "Content-Length": len(piece)}) + piece)
            return True
        if mode == "gzip":
            packed = gzip.compress(body)
            conn.sendall(_head(206, {"Content-Range": cr, "Content-Length": len(packed),
                                     "Content-Encoding": "gzip"}) + packed)  # fmt: skip
            return True
        if mode == "empty206":
            conn.sendall(_head(206, {"Content-Range": cr, "Content-Length": 0}))
            return True
        if mode == "slow_headers":
            line = b"HTTP/1.1 206 Partial Content\r\n" + b"X-Slow: " + b"a" * 10_000
            for i in range(len(line)):
                if self._stop.is_set():
                    return False
                conn.sendall(line[i : i + 1])
                time.sleep(0.2)
            return False
        raise ValueError(f"unknown mode {mode!r}")


def _head(status: int, headers: dict[str, object]) -> bytes:
    reasons = {
        200: "OK",
        404: "Not Found",
        206: "Partial Content",
        416: "Range Not Satisfiable",
        503: "Unavailable",
    }
    lines = [f"HTTP/1.1 {status} {reasons[status]}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
