"""S3Store faults against moto on 127.0.0.1: a killed writer's multipart upload is aborted by
the next write of its key; trickling and silent endpoints fail in bounded time; a status
that no retry can fix is not retried."""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Any

import boto3
import pytest

from tests.servers import FaultProxy, SilentServer
from wdstream.storage import RemoteReadError, RemoteWriteError, open_store
from wdstream.storage.s3 import S3Store

# The fixtures (moto server, buckets, HTTP file server) live in one plugin module.
pytest_plugins = ["tests.fixtures_remote"]

pytestmark = pytest.mark.timeout(30)

MiB = 1 << 20
DATA = random.Random(13).randbytes(100_000)


def _store(url: str, **options: Any) -> S3Store:
    options = {"retries": 3, "backoff": 0.01, "timeout": 5.0, "part_size": 5 * MiB, **options}
    store = open_store(url, **options)
    assert isinstance(store, S3Store)
    return store


def _killed_upload(bucket: str, key: str) -> str:
    """Start a multipart upload and send its first part, as a writer killed mid-shard did."""
    client = boto3.client("s3")
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    client.upload_part(
        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=b"k" * (5 * MiB)
    )
    return str(upload_id)


def _uploads(bucket: str) -> list[tuple[str, str]]:
    resp = boto3.client("s3").list_multipart_uploads(Bucket=bucket)
    return sorted((u["Key"], u["UploadId"]) for u in resp.get("Uploads", []))


def test_rewrite_aborts_the_killed_runs_uploads_of_that_key(s3_bucket: str) -> None:
    _killed_upload(s3_bucket, "ds/shard.tar")  # two killed runs
    _killed_upload(s3_bucket, "ds/shard.tar")
    _killed_upload(s3_bucket, "ds/small.bin")
    other = _killed_upload(s3_bucket, "ds/shard.tar.idx")  # shares the prefix, not the key
    store = _store(f"s3://{s3_bucket}/ds")
    data = random.Random(1).randbytes(6 * MiB)
    with store.writer("shard.tar") as out:  # a multipart upload of its own
        out.write(data)
    store.write_bytes("small.bin", b"tiny")  # one PutObject
    assert _uploads(s3_bucket) == [("ds/shard.tar.idx", other)]
    assert store.read("shard.tar") == data and store.read("small.bin") == b"tiny"


def test_failing_cleanup_does_not_fail_the_write_and_is_tried_once(
    s3_bucket: str, s3_proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    _killed_upload(s3_bucket, "ds/a.bin")
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=s3_proxy.base_url)
    # GETs are only the ListMultipartUploads here; a role without the permission gets 403.
    s3_proxy.faults.reset(fail_every=1, fail_status=403, methods=("GET",))
    with caplog.at_level(logging.WARNING, logger="wdstream.storage"):
        store.write_bytes("a.bin", b"first")
        store.write_bytes("b.bin", b"second")
    # Each write: PutObject, the HEAD that checks it is stored, then (once) the listing.
    assert [m for m, _, _ in s3_proxy.faults.requests] == ["PUT", "HEAD", "GET", "PUT", "HEAD"]
    assert "ds/a.bin is written, but earlier incomplete multipart uploads" in caplog.text
    s3_proxy.faults.reset()
    assert store.read("a.bin") == b"first" and store.read("b.bin") == b"second"
    assert len(_uploads(s3_bucket)) == 1  # left for remove_partials() or a lifecycle rule
    assert store.remove_partials() == 1 and _uploads(s3_bucket) == []


def test_trickling_endpoint_fails_at_the_deadline(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    _store(f"s3://{s3_bucket}/ds").write_bytes("s.tar", DATA)
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=s3_proxy.base_url, retries=1, deadline=0.5)
    s3_proxy.faults.reset(trickle=0.05)
    t0 = time.perf_counter()
    with pytest.raises(RemoteReadError) as info:
        store.read_range("s.tar", 1_000, 9_000)
    assert time.perf_counter() - t0 < 3.0
    err = info.value
    assert err.url == f"s3://{s3_bucket}/ds/s.tar" and "DeadlineExceeded" in err.cause
    assert err.offset is not None and 1_000 < err.offset < 9_000
    first, second = s3_proxy.faults.ranges()
    resumed_at = int(re.fullmatch(r"bytes=(\d+)-8999", second or "")[1])  # type: ignore[index]
    assert first == "bytes=1000-8999" and 1_000 < resumed_at < err.offset


def test_silent_endpoint_fails_within_the_budget(s3_bucket: str) -> None:
    """The budget, not the retries, ends it: 100 retries of a 0.3 s read timeout would take
    30 s; the bound leaves 4 s for a loaded 2-core host (CI runs 3 test processes on it)."""
    with SilentServer() as silent:
        store = open_store(
            f"s3://{s3_bucket}/ds", endpoint_url=silent.base_url, timeout=(1.0, 0.3),
            budget=1.2, backoff=0.01, retries=100,
        )  # fmt: skip
        t0 = time.perf_counter()
        with pytest.raises(RemoteReadError) as info:
            store.read_range("s.tar", 0, 100)
        assert time.perf_counter() - t0 < 1.2 + 0.3 + 4.0
    text = str(info.value)
    assert f"s3://{s3_bucket}/ds/s.tar at byte 0" in text and "1.2s budget" in text
    attempts = re.search(r"failed after (\d+) attempts", text)
    assert attempts and int(attempts[1]) < 100, text
    assert re.search("(?i)read timeout", info.value.cause)


def test_put_answered_501_is_not_retried(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    store = _store(f"s3://{s3_bucket}/ds", endpoint_url=s3_proxy.base_url, retries=5)
    s3_proxy.faults.reset(fail_every=1, fail_status=501, methods=("PUT",))
    with pytest.raises(RemoteWriteError) as info:
        store.write_bytes("w.tar", b"x")
    text = str(info.value)
    assert f"PutObject s3://{s3_bucket}/ds/w.tar failed (not retried)" in text
    assert "HTTP 501" in text and "NotImplemented" in text
    assert [m for m, _, _ in s3_proxy.faults.requests] == ["PUT"]
