"""HttpStore's GETs straight to urllib3 (storage/http_get.py) send what ``requests`` sends,
and leave redirects and cookies to ``requests``: checked against ``requests`` itself."""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from wdstream.storage import open_store
from wdstream.storage.http import HttpStore

pytestmark = pytest.mark.timeout(30)

DATA = random.Random(11).randbytes(50_000)


class _Handler(BaseHTTPRequestHandler):
    """``/plain/s.tar``: DATA with ranges; ``/jar/s.tar``: the same, setting a cookie;
    ``/moved/s.tar``: 302 to ``/plain/s.tar``. Every request's headers are logged."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, str]]]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen.append((self.path, dict(self.headers.items())))  # type: ignore[attr-defined]
        self.server.ports.append(self.client_address[1])  # type: ignore[attr-defined]
        if self.path.startswith("/moved/"):
            self.send_response(302)
            self.send_header("Location", "/plain/" + self.path.rsplit("/", 1)[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        first, last = 0, len(DATA) - 1
        rng = self.headers.get("Range")
        if rng:
            a, b = rng.removeprefix("bytes=").split("-")
            first, last = int(a), min(int(b), len(DATA) - 1)
        body = DATA[first : last + 1]
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(DATA)}")
        if self.path.startswith("/jar/"):
            self.send_header("Set-Cookie", "session=abc; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.seen = []  # type: ignore[attr-defined]
    srv.ports = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: ThreadingHTTPServer, folder: str) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/{folder}/"


def _seen(srv: ThreadingHTTPServer) -> list[tuple[str, dict[str, str]]]:
    seen: list[tuple[str, dict[str, str]]] = srv.seen  # type: ignore[attr-defined]
    out = list(seen)
    seen.clear()
    return out


def test_same_request_as_requests(
    server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    root = _url(server, "plain").replace("//", "//alice:pw@", 1) + "?sig=a%2Fb c"
    store = open_store(root, headers={"X-Extra": "1"})
    assert isinstance(store, HttpStore)
    assert store.read_range("dir/s.tar", 100, 2000) == DATA[100:2000]
    ours = _seen(server)
    oracle = requests.get(
        root.replace("/?", "/dir/s.tar?"),
        headers={"X-Extra": "1", "Accept-Encoding": "identity", "Range": "bytes=100-1999"},
    )
    assert oracle.content == DATA[100:2000]
    assert ours == _seen(server)  # path, query and every header (auth, agent) alike


def test_redirect_is_followed_as_requests_does(server: ThreadingHTTPServer) -> None:
    store = open_store(_url(server, "moved"))
    assert store.read_range("s.tar", 10, 20_000) == DATA[10:20_000]
    assert store.read_range("s.tar", 5, 50) == DATA[5:50]
    paths = [(path, headers.get("Range")) for path, headers in _seen(server)]
    assert paths == [
        ("/moved/s.tar", "bytes=10-19999"),  # straight: the 302 turns the session over
        ("/moved/s.tar", "bytes=10-19999"),  # the same GET sent again through requests
        ("/plain/s.tar", "bytes=10-19999"),  # which follows the redirect, keeping Range
        ("/moved/s.tar", "bytes=5-49"),
        ("/plain/s.tar", "bytes=5-49"),
    ]


def test_cookies_are_kept_as_requests_keeps_them(server: ThreadingHTTPServer) -> None:
    store = open_store(_url(server, "jar"))
    for _ in range(3):
        assert store.read_range("s.tar", 0, 1000) == DATA[:1000]
    cookies = [headers.get("Cookie") for _, headers in _seen(server)]
    # first GET straight, sent again through requests (which keeps the cookie), then requests
    assert cookies == [None, None, "session=abc", "session=abc"]


def _read_in_child(store: HttpStore, out: multiprocessing.Queue[bytes]) -> None:
    out.put(store.read_range("s.tar", 3, 3000))


def test_forked_child_makes_its_own_pool(server: ThreadingHTTPServer) -> None:
    store = open_store(_url(server, "plain"))
    assert isinstance(store, HttpStore)
    assert store.read_range("s.tar", 0, 10) == DATA[:10]  # the parent's pool, connected
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[bytes] = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(store, out))
    child.start()
    assert out.get(timeout=20) == DATA[3:3000]
    child.join(20)
    assert child.exitcode == 0
    assert store.read_range("s.tar", 10, 20) == DATA[10:20]  # the parent's still works
    parent, child_port, parent_again = server.ports  # type: ignore[attr-defined]
    assert child_port != parent == parent_again  # the child connected anew; the parent reused
