"""Answers whose status line or headers lie or break HTTP/1.1 (tests/hostile_heads.py): a
ranged read gets the asked bytes (the object's, read here) or a RemoteReadError naming the
URL and the byte offset; never another exception, wrong bytes or a wait past its deadline."""

from __future__ import annotations

import time

import pytest

from tests.hostile_heads import HEADS, HeadServer
from wdstream.errors import RemoteReadError
from wdstream.storage import open_store

DATA = bytes(range(256)) * 40
LIMITS = {"retries": 1, "timeout": 1.0, "deadline": 1.5, "budget": 3.0, "backoff": 0.01}
SLOW = {"a header byte every 0.2 s"}
# Must give the bytes: legal HTTP/1.1 (a lenient reading where RFC 9112 allows it).
READ = {
    "ok", "cl blanks around", "cl 000N", "status without reason", "HTTP/1.0", "LF line ends",
    "100 Continue first", "103 Early Hints first", "three 1xx first", "chunked and cl",
    "200 whole object", "200 whole, cr of the range", "obs-fold first line",
}  # fmt: skip
# Must fail (before: a bare ValueError / InvalidHeader naming nothing, or a 2xx that is not
# the object taken for it).
REFUSED = {
    "cl superscript digits", "cr superscript", "cl twice, 3 first", "status 204",
    "status 203", "status 226", "status 299", "101 Switching Protocols",
}  # fmt: skip


def _read(mode: str, a: int, b: int) -> bytes | RemoteReadError:
    with HeadServer({"x.tar": DATA}, lambda n: mode) as server:
        store = open_store(server.base_url, **LIMITS)
        try:
            return bytes(store.read_range_view("x.tar", a, b))
        except RemoteReadError as exc:
            return exc


@pytest.mark.parametrize("mode", sorted(set(HEADS) - SLOW))
def test_a_hostile_head_gives_the_bytes_or_names_the_url_and_offset(mode: str) -> None:
    for a, b in ((100, 5000), (0, len(DATA)), (8000, 8001)):
        t = time.monotonic()
        got = _read(mode, a, b)
        assert time.monotonic() - t < 10
        if isinstance(got, RemoteReadError):
            assert mode not in READ, got
            assert "x.tar" in str(got) and f"byte {a}" in str(got), got
        else:
            assert mode not in REFUSED
            assert got == DATA[a:b], mode


def test_a_head_trickle_ends_at_the_deadline() -> None:
    t = time.monotonic()
    got = _read("a header byte every 0.2 s", 10, 20)
    assert isinstance(got, RemoteReadError) and "byte 10" in str(got)
    assert time.monotonic() - t < 2 * LIMITS["budget"]


@pytest.mark.parametrize("length", [b"\xb2", b"-5", b"1e3", b"0x10"])
def test_a_head_s_odd_size_is_a_remote_read_error(length: bytes) -> None:
    with HeadServer({"x.tar": DATA}, lambda n: "ok", head=length) as server:
        with pytest.raises(RemoteReadError, match="x.tar.*Content-Length"):
            open_store(server.base_url, **LIMITS).size("x.tar")


@pytest.mark.parametrize(
    "mode", ["te 'chunked ' (blank)", "te identity, chunked", "te twice", "te 'chunked ', a cookie"]
)
def test_a_chunked_body_is_never_landed_as_the_object_s_bytes(mode: str) -> None:
    """The first answer chunked under a Transfer-Encoding ``http.client`` did not take for
    chunked, then good ones: its chunk sizes were landed as bytes received, the read
    resumed after them and returned them inside the range (no error). With a cookie the GETs
    go through ``requests`` (``http.client``'s own head parser): refused there, not landed."""
    with HeadServer({"x.tar": DATA}, lambda n: mode if n == 0 else "ok") as server:
        store = open_store(server.base_url, **LIMITS)
        try:
            got = bytes(store.read_range_view("x.tar", 0, len(DATA)))
        except RemoteReadError as exc:
            assert "cookie" in mode and "byte 0" in str(exc), exc
        else:
            assert got == DATA
