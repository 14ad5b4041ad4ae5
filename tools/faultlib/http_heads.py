"""Hostile answer heads: status lines and headers that lie or break HTTP/1.1 (session 44).

The HTTP store reads answers' heads with its own code since session 43
(``storage/http_head.py``: ``email``'s parser only for odd lines). A raw-socket server
(``tests/hostile_heads.py``) answers GETs of the clean dataset's objects with one of ~70
heads: Content-Length twice (equal, unequal), signed, hex, 40 digits, Latin-1 digits, NUL,
empty; Content-Range of another unit, start, total or end, twice, folded; Transfer-Encoding
chunked beside a Content-Length, ``chunked `` with a blank, ``identity, chunked``, two
headers, gzip; obs-fold, a line without a colon, an empty name, ``From ``, NUL, form feed or
NEL "smuggling" a Content-Length, LF-only and CR-only line ends; no reason, HTTP/1.0,
HTTP/2, ``2O6``, ``+206``, 99, 203, 204, 226, 299, a 200 with the whole object; 100, 103,
three 1xx or 1xx forever before the answer, 101; header lines forever, a 20 MB header or
status line, a header every 0.2 s; the connection closed mid-status, mid-header, mid-value.

Attempts: every GET so answered, or each range's first GET only (its retries answered
well: what the hostile answer landed must not stay), ranges read through the store (oracle: the shard's bytes
read with ``open()``; an error must be a RemoteReadError naming the shard and a byte offset);
the Loader over HTTP (a ``wdstream pack`` of JSON lines, served) with a seeded share of
the GETs so answered, at 0 and 2 workers (oracle: its rows over the local copy); the heads without end with the process's peak RSS (ru_maxrss)
measured (more than 64 MiB more is a crash); a HEAD's odd Content-Length for ``size``; and
``parse_head`` against ``http.client.parse_headers`` on 20,000 random heads of hostile bytes.
"""

from __future__ import annotations

import http.client
import io
import random
import resource
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from faultlib.common import Attempt, clean_dataset, compare, labelled, read_rows
from faultlib.packs import pack_input
from wdstream.errors import RemoteReadError, WdstreamError
from wdstream.storage import open_store
from wdstream.storage.http_head import parse_head

LIMITS: dict[str, Any] = {
    "retries": 2,
    "timeout": 1.0,
    "deadline": 2.0,
    "budget": 4.0,
    "backoff": 0.02,
}
SLOW = ("a header byte every 0.2 s",)
ENDLESS = ("header lines forever", "one 20 MB header line", "one 20 MB status line",
           "1xx forever")  # fmt: skip
MEMORY = 64 << 20  # peak RSS growth allowed for a head without end


def _server() -> tuple[dict[str, Callable], type]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from hostile_heads import HEADS, HeadServer  # the storage tests' hostile head server

    return HEADS, HeadServer


def _ranges(
    server_cls: type, objects: dict[str, bytes], shard: str, mode: str, first: bool = False
) -> str:
    """Ranges of ``shard`` read with every GET answered in ``mode`` (``first``: only each
    range's first GET, its retries answered well: bytes it landed must not stay)."""
    data = objects[shard]
    rng = random.Random(mode)
    spans = [(0, len(data)), (len(data) - 1, len(data))]
    spans += [(a, a + rng.choice([1, 512, 5000])) for a in rng.sample(range(len(data)), 3)]
    asked: set[int] = set()  # the number of each range's first GET
    refused = 0
    with server_cls(objects, lambda n: "ok" if first and n not in asked else mode) as server:
        store = open_store(server.base_url, **LIMITS)
        for a, b in spans:
            asked.add(server.gets)
            try:
                got = bytes(store.read_range_view(shard, a, b))
            except WdstreamError as exc:
                if shard not in str(exc) or "byte" not in str(exc):
                    return labelled(mode, f"crash: not naming the shard and offset: {exc}")
                refused += 1
                continue
            if got != data[a:b]:
                return labelled(mode, f"silent wrong: bytes [{a}, {b}) of {shard} differ")
    return "clear error" if refused else "handled"


def _endless(server_cls: type, objects: dict[str, bytes], shard: str, mode: str) -> str:
    """A head without end: a clear error within the retries' budget, the memory bounded."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    t = time.monotonic()
    outcome = _ranges(server_cls, objects, shard, mode)
    took = time.monotonic() - t
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - before
    if grew > MEMORY:
        return labelled(mode, f"crash: peak RSS grew {grew >> 20} MiB")
    if took > 5 * (2 * LIMITS["budget"] + LIMITS["deadline"]):  # five ranges
        return labelled(mode, f"hang: {took:.1f} s")
    return outcome


def _size(server_cls: type, objects: dict[str, bytes], shard: str, head: bytes) -> str:
    with server_cls(objects, lambda n: "ok", head=head) as server:
        try:
            got = open_store(server.base_url, **LIMITS).size(shard)
        except RemoteReadError as exc:
            return "clear error" if shard in str(exc) else f"crash: {exc}"[:300]
    ok = head.strip().isdigit() and int(head) == got
    return "handled" if ok else labelled(repr(head), f"silent wrong: size {got}")


_BITS = [b"Content-Length", b"content-length", b"Transfer-Encoding", b"Content-Range",
         b"Content-Type", b"X", b"From", b"From ", b"", b" ", b"\t", b":", b": ", b"\r",
         b"\n", b"\r\n", b"\x00", b"\x0b", b"\x0c", b"\x1c", b"\x85", b"\xa0", b"\xff",
         b"chunked", b"12", b"\xb2", b"multipart/x", b"message/rfc822", b"=?utf-8?q?a?=",
         b"a", b" b"]  # fmt: skip


def _differential(seed: int, n: int) -> str:
    """``parse_head`` and ``http.client.parse_headers`` on ``n`` random heads."""
    rng = random.Random(seed)
    names = ("content-length", "transfer-encoding", "content-range", "content-type", "x")
    for _ in range(n):
        raw = b"".join(rng.choice(_BITS) for _ in range(rng.randrange(1, 30))) + b"\r\n\r\n"
        try:
            lines = http.client._read_headers(io.BytesIO(raw))  # type: ignore[attr-defined]
        except http.client.HTTPException:
            continue
        want = http.client.parse_headers(io.BytesIO(raw))
        got = parse_head(lines)
        a = [want.items(), [want.get_all(k) for k in names], len(want.defects)]
        b = [got.items(), [got.get_all(k) for k in names], len(got.defects)]
        if a != b or want.is_multipart() != got.is_multipart():
            return f"silent wrong: {raw!r} parsed as {b}, http.client: {a}"[:300]
    return "handled"


def http_heads(work: Path, scale: float) -> Iterator[Attempt]:
    root, _ = clean_dataset(work)
    objects = {p.name: p.read_bytes() for p in Path(root).iterdir() if p.is_file()}
    shard = sorted(n for n in objects if n.endswith(".tar"))[0]
    heads, server_cls = _server()
    modes = [m for m in heads if m not in SLOW + ENDLESS]

    def ranges(mode: str, first: bool = False) -> Attempt:
        return lambda: _ranges(server_cls, objects, shard, mode, first)

    def endless(mode: str) -> Attempt:
        return lambda: _endless(server_cls, objects, shard, mode)

    _, ref = pack_input(work)  # a `wdstream pack` of JSON lines, for the Loader
    packed = {p.name: p.read_bytes() for p in ref.iterdir() if p.is_file()}
    packed_rows = read_rows(str(ref))

    def loader(seed: int, chosen: list[str], p: float, workers: int) -> Attempt:
        def plan(n: int) -> str:
            r = random.Random(seed * 1_000_003 + n)
            return r.choice(chosen) if r.random() < p else "ok"

        def attempt() -> str:
            with server_cls(packed, plan) as server:
                rows = lambda: read_rows(server.base_url, num_workers=workers, **LIMITS)  # noqa: E731
                return labelled(", ".join(chosen), compare(rows, packed_rows))

        return attempt

    for mode in modes:  # every mode twice, whatever the scale: each is a different head
        yield ranges(mode)
        yield ranges(mode, first=True)
    for mode in ENDLESS + SLOW:
        yield endless(mode)

    def size(head: bytes) -> Attempt:
        return lambda: _size(server_cls, objects, shard, head)

    for head in (b"\xb2", b"-5", b"0x10", b"+7", b" 12 "):
        yield size(head)
    n = max(2, int(40 * scale))
    for k in range(n):
        rng = random.Random(4400 + k)
        chosen = rng.sample(modes, rng.choice([1, 2, 4]))
        yield loader(4400 + k, chosen, rng.choice([0.1, 0.3, 1.0]), 2 if k % 4 == 3 else 0)
    yield lambda: _differential(44, max(2000, int(20_000 * scale)))
