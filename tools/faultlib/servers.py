"""Hostile and lying HTTP servers, and the node cache's files."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from faultlib.common import Attempt, clean_dataset, compare, read_rows, run_cli, test_servers
from faultlib.packs import pack_args, pack_input
from wdstream.testing import write_synthetic_dataset

# ---------------------------------------------------------------- hostile servers


def hostile_servers(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    FileServer, SilentServer = test_servers()  # noqa: N806 - classes

    limits = {"retries": 1, "timeout": 1.0, "deadline": 2.0, "budget": 3.0}

    def read_http(knobs: dict[str, object]) -> str:
        with FileServer(root) as server:
            server.faults.reset(**knobs)
            return compare(lambda: read_rows(server.base_url, **limits), want)

    yield lambda: read_http({"trickle": 0.5})
    yield lambda: read_http({"fail_first": 1000, "fail_status": 503})
    yield lambda: read_http({"cut_every": 1, "cut_at": 100})

    def silent() -> str:
        server = SilentServer()
        try:
            return compare(lambda: read_rows(server.base_url + "/ds", **limits), want)
        finally:
            server.stop()

    yield silent

    def put_501() -> str:
        with FileServer(work / "put-root") as server:
            server.faults.reset(fail_first=1000, fail_status=501, methods=("PUT",))
            src, _ = pack_input(work)
            out = run_cli([*pack_args(src, server.base_url + "/ds"), "--retries", "5"], 60)
            puts = [r for r in server.faults.requests if r[0] == "PUT"]
            return out if len(puts) <= 2 else "crash"  # a 501 is not retried

    yield put_501


# ---------------------------------------------------------------- node cache and lying servers


def cache_files(work: Path, scale: float) -> Iterator[Attempt]:
    """Blocks of the node cache copied over, swapped with or damaged into one another, read
    back with ``checksums=False``; and two datasets that differ only by their URL's query
    string sharing one cache folder. Every read must equal the dataset's own local read."""
    from wdstream.read.sources.packed import ShardSource

    root, want = clean_dataset(work)
    file_server, _ = test_servers()
    for i in range(max(3, int(30 * scale))):

        def attempt(i: int = i) -> str:
            rng = np.random.default_rng(i)
            with file_server(root) as server, tempfile.TemporaryDirectory() as cache:

                def rows() -> np.ndarray:
                    return read_rows(ShardSource(server.base_url, checksums=False, cache_dir=cache))  # type: ignore[arg-type]

                rows()  # fill the cache
                blocks = sorted(Path(cache).rglob("*.blk"))
                a, b = (Path(p) for p in rng.choice([str(p) for p in blocks], 2, replace=False))
                if i % 3 == 0:
                    shutil.copyfile(a, b)  # one block copied over another
                elif i % 3 == 1:
                    data_a, data_b = a.read_bytes(), b.read_bytes()
                    a.write_bytes(data_b)
                    b.write_bytes(data_a)  # two blocks swapped
                else:
                    raw = bytearray(b.read_bytes())
                    raw[int(rng.integers(len(raw)))] ^= 1 << int(rng.integers(8))
                    b.write_bytes(bytes(raw))  # a bit flipped anywhere in a block
                return compare(rows, want)

        yield attempt

    def by_query() -> str:
        other = work / "cache-code"
        if not other.exists():
            write_synthetic_dataset(str(other), n_docs=30, sample_tokens=33,
                                    samples_per_shard=9, dtype="uint16")  # fmt: skip
        with file_server(work) as server, tempfile.TemporaryDirectory() as cache:
            swap = {
                f"ds/{f.name}?ds={tag}": os.path.relpath(f, work)
                for tag, src in (("web", root), ("code", other))
                for f in Path(src).iterdir()
            }
            server.faults.reset(swap=swap)
            outcomes = []
            for tag, src in (("web", root), ("code", str(other)), ("web", root)):
                url = f"{server.base_url}/ds/?ds={tag}"
                local = read_rows(src)
                outcomes.append(compare(lambda u=url: read_rows(u, cache_dir=cache), local))
            return next((o for o in outcomes if o != "handled"), "handled")

    yield by_query


def lying_servers(work: Path, scale: float) -> Iterator[Attempt]:
    """A server that answers with another shard's bytes (checksums on and off, with and
    without the node cache), one that promises more bytes than it sends and goes silent
    (forever, or only the first time), and one that trickles the shards a byte per 0.05 s:
    a clear error within ``budget + read timeout`` (plus slack) or the right data."""
    from wdstream.read.sources.packed import ShardSource

    root, want = clean_dataset(work)
    file_server, _ = test_servers()
    tars = sorted(p.name for p in Path(root).glob("*.tar"))
    limits = {"retries": 3, "timeout": (1.0, 0.5), "deadline": 1.0, "budget": 2.0}
    give_up = 2 * (2.0 + 0.5) + 3.0  # generous: the documented budget + read timeout, twice

    def read_http(knobs: dict[str, object], checksums: bool = True, cached: bool = False) -> str:
        with file_server(root) as server, tempfile.TemporaryDirectory() as cache:
            server.faults.reset(**knobs)
            extra = {"cache_dir": cache} if cached else {}
            t0 = time.monotonic()
            src = ShardSource(server.base_url, checksums=checksums, **limits, **extra)
            out = compare(lambda: read_rows(src), want)  # type: ignore[arg-type]
            took = time.monotonic() - t0
            return (
                out if took <= give_up or out == "handled" else f"hang: gave up after {took:.1f}s"
            )

    for k in range(max(4, int(8 * scale))):
        a, b = tars[k % len(tars)], tars[(k + 1) % len(tars)]
        yield lambda a=a, b=b, k=k: read_http(
            {"swap": {a: b}}, checksums=k % 2 == 0, cached=k % 4 >= 2
        )
    for cut_at in (0, 100, 1000):
        yield lambda c=cut_at: read_http(
            {"cut_every": 1, "cut_at": c, "stall": True, "only": ".tar"}
        )
    yield lambda: read_http({"cut_first": 1, "cut_at": 100, "stall": True, "only": ".tar"})
    yield lambda: read_http({"trickle": 0.05, "only": ".tar"})
    yield lambda: read_http({"trickle": 0.05, "only": ".tar"}, cached=True)
