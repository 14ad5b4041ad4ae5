"""Torch workers of one rank share a window's remote reads (read/sources/exchange.py): over
the real HTTP file server and moto S3 (tests/servers.py), an epoch read by 2 workers makes
about the GETs and fetches about the bytes one process does, and gives the same batches.

The oracle is the server's own request log: every GET with its ``Range`` header, counted and
summed, at 0 workers against 2 workers over the same epoch (before the share, 2 workers made
~2x of both, each fetching every window its chunks touch)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.servers import FaultProxy, FileServer
from wdstream import Loader
from wdstream.read.sources import exchange
from wdstream.read.sources.exchange import SHARE_WAIT_S, ReadShare, SharedPieces, WindowShares
from wdstream.read.sources.packed import ShardSource

pytest_plugins = ["tests.fixtures_remote"]

pytestmark = pytest.mark.timeout(180)

# Windows of 256 samples, chunks of 32 rows (1/8 of a window, as in the bench: a cold
# window is read whole, not sample by sample): every window holds chunks of both workers.
PACK_ARGS = ["--seq-len", "64", "--shard-size", "64KB", "--workers", "0", "-q"]
KW: dict[str, Any] = {"seq_len": 64, "batch_size": 4, "epochs": 1, "shuffle_window": 256,
                      "shuffle_lanes": 4, "chunk_batches": 8}  # fmt: skip


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import pack_cli_corpus

    return pack_cli_corpus(tmp_path_factory.mktemp("shared"), PACK_ARGS)


def _range_bytes(rng: str | None) -> int:
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", rng or "")
    assert m, f"a shard read without a closed range: {rng!r}"
    return int(m[2]) - int(m[1]) + 1


def _epoch(url: str, workers: int, log: Callable[[], list[Any]], **opts: Any) -> dict[str, Any]:
    batches = [b["input_ids"].tolist() for b in Loader(url, num_workers=workers, **KW, **opts)]
    gets = [(p, r) for m, p, r in log() if m == "GET" and p.split("?")[0].endswith(".tar")]
    return {"batches": batches, "gets": len(gets), "bytes": sum(_range_bytes(r) for _, r in gets)}


def _assert_shared(one: dict[str, Any], two: dict[str, Any]) -> None:
    assert two["batches"] == one["batches"]
    assert len(one["batches"]) >= 40 and one["gets"] >= 10, "the test wants several windows"
    assert two["gets"] <= 1.1 * one["gets"], (two["gets"], one["gets"])
    assert two["bytes"] <= 1.1 * one["bytes"], (two["bytes"], one["bytes"])


def test_two_workers_fetch_a_window_once_over_http(pack: Path) -> None:
    with FileServer(pack) as server:
        runs = []
        for workers in (0, 2):
            server.faults.reset()
            runs.append(_epoch(server.base_url, workers, lambda: list(server.faults.requests)))
    _assert_shared(*runs)


def test_two_workers_fetch_a_window_once_over_s3(
    s3_bucket: str, pack: Path, s3_proxy: FaultProxy, aws_env: str
) -> None:
    s3 = boto3.client("s3", endpoint_url=aws_env)
    for f in pack.iterdir():
        s3.upload_file(str(f), s3_bucket, f"ds/{f.name}")
    opts = {"endpoint_url": s3_proxy.base_url}
    runs = []
    for workers in (0, 2):
        s3_proxy.faults.reset()
        log = lambda: list(s3_proxy.faults.requests)  # noqa: E731
        runs.append(_epoch(f"s3://{s3_bucket}/ds", workers, log, **opts))
    _assert_shared(*runs)


def test_a_piece_that_fails_or_never_comes_is_fetched_by_its_taker(tmp_path: Path) -> None:
    """The taker's way out: a piece marked failed, or an owner that began a later window
    without claiming it, returns None at once (the caller fetches), not after the deadline."""
    folder = str(tmp_path / "share")
    owner, taker = ReadShare(folder, 0), ReadShare(folder, 1)
    pieces = SharedPieces.split(owner, (0, 3), [5, 5], [0, 1])
    assert pieces.owner == [0, 1] and pieces.takers == [(1,), (0,)]
    pieces.begin()
    owner.offer((0, 3), 0, memoryview(b"abc"), [1])
    got = taker.take((0, 3), 0, owner=0)
    assert got is not None and bytes(got) == b"abc"
    owner.fail((0, 3), 2, [1])
    assert taker.take((0, 3), 2, owner=0) is None
    owner.begin((0, 4), [])  # went on to window 4 without claiming piece 5 of window 3
    t0 = time.monotonic()
    assert taker.take((0, 3), 5, owner=0) is None
    assert time.monotonic() - t0 < SHARE_WAIT_S / 10
    assert not [p for p in Path(folder).iterdir() if not p.name.startswith("progress")]


def test_a_piece_offered_before_its_taker_starts_is_kept(tmp_path: Path) -> None:
    """Workers start at different times: a piece offered before its taker's iteration began
    is still taken (the taker's start drops only stale marks), with no wait."""
    folder = str(tmp_path / "share")
    owner = ReadShare(folder, 0)
    SharedPieces.split(owner, (0, 0), [5], [0, 1]).begin()
    owner.offer((0, 0), 0, memoryview(b"xyz"), [1])
    taker = WindowShares(folder, 1, lambda e, a, b: [0, 1])
    got = taker.share.take((0, 0), 0, owner=0)
    assert got is not None and bytes(got) == b"xyz"
    taker.close()
    # Nothing left for worker 1 but its mark that its iteration ended (see the next test).
    assert [p.name for p in Path(folder).glob("*.1*")] == ["progress.1"]


def test_an_owner_that_ended_releases_its_takers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose iteration ended (a ``break``: its reads dropped) says so: a peer still
    filling its last chunk stops waiting for the pieces it never claimed and fetches them
    (before: until ``SHARE_WAIT_S``, and torch killed the worker after 5 s); the next
    iteration's start drops the mark, so that its takers wait for that owner again."""
    monkeypatch.setattr(exchange, "SHARE_WAIT_S", 3.0)
    folder = str(tmp_path / "share")
    owner, taker = ReadShare(folder, 0), ReadShare(folder, 1)
    owner.begin((0, 2), [])
    owner.end()
    owner.begin((0, 3), [(0, [1])])  # a read starting as the iteration ends: claims nothing
    t0 = time.monotonic()
    assert taker.take((0, 3), 0, owner=0) is None
    assert time.monotonic() - t0 < 1.0
    WindowShares(folder, 0, lambda e, a, b: [0, 1])  # the owner begins again: its mark goes
    assert not (Path(folder) / "progress.0").exists()


def test_an_owner_that_ended_with_a_claimed_piece_releases_its_takers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner whose window read failed ends its iteration with a piece it claimed still
    in flight (neither offered nor marked failed), and its process may end before that GET
    does: the taker fetches the piece itself at once (before: it waited ``SHARE_WAIT_S``,
    60 s, for a piece never coming; the worker error of tests/test_storage_hostile_body.py
    reached the caller a minute late in 6 of 69 runs)."""
    monkeypatch.setattr(exchange, "SHARE_WAIT_S", 3.0)
    folder = str(tmp_path / "share")
    owner, taker = ReadShare(folder, 0), ReadShare(folder, 1)
    SharedPieces.split(owner, (0, 0), [5, 5], [0, 1]).begin()  # claims piece 0 for worker 1
    owner.end()
    t0 = time.monotonic()
    assert taker.take((0, 0), 0, owner=0) is None
    assert time.monotonic() - t0 < 1.0


def test_a_peer_that_began_and_ended_the_iteration_first_releases_its_takers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Persistent workers, a ``break`` after a few batches: worker 0 can begin the
    iteration, claim pieces for worker 1 and end it before worker 1 begins it. Worker 1's
    start drops those claims (stale marks, for all it knows); it dropped worker 0's
    ``ended`` too, so it waited ``SHARE_WAIT_S`` (60 s) for pieces never coming (seen in
    3 of 50 iterations at 2 workers over HTTP, breaking after 1-5 batches)."""
    monkeypatch.setattr(exchange, "SHARE_WAIT_S", 3.0)
    folder = str(tmp_path / "share")
    needers = lambda e, a, b: [0, 1]  # noqa: E731
    owner = WindowShares(folder, 0, needers)
    SharedPieces.split(owner.share, (0, 0), [5, 5], [0, 1]).begin()  # piece 0 for worker 1
    owner.close()  # its iteration ended (a break) before worker 1 began it
    taker = WindowShares(folder, 1, needers)
    t0 = time.monotonic()
    assert taker.share.take((0, 0), 0, owner=0) is None  # fetched by the taker itself
    assert time.monotonic() - t0 < 1.0


def test_a_worker_that_ended_takes_nothing_more(tmp_path: Path) -> None:
    """A worker's reads waiting for a peer's piece as its own iteration ends raise
    ``CancelledError`` at once (they are being dropped), whether or not the peer has it."""
    folder = str(tmp_path / "share")
    owner = ReadShare(folder, 0)
    shares = WindowShares(folder, 1, lambda e, a, b: [0, 1])
    SharedPieces.split(owner, (0, 0), [5, 5], [0, 1]).begin()  # claims piece 0 for worker 1
    waiting = ThreadPoolExecutor(1).submit(shares.share.take, (0, 0), 0, 0)
    time.sleep(0.05)
    shares.end()
    with pytest.raises(CancelledError):
        waiting.result(timeout=1.0)
    owner.offer((0, 0), 0, memoryview(b"abc"), [1])
    with pytest.raises(CancelledError):
        shares.share.take((0, 0), 0, owner=0)


def test_a_stopped_read_fetches_nothing_more(pack: Path) -> None:
    """``ShardSource.read(stop=...)``: once set, no piece not yet started is fetched (the
    reader dropping its windows waits only for the GETs in flight)."""
    stop = threading.Event()
    with FileServer(pack) as server:
        source = ShardSource(server.base_url)
        pieces = [(s, 0, 4) for s in range(3)]
        source.read(pieces, stop=stop)  # sidecars in, then a plain read
        server.faults.reset()
        stop.set()
        with pytest.raises(CancelledError):
            source.read(pieces, stop=stop)
        assert not [r for r in server.faults.requests if r[0] == "GET"]
        source.end_fetches()


def test_a_new_iter_ends_the_loaders_earlier_iterator(pack: Path) -> None:
    """A new ``iter()`` under an iterator still held (not finished or closed) ends that one
    first: its workers read ahead in the same share folder under the same worker ids, so a
    new worker and an old one raced for one piece, and the loser waited ``SHARE_WAIT_S``
    (60 s, data right: seen at 2 workers over HTTP with +20 ms a GET, 3 runs of 3 breaking
    at step 33 of 134). The earlier iterator is then finished: it hands out nothing more
    (it would go on from its old position while the loader's went on from the new one)."""
    kw = {**KW, "epochs": 2}
    want = [b["input_ids"].tolist() for b in Loader(str(pack), **kw)]
    with FileServer(pack) as server:
        server.faults.reset(delay=0.02)
        loader = Loader(server.base_url, num_workers=2, **kw)
        held = iter(loader)
        got = [next(held)["input_ids"].tolist() for _ in range(33)]
        t0 = time.monotonic()
        got += [b["input_ids"].tolist() for b in loader]
        took = time.monotonic() - t0
        assert next(held, None) is None
    assert got == want
    assert took < SHARE_WAIT_S / 4, took
