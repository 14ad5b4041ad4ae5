"""Faults that used to hang or fail slowly: a FIFO in place of a shard, a server that
trickles bytes or never answers, and PUT statuses that no retry can fix.

Every test is bounded: a regression fails within seconds instead of hanging the suite.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.servers import FileServer, SilentServer
from wdstream import Loader
from wdstream.storage import (
    LocalStore,
    RemoteReadError,
    RemoteWriteError,
    RetryPolicy,
    open_store,
)
from wdstream.storage.http import HttpStore
from wdstream.testing import write_synthetic_dataset

# The fixtures (moto server, buckets, HTTP file server) live in one plugin module.
pytest_plugins = ["tests.fixtures_remote"]

pytestmark = pytest.mark.timeout(20)

DATA = random.Random(5).randbytes(100_000)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "STORAGE.md"


# -- local: only regular files are opened -------------------------------------------------


def _error_within(fifo: Path, fn: Callable[[], object], seconds: float = 5.0) -> BaseException:
    """Run ``fn`` in a thread and return what it raised. A regression that blocks in
    ``open()`` on ``fifo`` is released by opening the FIFO's write end, then fails the test."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # a writer appears: open returns
        worker.join(seconds)
        pytest.fail(f"still blocked after {seconds}s on the FIFO {fifo}")
    assert outcome and outcome[0] is not None, "a FIFO was read without an error"
    return outcome[0]


def test_fifo_in_place_of_a_shard_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "data-000000.tar"
    os.mkfifo(fifo)
    store = LocalStore(tmp_path)
    reads: list[Callable[[], object]] = [
        lambda: store.read("data-000000.tar"),
        lambda: store.read_range("data-000000.tar", 0, 10),
        lambda: store.read_range_view("data-000000.tar", 0, 10),
        lambda: store.size("data-000000.tar"),
    ]
    for read in reads:
        err = _error_within(fifo, read)
        assert isinstance(err, OSError) and not isinstance(err, FileNotFoundError)
        assert "FIFO (named pipe)" in str(err) and str(fifo) in str(err)
    assert not store.exists("data-000000.tar") and store.list() == []


def test_directory_and_device_are_refused(tmp_path: Path) -> None:
    (tmp_path / "dir.tar").mkdir()
    store = LocalStore(tmp_path)
    with pytest.raises(IsADirectoryError, match=r"a directory.*dir\.tar"):
        store.read_range("dir.tar", 0, 1)
    with pytest.raises(IsADirectoryError, match="dir.tar"):
        store.size("dir.tar")
    if os.path.exists("/dev/zero"):
        (tmp_path / "dev.tar").symlink_to("/dev/zero")  # would read zeros forever
        with pytest.raises(OSError, match=r"character device.*dev\.tar"):
            store.read("dev.tar")


def test_loader_over_a_fifo_shard_fails_naming_it(tmp_path: Path) -> None:
    write_synthetic_dataset(str(tmp_path), n_docs=40, sample_tokens=9, samples_per_shard=10)
    shard = tmp_path / "data-000000.tar"
    shard.unlink()
    os.mkfifo(shard)
    loader = Loader(str(tmp_path), seq_len=8, batch_size=2, num_workers=0, epochs=1)
    err = _error_within(shard, lambda: list(loader))
    assert isinstance(err, OSError) and "FIFO" in str(err) and "data-000000.tar" in str(err)


# -- HTTP: a deadline per request, a time budget per operation ----------------------------


def _store(server_url: str, **options: Any) -> HttpStore:
    options = {"retries": 3, "backoff": 0.01, "timeout": 2.0, **options}
    store = open_store(server_url + "/ds/", **options)
    assert isinstance(store, HttpStore)
    return store


@pytest.fixture
def served(http_server: FileServer) -> FileServer:
    (http_server.root / "ds").mkdir()
    (http_server.root / "ds" / "s.tar").write_bytes(DATA)
    return http_server


def test_trickling_server_fails_at_the_deadline_naming_url_and_offset(
    served: FileServer,
) -> None:
    # A byte every 50 ms: only the 0.5 s deadline can stop it. The read timeout (30 s) and
    # the budget (60 s) are far past the test's own limit, so however slowly a loaded host
    # schedules the server, neither can be what ends an attempt: the outcome is asserted,
    # never the host's timing (a 2 s read timeout once fired first under load).
    store = _store(served.base_url, retries=1, deadline=0.5, budget=60.0, timeout=30.0)
    served.faults.reset(trickle=0.05)
    t0 = time.perf_counter()
    with pytest.raises(RemoteReadError) as info:
        store.read_range("s.tar", 0, 10_000)
    err = info.value
    assert time.perf_counter() - t0 >= 2 * 0.5  # two attempts, each cut at its deadline
    assert err.url == served.base_url + "/ds/s.tar" and err.url in str(err)
    assert re.search(r"^DeadlineExceeded: .* \(allowed 0\.5\ds\)$", err.cause), err.cause
    assert f"at byte {err.offset}" in str(err)
    # Two attempts (1 + 1 retry), each cut after a byte arrived past its deadline (the
    # deadline is checked as bytes arrive); the second resumed at the first one's last byte.
    first, second = served.faults.ranges()
    resumed_at = int(re.fullmatch(r"bytes=(\d+)-9999", second or "")[1])  # type: ignore[index]
    assert first == "bytes=0-9999" and 0 < resumed_at < err.offset < 10_000  # type: ignore[operator]


def test_slow_but_steady_response_within_its_deadline_is_not_cut(served: FileServer) -> None:
    # 30 bytes 10 ms apart within a 30 s deadline: a loaded host cannot make it a cut.
    store = _store(served.base_url, retries=0, deadline=30.0)
    served.faults.reset(trickle=0.01)
    assert store.read_range("s.tar", 100, 130) == DATA[100:130]
    assert served.faults.ranges() == ["bytes=100-129"]


def test_silent_server_fails_within_the_budget() -> None:
    # Defaults except the time limits, shortened 50x so the test takes about a second.
    with SilentServer() as silent:
        store = open_store(silent.base_url + "/ds/", timeout=(1.0, 0.3), budget=1.2, backoff=0.01)
        assert isinstance(store, HttpStore) and store.policy.retries == RetryPolicy().retries
        t0 = time.perf_counter()
        with pytest.raises(RemoteReadError) as info:
            store.read_range("s.tar", 0, 100)
        assert time.perf_counter() - t0 < 1.2 + 0.3 + 1.0
        text = str(info.value)
        assert f"{silent.base_url}/ds/s.tar at byte 0" in text and "1.2s budget" in text
        assert re.search("(?i)read timed out", info.value.cause)
        assert 3 <= silent.connections <= 5  # ~0.3 s per attempt within 1.2 s
        with pytest.raises(RemoteReadError, match=r"HEAD .*/ds/s\.tar failed after"):
            store.size("s.tar")


def _documented_default(option: str) -> str:
    """The default column of ``option``'s row in the options table of docs/STORAGE.md."""
    row = re.search(rf"^\| `{option}` \| [^|]+ \| ([^|]+) \|", DOCS.read_text(), re.M)
    assert row, f"docs/STORAGE.md has no options row for {option}"
    return row[1].strip()


def test_default_limits_are_the_documented_ones() -> None:
    p = RetryPolicy()
    assert _documented_default("retries") == str(p.retries)
    assert _documented_default("timeout") == (
        f"{p.connect_timeout:g} s connect, {p.read_timeout:g} s read"
    )
    assert _documented_default("deadline") == f"{p.deadline:g} s"
    assert _documented_default("min_throughput") == f"{p.min_throughput / (1 << 20):g} MiB/s"
    assert _documented_default("budget") == f"{p.budget:g} s"
    # What the docs promise for a silent endpoint: no retry starts after the budget, and
    # the last attempt ends within one read timeout.
    assert "75 s" in DOCS.read_text() and p.budget + p.read_timeout == 75


# -- HTTP: statuses that no retry can fix ---------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 411, 413, 501, 505])
def test_put_refused_for_good_is_not_retried(served: FileServer, status: int) -> None:
    store = _store(served.base_url, retries=5)
    served.faults.reset(fail_every=1, fail_status=status, methods=("PUT",))
    with pytest.raises(RemoteWriteError) as info:
        store.write_bytes("new.tar", b"payload")
    text = str(info.value)
    assert f"PUT {served.base_url}/ds/new.tar failed (not retried)" in text
    assert f"HTTP {status}" in text and info.value.url == f"{served.base_url}/ds/new.tar"
    assert [m for m, _, _ in served.faults.requests] == ["PUT"]


@pytest.mark.parametrize("status", [405, 501])
def test_put_refused_by_a_read_only_server_says_it_needs_put(
    served: FileServer, status: int
) -> None:
    """A static server answers PUT with 501 (or 405): the error says the server must accept
    PUT and what else to write to, not only the status."""
    store = _store(served.base_url, retries=5)
    served.faults.reset(fail_every=1, fail_status=status, methods=("PUT",))
    with pytest.raises(RemoteWriteError) as info:
        store.write_bytes("new.tar", b"payload")
    text = str(info.value)
    assert f"HTTP {status}" in text and "the server does not accept PUT" in text
    assert "a server that accepts PUT, or write to a local folder or s3://" in text


def test_put_refused_for_one_object_gives_no_put_advice(served: FileServer) -> None:
    """A 403 refuses this object, not PUT itself: no advice to change servers."""
    store = _store(served.base_url)
    served.faults.reset(fail_every=1, fail_status=403, methods=("PUT",))
    with pytest.raises(RemoteWriteError) as info:
        store.write_bytes("new.tar", b"payload")
    assert "HTTP 403" in str(info.value) and "accept PUT" not in str(info.value)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_put_answered_with_a_passing_status_is_retried(served: FileServer, status: int) -> None:
    store = _store(served.base_url)
    served.faults.reset(fail_first=1, fail_status=status, methods=("PUT",))
    store.write_bytes("new.tar", b"payload")
    assert (served.root / "ds" / "new.tar").read_bytes() == b"payload"
    assert [m for m, _, _ in served.faults.requests] == ["PUT", "PUT"]


def test_get_answered_501_is_not_retried(served: FileServer) -> None:
    store = _store(served.base_url, retries=5)
    served.faults.reset(fail_every=1, fail_status=501, methods=("GET",))
    with pytest.raises(RemoteReadError, match=r"at byte 7 failed \(not retried\).*HTTP 501"):
        store.read_range("s.tar", 7, 70)
    assert len(served.faults.requests) == 1
