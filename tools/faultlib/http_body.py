"""Hostile answers to ranged GETs: the bodies read into one buffer (issue 35, round 4).

A raw-socket server (``tests/hostile_http.py``) serves the clean dataset and answers each GET
in a mode drawn from (seed, attempt, request number): a correct 206, or one that ignores the
range (200, whole object, sized or chunked), shifts or drops its ``Content-Range``, disagrees
with its ``Content-Length``, caps the range, pads the connection with garbage, encodes it with
gzip, cuts the body, resets the connection, answers 416 / 503 / an empty 206, closes after
the headers, or serves another version of the object (new ETag). Oracles outside wdstream:
the Loader's rows over the local copy, and the shard's bytes read with ``open()``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from faultlib.common import Attempt, clean_dataset, compare, read_rows
from wdstream.errors import WdstreamError
from wdstream.storage import open_store

# Modes a GET may be answered in (slow ones apart: each costs the deadline).
HOSTILE = (
    "full200", "full200_chunked", "shifted", "no_content_range", "cl_long", "cl_short",
    "cr_short", "cr_mismatch", "extra", "chunked206", "gzip", "cut", "changed",
    "close_after_headers", "416", "empty206", "reset", "503",
)  # fmt: skip
LIMITS = {"retries": 2, "timeout": 1.0, "deadline": 2.0, "budget": 4.0, "backoff": 0.02}


def _server() -> tuple[type, Callable[[bytes], bytes]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from hostile_http import HostileServer, other  # the storage tests' hostile server

    return HostileServer, other


def _objects(root: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(root).iterdir() if p.is_file()}


def _plan(seed: int, modes: tuple[str, ...], p: float):  # noqa: ANN202 - a plan function
    """Each GET's mode from (seed, request number): hostile with probability ``p``."""

    def plan(n: int, first: int, last: int | None) -> str:
        r = random.Random(seed * 1_000_003 + n)
        return r.choice(modes) if r.random() < p else "ok"

    return plan


def http_bodies(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    objects = _objects(root)
    server_cls, other = _server()
    shard = sorted(n for n in objects if n.endswith(".tar"))[0]

    def loader(seed: int, modes: tuple[str, ...], p: float, workers: int) -> Attempt:
        def attempt() -> str:
            with server_cls(objects, _plan(seed, modes, p), seed=seed) as server:
                rows = lambda: read_rows(server.base_url, num_workers=workers, **LIMITS)  # noqa: E731
                return compare(rows, want)

        return attempt

    def ranges(seed: int, modes: tuple[str, ...], p: float) -> Attempt:
        def attempt() -> str:
            data = objects[shard]
            # A GET answered wholly from another version is right by that version (its
            # checksums refuse it in the Loader); a splice of two versions is never right.
            changed = other(data) if "changed" in modes else None
            rng = random.Random(seed)
            with server_cls(objects, _plan(seed, modes, p), seed=seed) as server:
                store = open_store(server.base_url, **LIMITS)
                for _ in range(8):
                    a = rng.randrange(len(data))
                    b = a + rng.choice([1, 37, 512, len(data)])
                    try:
                        got = bytes(store.read_range_view(shard, a, b))
                    except WdstreamError as exc:
                        if shard not in str(exc):
                            return f"crash: an error not naming the shard: {exc}"[:300]
                        continue  # a clear error: the next range
                    if got != data[a:b] and not (changed and got == changed[a:b]):
                        served = sorted({m for m, _ in server.seen})
                        return (
                            f"silent wrong: bytes [{a}, {b}) of {shard} differ (answers: {served})"
                        )
            return "handled"

        return attempt

    n = max(1, int(40 * scale))
    for k in range(n):
        rng = random.Random(3500 + k)
        modes = tuple(rng.sample(HOSTILE, rng.choice([1, 2, 3])))
        p = rng.choice([0.1, 0.3, 0.7, 1.0])
        yield ranges(3500 + k, modes, p)
        yield loader(3500 + k, modes, p, workers=2 if k % 4 == 3 else 0)
    for slow in ("slow_headers", "slow_body"):  # the deadline must end both
        yield loader(99, (slow,), 0.2, workers=0)
