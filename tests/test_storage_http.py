"""HttpStore against a real threaded HTTP server with deterministic faults."""

from __future__ import annotations

import base64
import pickle
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.servers import FaultProxy, FileServer
from wdstream.errors import WdstreamError
from wdstream.storage import RemoteReadError, RemoteWriteError, open_store, split_url
from wdstream.storage.http import HttpStore, ListingNotSupportedError

# The fixtures (moto server, buckets, HTTP file server) live in one plugin module.
pytest_plugins = ["tests.fixtures_remote"]

pytestmark = pytest.mark.timeout(30)

DATA = random.Random(7).randbytes(100_000)


def _store(server: FileServer, **options: Any) -> HttpStore:
    options = {"retries": 3, "backoff": 0.01, "timeout": 2.0, **options}
    store = open_store(server.base_url + "/ds/", **options)
    assert isinstance(store, HttpStore)
    return store


@pytest.fixture
def served(http_server: FileServer) -> FileServer:
    (http_server.root / "ds").mkdir()
    (http_server.root / "ds" / "s.tar").write_bytes(DATA)
    return http_server


def test_cut_bodies_resume_from_last_byte(served: FileServer) -> None:
    store = _store(served)
    served.faults.reset(cut_first=3, cut_at=1000)
    assert store.read_range("s.tar", 500, 90_000) == DATA[500:90_000]
    # Every retry asks only for the bytes still missing.
    assert served.faults.ranges() == [
        "bytes=500-89999", "bytes=1500-89999", "bytes=2500-89999", "bytes=3500-89999"
    ]  # fmt: skip


def test_whole_read_resumes_too(served: FileServer) -> None:
    store = _store(served)
    served.faults.reset(cut_first=2, cut_at=4096)
    assert store.read("s.tar") == DATA
    assert served.faults.ranges() == [None, "bytes=4096-", "bytes=8192-"]


def test_503s_then_success(served: FileServer) -> None:
    store = _store(served)
    served.faults.reset(fail_first=3)
    assert store.read_range("s.tar", 10, 20) == DATA[10:20]
    assert store.size("s.tar") == len(DATA)
    served.faults.reset(fail_every=2)
    for a in range(0, 100_000, 9_000):
        assert store.read_range("s.tar", a, a + 12_345) == DATA[a : a + 12_345]


def test_server_ignoring_range(served: FileServer) -> None:
    store = _store(served)
    served.faults.reset(ignore_range=True)
    assert store.read_range("s.tar", 0, 10) == DATA[:10]
    assert store.read_range("s.tar", 99_990, 200_000) == DATA[99_990:]
    assert store.read_range("s.tar", 100_000, 100_010) == b""
    assert store.read_range("s.tar", 31_000, 64_000) == DATA[31_000:64_000]
    # ... while also cutting bodies: resumes (the server restarts at byte 0 every time).
    served.faults.reset(ignore_range=True, cut_first=2, cut_at=40_000)
    assert store.read_range("s.tar", 35_000, 70_000) == DATA[35_000:70_000]


def test_ignored_range_stops_reading_early(http_server: FileServer) -> None:
    (http_server.root / "ds").mkdir()
    big = random.Random(1).randbytes(32 << 20)
    (http_server.root / "ds" / "big.bin").write_bytes(big)
    store = _store(http_server, chunk_size=64 << 10)
    http_server.faults.reset(ignore_range=True)
    for _ in range(3):
        assert store.read_range("big.bin", 100, 200) == big[100:200]
    time.sleep(0.2)  # let the server threads notice the closed connections
    # The client hung up after its 200 bytes; only what fit in socket buffers went out.
    assert http_server.faults.sent < 3 * (4 << 20), http_server.faults.sent


def test_retry_budget_gives_clear_error(served: FileServer) -> None:
    store = _store(served, retries=2)
    served.faults.reset(fail_every=1)
    with pytest.raises(RemoteReadError) as info:
        store.read_range("s.tar", 4_096, 8_192)
    err = info.value
    assert isinstance(err, WdstreamError) and isinstance(err, OSError)
    assert "/ds/s.tar" in str(err) and "byte 4096" in str(err) and "HTTP 503" in str(err)
    assert err.offset == 4_096 and err.url == served.base_url + "/ds/s.tar"
    assert len(served.faults.requests) == 3  # one attempt + 2 retries


def test_cut_forever_fails_at_the_offset_reached(served: FileServer) -> None:
    store = _store(served, retries=2)
    served.faults.reset(cut_every=1, cut_at=0)
    with pytest.raises(RemoteReadError, match=r"at byte 0 .*(IncompleteRead|truncated body)"):
        store.read("s.tar")


def test_slow_server_times_out_not_hangs(served: FileServer) -> None:
    store = _store(served, retries=1, timeout=0.2)
    served.faults.reset(delay=1.0)
    t0 = time.perf_counter()
    with pytest.raises(RemoteReadError, match="(?i)timed? ?out"):
        store.read_range("s.tar", 0, 100)
    assert time.perf_counter() - t0 < 2.0


def test_connection_refused(tmp_path: Path) -> None:
    with FileServer(tmp_path) as server:
        url = server.base_url
    store = open_store(url + "/x/", retries=1, backoff=0.01, timeout=0.5)
    with pytest.raises(RemoteReadError, match="ConnectionError"):
        store.read_range("a", 0, 1)


def test_writes(served: FileServer) -> None:
    store = _store(served)
    served.faults.reset()
    with pytest.raises(ValueError):
        with store.writer("new.tar") as out:
            out.write(b"partial")
            raise ValueError("stop")
    assert not (served.root / "ds" / "new.tar").exists()
    assert [m for m, _, _ in served.faults.requests] == []  # nothing was sent at all
    served.faults.reset(fail_first=1, methods=("PUT",))
    store.write_bytes("new.tar", b"payload")
    assert (served.root / "ds" / "new.tar").read_bytes() == b"payload"
    served.faults.reset(fail_every=1, methods=("PUT",))
    with pytest.raises(RemoteWriteError, match="PUT .*new2.tar.*HTTP 503"):
        store.write_bytes("new2.tar", b"x")


def test_large_put_is_resent_whole_after_a_503(served: FileServer) -> None:
    store = _store(served)
    big = random.Random(3).randbytes(20 << 20)  # above the in-memory limit: streamed
    served.faults.reset(fail_first=1, methods=("PUT",))
    with store.writer("big.tar") as out:
        out.write(big)
    assert (served.root / "ds" / "big.tar").read_bytes() == big


def test_list_is_not_supported(served: FileServer) -> None:
    with pytest.raises(ListingNotSupportedError, match="index.json"):
        _store(served).list()


def test_credentials_never_in_messages(http_server: FileServer) -> None:
    secret_pw = "hunter2-do-not-leak"
    token = "tok-do-not-leak"
    basic = "Basic " + base64.b64encode(f"alice:{secret_pw}".encode()).decode()
    with FileServer(http_server.root, auth_header=basic) as server:
        (server.root / "ds").mkdir()
        (server.root / "ds" / "s.tar").write_bytes(DATA)
        host = server.base_url.removeprefix("http://")
        root = f"http://alice:{secret_pw}@{host}/ds/?token={token}"
        store = open_store(root, retries=1, backoff=0.01)
        assert store.read_range("s.tar", 5, 50) == DATA[5:50]  # user:pass@ is used
        messages = [store.url, store.child_url("s.tar"), repr(pickle.loads(pickle.dumps(store)))]
        with pytest.raises(FileNotFoundError) as missing:
            store.read("missing.tar")
        messages.append(str(missing.value))
        server.faults.reset(fail_every=1)
        with pytest.raises(RemoteReadError) as failed:
            store.read_range("s.tar", 0, 10)
        messages += [str(failed.value), repr(failed.value), failed.value.cause]
        hdr = open_store(f"http://{host}/ds/", headers={"Authorization": basic}, retries=0)
        with pytest.raises(RemoteReadError) as failed2:
            hdr.read("s.tar")
        messages.append(str(failed2.value))
    for text in messages:
        assert secret_pw not in text and token not in text and basic not in text, text
    assert store.url == f"http://***@{host}/ds/?<redacted>".rstrip("/")


def test_split_url_keeps_signed_query_on_the_root(served: FileServer) -> None:
    root, name = split_url(f"{served.base_url}/ds/s.tar?X-Amz-Signature=abc")
    assert name == "s.tar" and root.endswith("/ds?X-Amz-Signature=abc")
    assert open_store(root).read_range(name, 0, 5) == DATA[:5]
    assert served.faults.requests[-1][1] == "/ds/s.tar?X-Amz-Signature=abc"


def test_threads_share_a_store_over_a_flaky_server(served: FileServer) -> None:
    store = _store(served, retries=5)
    served.faults.reset(cut_every=3, cut_at=777, fail_every=5)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(6):
                a = (k * 10_007 + i * 3_001) % 90_000
                assert store.read_range("s.tar", a, a + 9_000) == DATA[a : a + 9_000]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


_PROXY_VARS = ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy")


def test_environment_proxies_are_used_and_no_proxy_bypasses_them(
    served: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store reads the environment once per session (requests' per-request walk of it
    # cost ~0.5 ms a GET): what it reads must still decide where each GET goes.
    for var in _PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    with FaultProxy(("127.0.0.1", served.port)) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url)
        assert _store(served).read_range("s.tar", 10, 2000) == DATA[10:2000]
        assert proxy.faults.ranges() == ["bytes=10-1999"]  # through the proxy
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        assert _store(served).read_range("s.tar", 0, 100) == DATA[:100]
        assert proxy.faults.ranges() == ["bytes=10-1999"]  # straight to the server


def test_netrc_credentials_are_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in _PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    basic = "Basic " + base64.b64encode(b"reader:s3cret").decode()
    (tmp_path / "root").mkdir()
    with FileServer(tmp_path / "root", auth_header=basic) as server:
        (server.root / "ds").mkdir()
        (server.root / "ds" / "s.tar").write_bytes(DATA)
        netrc = tmp_path / "netrc"
        netrc.write_text("machine 127.0.0.1 login reader password s3cret\n")
        monkeypatch.setenv("NETRC", str(netrc))
        assert _store(server).read_range("s.tar", 5, 50) == DATA[5:50]
        monkeypatch.setenv("NETRC", str(tmp_path / "none"))
        with pytest.raises(PermissionError, match="HTTP 401"):  # no credentials: refused
            _store(server).read_range("s.tar", 5, 50)
