"""Ranged reads land in one buffer the socket writes into (storage/body.py), and the window
read-ahead goes out before the rows wait (read/order/read_ahead.py), issue 35.

Oracles: the bytes of the same file on local disk, and the batches of the same dataset read
locally. The fault tests make the real test servers cut and stall bodies while windows are
read ahead: the reader ends with the local batches or a ``RemoteReadError`` naming the shard
and the byte offset, never a hang (each test runs under a timeout).
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from click.testing import CliRunner

from tests.servers import FileServer
from wdstream import Loader
from wdstream.cli import main
from wdstream.read.order.read_ahead import WindowCache
from wdstream.read.order.window_data import WindowData
from wdstream.storage import RemoteReadError, open_store
from wdstream.storage.body import SocketBody

pytest_plugins = ["tests.fixtures_remote"]

pytestmark = pytest.mark.timeout(120)

DATA = random.Random(35).randbytes(3 << 20)
LOADER_KW: dict[str, Any] = {"seq_len": 64, "batch_size": 4, "epochs": 1, "shuffle_window": 16}


@pytest.fixture
def readintos(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the socket reads made into callers' buffers (SocketBody.readinto)."""
    seen: list[int] = []
    real = SocketBody.readinto

    def spy(self: SocketBody, view: memoryview) -> int:
        n = real(self, view)
        seen.append(n)
        return n

    monkeypatch.setattr(SocketBody, "readinto", spy)
    return seen


@pytest.fixture
def served(tmp_path: Path) -> Iterator[FileServer]:
    root = tmp_path / "served"
    root.mkdir()
    (root / "s.tar").write_bytes(DATA)
    with FileServer(root) as server:
        yield server


def _ranges(n: int) -> list[tuple[int, int]]:
    rng = random.Random(7)
    out = [(0, len(DATA)), (len(DATA) - 10, len(DATA) + 500), (5, 6)]
    for _ in range(n):
        a = rng.randrange(len(DATA))
        out.append((a, a + rng.choice([1, 100, 70_000, 1 << 20])))
    return out


def _check_ranges(url: str, readintos: list[int], **options: Any) -> None:
    store = open_store(url, **options)
    for a, b in _ranges(12):
        got = store.read_range_view("s.tar", a, b)
        assert got.readonly
        assert got == DATA[a:b]  # the local bytes; past the end, the bytes that exist
        assert store.read_range("s.tar", a, b) == DATA[a:b]
    assert sum(readintos) >= sum(min(b, len(DATA)) - a for a, b in _ranges(12))


def test_http_ranges_are_read_into_one_buffer(served: FileServer, readintos: list[int]) -> None:
    _check_ranges(served.base_url, readintos)


def test_s3_ranges_are_read_into_one_buffer(s3_bucket: str, readintos: list[int]) -> None:
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="ds/s.tar", Body=DATA)
    _check_ranges(f"s3://{s3_bucket}/ds", readintos)


def test_range_past_the_end_holds_only_the_bytes_that_exist(
    served: FileServer, readintos: list[int]
) -> None:
    """The buffer is made at the first answer, as long as what it promises: a range asked
    far past the object's end allocates the bytes that exist, not the range."""
    store = open_store(served.base_url)
    got = store.read_range_view("s.tar", len(DATA) - 10, len(DATA) + (1 << 40))
    assert got == DATA[-10:]
    assert got.obj is not None and memoryview(got.obj).nbytes == 10
    assert store.read_range_view("s.tar", len(DATA) + 5, len(DATA) + 9) == b""


def test_cut_body_read_into_the_buffer_resumes_at_the_first_missing_byte(
    served: FileServer, readintos: list[int]
) -> None:
    """Bytes that reached the buffer before the cut count: the retry asks for the rest."""
    served.faults.reset(cut_first=1, cut_at=70_000)
    store = open_store(served.base_url, backoff=0.001)
    assert store.read_range_view("s.tar", 1000, 900_000) == DATA[1000:900_000]
    assert served.faults.ranges() == ["bytes=1000-899999", "bytes=71000-899999"]
    assert readintos


def test_threads_share_the_connections(served: FileServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads made one after another on different threads reuse one connection (one pool
    per store and process, not one per thread)."""
    import urllib3.connectionpool

    made: list[object] = []
    real = urllib3.connectionpool.HTTPConnectionPool._new_conn

    def spy(self: Any) -> Any:
        made.append(self)
        return real(self)

    monkeypatch.setattr(urllib3.connectionpool.HTTPConnectionPool, "_new_conn", spy)
    store = open_store(served.base_url)
    for i in range(4):
        t = threading.Thread(target=lambda i=i: store.read_range("s.tar", i, i + 5000))
        t.start()
        t.join(30)
    assert len(made) == 1


# -- the reader over servers that cut and stall while windows are read ahead -------------


@pytest.fixture
def local_pack(tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]) -> Path:
    corpus = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:80])
    out = tmp_path / "local"
    args = ["--seq-len", "64", "--shard-size", "48KB", "--workers", "0", "-q"]
    result = CliRunner().invoke(main, ["pack", str(corpus), "--output", str(out), *args])
    assert result.exit_code == 0, result.output
    return out


def _batches(loader: Loader) -> list[list[list[int]]]:
    out = []
    for batch in loader:
        assert isinstance(batch["input_ids"], torch.Tensor)
        out.append(batch["input_ids"].tolist())
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_from_nginx_equals_local(local_pack: Path, workers: int) -> None:
    """A real server (nginx: sendfile, keep-alive, its own framing) read through the socket
    path, windows read ahead and connections shared: the batches are the local ones, and
    every GET nginx logged succeeded."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from benchlib import nginx

    binary = nginx.nginx_binary()
    if binary is None:
        pytest.skip("nginx not installed (apt-get install nginx-light)")
    want = _batches(Loader(str(local_pack), num_workers=workers, **LOADER_KW))
    with nginx.Nginx(str(local_pack), binary) as server:
        got = _batches(Loader(server.url, num_workers=workers, **LOADER_KW))
        seen = server.requests()
    assert got == want
    assert seen["gets"] > 0 and seen["errors"] == 0


def test_stalled_and_cut_reads_ahead_end_in_the_local_batches(local_pack: Path) -> None:
    """Every third GET is cut after 300 bytes and then goes silent (the header promised
    more), others are delayed: the read-ahead's reads wait out the read timeout, resume
    where the bytes stopped, and the batches are the local ones."""
    want = _batches(Loader(str(local_pack), num_workers=0, **LOADER_KW))
    with FileServer(local_pack) as server:
        server.faults.reset(cut_every=3, cut_at=300, stall=True, delay=0.002, methods=("GET",))
        opts = {"retries": 8, "backoff": 0.001, "timeout": 0.5}
        got = _batches(Loader(server.base_url, num_workers=0, **LOADER_KW, **opts))
        ranges = server.faults.ranges()
    assert got == want
    assert _resumed_after_cut(ranges, 300) >= 2  # cut, stalled, and resumed at the cut


def _resumed_after_cut(ranges: list[str | None], cut_at: int) -> int:
    """How many logged ranges longer than ``cut_at`` were followed by the same range from
    ``cut_at`` bytes later (a body cut there, resumed at its first missing byte)."""
    n = 0
    for i, rng in enumerate(ranges):
        if rng is None:
            continue
        first, _, last = rng.removeprefix("bytes=").partition("-")
        if last and int(last) - int(first) + 1 > cut_at:
            n += f"bytes={int(first) + cut_at}-{last}" in ranges[i + 1 :]
    return n


def test_a_shard_that_always_stalls_fails_naming_it_and_the_offset(local_pack: Path) -> None:
    """Every GET of one shard stalls after 300 bytes: the read (read ahead or not) fails
    with a RemoteReadError naming that shard and the byte it reached; nothing hangs."""
    shard = sorted(p.name for p in local_pack.glob("*.tar"))[1]
    with FileServer(local_pack) as server:
        server.faults.reset(cut_every=1, cut_at=300, stall=True, only=shard, methods=("GET",))
        opts = {"retries": 1, "backoff": 0.001, "timeout": 0.3}
        with pytest.raises(RemoteReadError) as err:
            _batches(Loader(server.base_url, num_workers=0, **LOADER_KW, **opts))
    assert shard in str(err.value) and "at byte" in str(err.value)
    assert err.value.offset is not None and err.value.offset > 0


def test_next_windows_are_started_before_waiting_for_this_one() -> None:
    """A window being read ahead that the rows now wait for: the windows after it are
    asked for before the wait, not after it (their round trips overlap this one's)."""
    started: list[int] = []
    second_started = threading.Event()
    overlapped: list[bool] = []

    def load(epoch: int, w: int, docs: bool) -> WindowData:
        started.append(w)
        if w == 0:  # window 0 ends once window 1 has started (or after 5 s: not overlapped)
            overlapped.append(second_started.wait(5))
        elif w == 1:
            second_started.set()
        return WindowData([], [], [], [])

    def following(key: tuple[int, int, bool], n: int) -> list[tuple[int, int, bool]]:
        return [(0, key[1] + i, False) for i in range(1, n + 1)]

    cache = WindowCache(load, deepen=True)
    cache.start((0, 0, False))
    cache.get((0, 0, False), following)
    cache.release()
    assert overlapped == [True]  # window 1 started while window 0 was still being read
    assert started[0] == 0 and 1 in started


def test_local_windows_are_read_in_line_and_kept_bounded() -> None:
    """Without read-ahead (a local source) each window is read where the rows ask for it, in
    the asking thread, none ahead; a window started explicitly (an iteration's first, behind
    its rows read alone) is only named: no longer cold, so the next rows do not read its
    samples alone again, and read by the first get in that thread, with no thread made; and
    the windows kept stay within the cache's bound however many are read (they hold views
    of mapped shards)."""
    readers: list[tuple[int, str]] = []

    def load(epoch: int, w: int, docs: bool) -> WindowData:
        readers.append((w, threading.current_thread().name))
        return WindowData([], [], [], [])

    def following(key: tuple[int, int, bool], n: int) -> list[tuple[int, int, bool]]:
        return [(0, key[1] + i, False) for i in range(1, n + 1)]

    cache = WindowCache(load, deepen=False, read_ahead=False)
    threads = threading.active_count()
    cache.start((0, 0, False))
    assert not cache.cold((0, 0, False)) and not cache.empty()
    assert readers == [] and threading.active_count() == threads  # named, not read
    here = threading.current_thread().name
    for w in range(40):
        cache.get((0, w, False), following)
        assert len(cache._data) <= 3, len(cache._data)
    cache.release()
    assert [w for w, _ in readers] == list(range(40))  # each read once, none ahead
    assert all(name == here for _, name in readers)
    assert cache._pool is None and threading.active_count() == threads
