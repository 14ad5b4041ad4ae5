"""S3Store against moto's real S3 server on 127.0.0.1, and through a fault-injecting proxy."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.servers import FaultProxy, FileServer
from wdstream.storage import RemoteReadError, RemoteWriteError, open_store
from wdstream.storage.s3 import S3Store

# The fixtures (moto server, buckets, HTTP file server) live in one plugin module.
pytest_plugins = ["tests.fixtures_remote"]

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20
DATA = random.Random(11).randbytes(100_000)


def _store(url: str, **options: Any) -> S3Store:
    options = {"retries": 3, "backoff": 0.01, "timeout": 5.0, "part_size": 5 * MiB, **options}
    store = open_store(url, **options)
    assert isinstance(store, S3Store)
    return store


def _uploads(bucket: str) -> list[dict[str, object]]:
    return list(boto3.client("s3").list_multipart_uploads(Bucket=bucket).get("Uploads", []))


def test_endpoint_from_environment_and_option(
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = _store(f"s3://{s3_bucket}/p")
    store.write_bytes("x.bin", b"hello")
    assert store.url == f"s3://{s3_bucket}/p" and store.child_url("x.bin").endswith("/p/x.bin")
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    explicit = _store(f"s3://{s3_bucket}/p/", endpoint_url=endpoint)
    assert explicit.read("x.bin") == b"hello"


def test_keys_and_listing_relative_to_prefix(s3_bucket: str) -> None:
    client = boto3.client("s3")
    for key in ("a/b/one.tar", "a/b/two.tar", "a/b/.journal", "a/b/sub/deep.tar", "a/other"):
        client.put_object(Bucket=s3_bucket, Key=key, Body=key.encode())
    store = _store(f"s3://{s3_bucket}/a/b")
    assert store.list() == ["one.tar", "two.tar"]
    assert store.read("one.tar") == b"a/b/one.tar"
    assert _store(f"s3://{s3_bucket}").list() == []
    assert _store(f"s3://{s3_bucket}/a").list() == ["other"]


def test_listing_paginates(s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = boto3.client("s3")
    names = [f"s-{i:05d}.idx" for i in range(120)]
    for name in names:
        client.put_object(Bucket=s3_bucket, Key=f"ds/{name}", Body=b"")
    monkeypatch.setattr(S3Store, "_list_page_size", 50)  # 3 pages, not 1,000+ objects
    assert _store(f"s3://{s3_bucket}/ds").list() == names


def test_multipart_used_and_aborted_on_exception(s3_bucket: str) -> None:
    store = _store(f"s3://{s3_bucket}/ds")
    data = random.Random(2).randbytes(12 * MiB)
    with pytest.raises(KeyError):
        with store.writer("shard-000001.tar") as out:
            out.write(data)  # two 5 MiB parts go up here
            assert _uploads(s3_bucket), "a multipart upload should be in progress"
            raise KeyError("killed")
    assert not store.exists("shard-000001.tar")
    assert _uploads(s3_bucket) == []  # aborted, no storage left behind
    with store.writer("shard-000001.tar") as out:
        out.write(data)
    head = boto3.client("s3").head_object(Bucket=s3_bucket, Key="ds/shard-000001.tar")
    assert head["ETag"].strip('"').endswith("-3")  # 5 + 5 + 2 MiB
    assert store.read("shard-000001.tar") == data


def test_killed_writer_leaves_no_object_and_partials_are_removable(
    s3_bucket: str,
) -> None:
    store = _store(f"s3://{s3_bucket}/ds")
    ctx = store.writer("shard.tar")
    out = ctx.__enter__()
    out.write(b"z" * (11 * MiB))  # parts uploaded, then the process "dies": no __exit__
    assert not store.exists("shard.tar") and store.list() == []
    assert len(_uploads(s3_bucket)) == 1
    assert store.remove_partials() == 1
    assert _uploads(s3_bucket) == []


def test_complete_whose_reply_was_lost_still_succeeds(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=s3_proxy.base_url)
    data = random.Random(4).randbytes(6 * MiB)
    # POSTs: 1 CreateMultipartUpload, 2 CompleteMultipartUpload (done, but answered 503),
    # 3 its retry (moto, like S3, answers success for an upload completed moments ago).
    s3_proxy.faults.reset(lose_nth=2, methods=("POST",))
    with store.writer("s.tar") as out:
        out.write(data)
    assert [m for m, _, _ in s3_proxy.faults.requests].count("POST") == 3
    assert store.read("s.tar") == data


def test_small_part_size_refused(s3_bucket: str) -> None:
    with pytest.raises(ValueError, match="part_size"):
        open_store(f"s3://{s3_bucket}/x", part_size=1024)


def test_slowdown_is_retried(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    direct = _store(f"s3://{s3_bucket}/ds")
    direct.write_bytes("s.tar", DATA)
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=s3_proxy.base_url)
    s3_proxy.faults.reset(fail_first=3)
    assert store.read_range("s.tar", 100, 5_000) == DATA[100:5_000]
    s3_proxy.faults.reset(fail_every=2)
    assert store.size("s.tar") == len(DATA)
    assert store.exists("s.tar") and not store.exists("nope")
    assert store.list() == ["s.tar"]
    store.write_bytes("w.tar", b"written through 503s")
    store.delete("s.tar")
    assert direct.list() == ["w.tar"]


def test_cut_bodies_resume_from_last_byte(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    _store(f"s3://{s3_bucket}/ds").write_bytes("s.tar", DATA)
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=s3_proxy.base_url)
    s3_proxy.faults.reset(cut_first=3, cut_at=1000)
    assert store.read_range("s.tar", 10, 50_000) == DATA[10:50_000]
    assert s3_proxy.faults.ranges() == [
        "bytes=10-49999", "bytes=1010-49999", "bytes=2010-49999", "bytes=3010-49999"
    ]  # fmt: skip
    s3_proxy.faults.reset(cut_first=2, cut_at=30_000)
    assert store.read("s.tar") == DATA
    assert s3_proxy.faults.ranges() == [None, "bytes=30000-", "bytes=60000-"]


def test_retry_budget_gives_clear_error_without_credentials(
    s3_bucket: str,
    s3_proxy: FaultProxy,
    fake_credentials: tuple[str, str, str],
) -> None:
    _store(f"s3://{s3_bucket}/ds").write_bytes("s.tar", DATA)
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=s3_proxy.base_url, retries=2)
    s3_proxy.faults.reset(fail_every=1)
    with pytest.raises(RemoteReadError) as info:
        store.read_range("s.tar", 2_048, 4_096)
    text = str(info.value)
    assert f"s3://{s3_bucket}/ds/s.tar" in text and "byte 2048" in text and "SlowDown" in text
    assert isinstance(info.value, OSError) and info.value.offset == 2_048
    with pytest.raises(RemoteWriteError) as winfo:
        store.write_bytes("w.tar", b"x")
    texts = [text, repr(info.value), info.value.cause, str(winfo.value), repr(store)]
    for t in texts:
        for secret in fake_credentials:
            assert secret not in t, t


def test_cut_forever_fails_at_offset(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    _store(f"s3://{s3_bucket}/ds").write_bytes("s.tar", DATA)
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=s3_proxy.base_url, retries=2)
    s3_proxy.faults.reset(cut_every=1, cut_at=0)
    t0 = time.perf_counter()
    with pytest.raises(RemoteReadError, match="at byte 0 .*without progress"):
        store.read("s.tar")
    assert time.perf_counter() - t0 < 5


def test_unreachable_endpoint_fails_fast(s3_bucket: str, tmp_path: Path) -> None:
    with FileServer(tmp_path) as server:
        dead = server.base_url  # closed once the block ends
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=dead, retries=1, timeout=0.5)
    t0 = time.perf_counter()
    with pytest.raises(RemoteReadError, match="(?i)connect"):
        store.read_range("s.tar", 0, 10)
    assert time.perf_counter() - t0 < 5


def test_slow_endpoint_times_out(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    _store(f"s3://{s3_bucket}/ds").write_bytes("s.tar", DATA)
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=s3_proxy.base_url, retries=1, timeout=0.2)
    s3_proxy.faults.reset(delay=1.0)
    t0 = time.perf_counter()
    with pytest.raises(RemoteReadError, match="(?i)timeout"):
        store.read_range("s.tar", 0, 10)
    assert time.perf_counter() - t0 < 3


def _read_in_child(store: S3Store, start: int, end: int) -> bytes:
    return store.read_range("s.tar", start, end)


def test_store_pickles_for_worker_processes(s3_bucket: str) -> None:
    store = _store(f"s3://{s3_bucket}/ds")
    store.write_bytes("s.tar", DATA)  # the parent's client exists now
    state = store.__getstate__()
    assert "_client" not in state and "_lock" not in state
    assert pickle.loads(pickle.dumps(store)).read_range("s.tar", 5, 9) == DATA[5:9]
    # Closed and joined, not terminated: the workers end on their own rather than on a
    # SIGTERM, whose handler a fork inherits from whatever this test process ran before.
    pool = multiprocessing.get_context("fork").Pool(2)
    try:
        got = pool.starmap(_read_in_child, [(store, 0, 1_000), (store, 50_000, 99_999)])
    finally:
        pool.close()
        pool.join()
    assert got == [DATA[:1_000], DATA[50_000:99_999]]


def test_stores_share_one_botocore_data_loader(aws_env: str) -> None:
    """Every store's client in a process loads botocore's models through one data loader
    (a session of its own decoded S3's service model again: ~85 ms of CPU a client), and
    boto3's data folder is on its search path once however many sessions were made."""
    clients = [S3Store(f"s3://bucket-{i}/ds").client for i in range(3)]
    loader = clients[0]._loader
    assert all(c._loader is loader for c in clients[1:])
    assert len(loader.search_paths) == len(set(loader.search_paths))
