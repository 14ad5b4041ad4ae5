"""An answer's head parsed without ``email`` (storage/http_head.py) is what ``http.client``
makes of it: the same headers, values, order, defects and payload, and the same status,
length, chunking and keep-alive, for plain heads and odd ones alike (which go to ``email``)."""

from __future__ import annotations

import email.parser
import http.client
import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdstream.storage import http_head, open_store

NGINX = (
    b"Server: nginx/1.22.1\r\nDate: Wed, 02 Dec 2026 20:40:43 GMT\r\n"
    b"Content-Type: application/octet-stream\r\nContent-Length: 10\r\n"
    b"Last-Modified: Wed, 02 Dec 2026 20:34:56 GMT\r\nConnection: keep-alive\r\n"
    b'ETag: "6b1080f0-a60"\r\nContent-Range: bytes 0-9/2656\r\n\r\n'
)
ODD = [
    b"A: b  \r\nB:\tc\r\n folded\r\n\r\n",  # trailing blanks kept, a folded line
    b"From someone\r\nA: 1\r\n\r\n",
    b": empty name\r\nA: 1\r\n\r\n",
    b"No colon here\r\nA: 1\r\n\r\n",
    b"A: 1\rB: 2\r\n\r\n",  # a bare CR: email splits the line there
    b"A: 1\r\na: 2\r\nContent-Type: multipart/byteranges; boundary=x\r\n\r\n",
    b"Content-Type: message/rfc822\r\n\r\n",
    b"X-Latin: caf\xe9\r\nX-Empty:\r\nX-Tab:\t\t v \t\r\n\r\n",
    b"Bad Name: 1\r\nA: 2\r\n\r\n",
    b"A: 1\nB: 2\n\n",  # LF only
    b"Content-Type: \x0bmessage/rfc822\r\n\r\n",  # blanks only str.strip knows
    b"Content-Type:\xa0multipart/x\r\n\r\n",
    b"Content-Type: \x1cmultipart/byteranges; boundary=x\r\n\r\n",
    b"\r\n",
    b"",
]


def _lines(raw: bytes) -> list[bytes]:
    return http.client._read_headers(io.BytesIO(raw))  # type: ignore[attr-defined]


def _payload(msg: Any) -> Any:
    """A message's payload, its parts (messages) by their headers."""
    got = msg.get_payload()
    return [part.items() for part in got] if isinstance(got, list) else got


def _same(raw: bytes) -> http.client.HTTPMessage:
    """``parse_head`` of ``raw``'s lines, checked against ``http.client.parse_headers``."""
    fast = http_head.parse_head(_lines(raw))
    want = http.client.parse_headers(io.BytesIO(raw))
    assert fast.items() == want.items()
    assert [type(d) for d in fast.defects] == [type(d) for d in want.defects]
    assert _payload(fast) == _payload(want)
    assert fast.is_multipart() == want.is_multipart()
    for name in {k for k, _ in want.items()} | {"content-length", "absent"}:
        for variant in (name, name.lower(), name.upper()):
            assert fast.get(variant) == want.get(variant)
            assert fast.get_all(variant) == want.get_all(variant)
            assert (variant in fast) == (variant in want)
    return fast


def test_a_plain_head_skips_email() -> None:
    """nginx's head is built directly (no ``email`` parser), with email's answers."""
    assert type(_same(NGINX)) is http_head.FastMessage


@pytest.mark.parametrize("raw", ODD)
def test_odd_heads_as_email_parses_them(raw: bytes) -> None:
    _same(raw)


_LINE = st.binary(min_size=0, max_size=24).map(lambda b: b.replace(b"\n", b""))
_CHARS = st.sampled_from([b"A", b"a", b"-", b":", b" ", b"\t", b"\r", b"\xe9", b"1", b"F"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_LINE, st.lists(_CHARS, max_size=12).map(b"".join)), max_size=6))
def test_any_head_as_email_parses_it(lines: list[bytes]) -> None:
    _same(b"".join(line + b"\r\n" for line in lines) + b"\r\n")


class _Sock:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._data))


_STATUS = [
    b"HTTP/1.1 206 Partial Content\r\n" + NGINX,
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\nX: 1\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\n",
    b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */10\r\n\r\n",
]


def _state(resp: Any) -> tuple[Any, ...]:
    return (resp.status, resp.reason, resp.version, resp.length, resp.chunked,
            resp.will_close, resp.msg.items())  # fmt: skip


@pytest.mark.parametrize("raw", _STATUS)
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_begin_as_http_client(raw: bytes, method: str) -> None:
    fast = http.client.HTTPResponse(_Sock(raw), method=method)  # type: ignore[arg-type]
    http_head.begin(fast)
    want = http.client.HTTPResponse(_Sock(raw), method=method)  # type: ignore[arg-type]
    want.begin()
    assert _state(fast) == _state(want)


@pytest.mark.parametrize("raw", [b"HTTP/2 200 OK\r\n\r\n", b"garbage\r\n\r\n", b""])
def test_begin_fails_as_http_client(raw: bytes) -> None:
    with pytest.raises(http.client.HTTPException) as want:
        http.client.HTTPResponse(_Sock(raw)).begin()  # type: ignore[arg-type]
    with pytest.raises(type(want.value)):
        http_head.begin(http.client.HTTPResponse(_Sock(raw)))  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        a, b = self.headers["Range"].removeprefix("bytes=").split("-")
        body = bytes(range(256))[int(a) : int(b) + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {a}-{b}/256")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_store_gets_parse_no_email(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's ranged GETs (nginx-like heads) never call ``email``'s parser (which the
    server's threads use for the requests)."""
    parsed: list[str] = []
    me = threading.get_ident()
    real = email.parser.Parser.parsestr

    def parsestr(self: Any, text: str, headersonly: bool = False) -> Any:
        if threading.get_ident() == me:
            parsed.append(text)
        return real(self, text, headersonly)

    monkeypatch.setattr(email.parser.Parser, "parsestr", parsestr)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        store = open_store(f"http://127.0.0.1:{srv.server_address[1]}/d")
        for a in range(0, 200, 50):
            assert store.read_range("x.tar", a, a + 40) == bytes(range(a, a + 40))
    finally:
        srv.shutdown()
        srv.server_close()
    assert parsed == []
