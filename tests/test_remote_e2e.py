"""End to end over real servers: pack to S3 (moto) and HTTP, inspect/stats/verify remote
roots, and stream with ``Loader`` from S3 and HTTP, always comparing with the same data packed
and read locally. The fault tests make the servers of ``tests/servers.py`` really fail
(503 / SlowDown answers, bodies cut mid-way, ranges ignored) and check from the servers'
request logs that each fault happened and was recovered (retried, resumed at the first byte
not received), not only that requests were made."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from click.testing import CliRunner

from tests.servers import FaultProxy, FileServer
from wdstream import Loader
from wdstream.cli import main
from wdstream.storage import open_store
from wdstream.testing import assert_resumes_exactly, write_synthetic_dataset

pytest_plugins = ["tests.fixtures_remote"]

pytestmark = pytest.mark.timeout(120)

PACK_ARGS = ["--seq-len", "64", "--shard-size", "48KB", "--workers", "0", "-q"]
LOADER_KW: dict[str, Any] = {"seq_len": 64, "batch_size": 4, "epochs": 1, "shuffle_window": 16}


# The corpus and its local pack, once for the file: the tests only read them (each packs
# to a bucket or server of its own).
@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, corpus_docs: list[str]) -> Path:
    path = tmp_path_factory.mktemp("e2e") / "in.jsonl"
    path.write_text("".join(json.dumps({"text": t, "meta": {"n": len(t)}}) + "\n"
                            for t in corpus_docs[:80]))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def local_pack(corpus: Path) -> Path:
    out = corpus.parent / "local"
    result = CliRunner().invoke(main, ["pack", str(corpus), "--output", str(out), *PACK_ARGS])
    assert result.exit_code == 0, result.output
    return out


def _objects(root: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.name.endswith((".tar", ".idx"))
    }


def _index_shards(raw: bytes) -> Any:
    return json.loads(raw)["shards"]


def _batches(loader: Loader) -> list[tuple[list[list[int]], list[list[int]]]]:
    out = []
    for batch in loader:
        assert isinstance(batch["input_ids"], torch.Tensor)
        out.append((batch["input_ids"].tolist(), batch["labels"].tolist()))
    return out


def test_pack_to_s3_matches_local_and_cli_reads_it(
    s3_bucket: str, corpus: Path, local_pack: Path
) -> None:
    url = f"s3://{s3_bucket}/runs/ds"
    runner = CliRunner()
    result = runner.invoke(main, ["pack", str(corpus), "--output", url, *PACK_ARGS])
    assert result.exit_code == 0, result.output
    store = open_store(url)
    local = _objects(local_pack)
    assert len(local) >= 4, "the test wants several shards"
    names = store.list()
    assert [n for n in names if n.endswith((".tar", ".idx"))] == sorted(local)
    assert "index.json" in names
    for name, data in local.items():
        assert store.read(name) == data, name
    assert _index_shards(store.read("index.json")) == _index_shards(
        (local_pack / "index.json").read_bytes()
    )
    assert boto3.client("s3").list_multipart_uploads(Bucket=s3_bucket).get("Uploads") is None

    for args in (["verify", url], ["inspect", url, "-n", "2"], ["stats", url, "--json"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
    remote_stats = json.loads(runner.invoke(main, ["stats", url, "--json"]).output)
    local_stats = json.loads(runner.invoke(main, ["stats", str(local_pack), "--json"]).output)
    assert remote_stats["shards"] == local_stats["shards"]
    assert remote_stats.get("tokens") == local_stats.get("tokens")


def test_endpoint_url_option_without_env(
    s3_bucket: str, corpus: Path, local_pack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    url = f"s3://{s3_bucket}/opt/ds"
    runner = CliRunner()
    args = ["pack", str(corpus), "--output", url, "--endpoint-url", endpoint, *PACK_ARGS]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    for command in (["verify", url], ["stats", url, "--json"], ["inspect", url, "-n", "1"]):
        result = runner.invoke(main, [*command, "--endpoint-url", endpoint, "--retries", "2"])
        assert result.exit_code == 0, (command, result.output)
    assert (
        open_store(url, endpoint_url=endpoint).read("index.json")
        == (local_pack / "index.json").read_bytes()
    )


def test_pack_to_http_with_put(http_server: FileServer, corpus: Path, local_pack: Path) -> None:
    url = f"{http_server.base_url}/ds"
    result = CliRunner().invoke(main, ["pack", str(corpus), "--output", url, *PACK_ARGS])
    assert result.exit_code == 0, result.output
    assert _objects(http_server.root / "ds") == _objects(local_pack)
    assert CliRunner().invoke(main, ["verify", url]).exit_code == 0


def _upload(local: Path, url: str) -> None:
    store = open_store(url)
    for p in sorted(local.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            store.write_bytes(p.name, p.read_bytes())


def test_loader_from_s3_equals_local(s3_bucket: str, local_pack: Path) -> None:
    url = f"s3://{s3_bucket}/ds"
    _upload(local_pack, url)
    want = _batches(Loader(str(local_pack), num_workers=0, **LOADER_KW))
    assert len(want) >= 5
    assert _batches(Loader(url, num_workers=0, **LOADER_KW)) == want
    # Two worker processes, each making its own boto3 client from the pickled store.
    local2 = _batches(Loader(str(local_pack), num_workers=2, **LOADER_KW))
    assert _batches(Loader(url, num_workers=2, **LOADER_KW)) == local2


def test_resume_from_s3_is_exact(s3_bucket: str, local_pack: Path) -> None:
    url = f"s3://{s3_bucket}/ds"
    _upload(local_pack, url)
    items = assert_resumes_exactly(lambda: Loader(url, num_workers=0, **LOADER_KW), check_at=[0, 4])
    assert len(items) >= 7


Request = tuple[str, str, "str | None"]


def _scheduled_faults(
    log: list[Request], fail_every: int, cut_every: int
) -> tuple[list[int], list[int]]:
    """Which logged requests the server failed (503) and which GET bodies it cut.

    The servers decide from counters only (``tests/servers.py``, ``Faults.decide``): the n-th
    counted request fails when ``n % fail_every == 0``; among the GETs that did not fail, the
    g-th is cut when ``g % cut_every == 0``. Every method counts by default, and the log is
    appended under the same lock as the counters, so log position i is request n = i + 1.
    """
    failed, cut, gets = [], [], 0
    for i, (method, _path, _rng) in enumerate(log):
        if fail_every and (i + 1) % fail_every == 0:
            failed.append(i)
        elif method == "GET":
            gets += 1
            if cut_every and gets % cut_every == 0:
                cut.append(i)
    return failed, cut


def _resumed_range(rng: str | None, cut_at: int) -> str:
    """The Range a client that received ``cut_at`` bytes of a ``rng`` answer asks next."""
    if rng is None:
        return f"bytes={cut_at}-"
    first, _, last = rng.removeprefix("bytes=").partition("-")
    return f"bytes={int(first) + cut_at}-{last}"


def _requested_bytes(rng: str | None, size: int) -> int:
    if rng is None:
        return size
    first, _, last = rng.removeprefix("bytes=").partition("-")
    return (min(int(last), size - 1) if last else size - 1) - int(first) + 1


def _assert_faults_recovered(
    log: list[Request], local: Path, fail_every: int, cut_every: int, cut_at: int
) -> tuple[int, int]:
    """Every injected 503 was retried with the same request, and every body cut short of
    what was asked was resumed from the first byte not received. Returns how many 503s
    and how many effective cuts (a body longer than ``cut_at``) there were."""
    failed, cut = _scheduled_faults(log, fail_every, cut_every)
    for i in failed:
        assert log[i] in log[i + 1 :], f"503 on {log[i]} was not retried"
    sizes = {p.name: p.stat().st_size for p in local.iterdir() if p.is_file()}
    effective = 0
    for i in cut:
        method, path, rng = log[i]
        name = path.split("?", 1)[0].rsplit("/", 1)[-1]
        if name not in sizes or _requested_bytes(rng, sizes[name]) <= cut_at:
            continue  # nothing was missing: the answer was whole before the cut
        effective += 1
        resumed = (method, path, _resumed_range(rng, cut_at))
        assert resumed in log[i + 1 :], f"cut {log[i]} was not resumed at byte {cut_at}"
    return len(failed), effective


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_over_faulty_http_equals_local(local_pack: Path, workers: int) -> None:
    """503s and bodies cut mid-way by the real HTTP server (in the worker processes too):
    the batches equal the local ones, and each fault was really injected and recovered."""
    want = _batches(Loader(str(local_pack), num_workers=workers, **LOADER_KW))
    assert len(want) >= 5
    knobs = {"fail_every": 4, "cut_every": 3, "cut_at": 700}
    with FileServer(local_pack) as server:
        server.faults.reset(**knobs)
        opts: dict[str, Any] = {"retries": 8, "backoff": 0.001, "timeout": 5.0}
        got = _batches(Loader(server.base_url, num_workers=workers, **LOADER_KW, **opts))
        log = list(server.faults.requests)
    assert got == want
    failed, cuts = _assert_faults_recovered(log, local_pack, **knobs)
    assert failed >= 5 and cuts >= 3, (failed, cuts)


def test_loader_over_http_ignoring_range_equals_local(local_pack: Path) -> None:
    """A server that answers every ranged GET with the whole object (200): the client cuts
    the slice it asked for out of it."""
    want = _batches(Loader(str(local_pack), num_workers=0, **LOADER_KW))
    with FileServer(local_pack) as server:
        server.faults.reset(ignore_range=True)
        got = _batches(Loader(server.base_url, num_workers=0, **LOADER_KW))
        ranged = [r for r in server.faults.ranges() if r is not None]
    assert got == want
    assert len(ranged) >= 5, "the reader sent ranged GETs, which the server ignored"


def test_loader_over_faulty_s3_equals_local(
    s3_bucket: str, local_pack: Path, s3_proxy: FaultProxy
) -> None:
    """S3 through a proxy in front of moto that answers SlowDown 503s and cuts bodies: same
    batches as the local copy, each fault injected and recovered, and a resume is exact."""
    url = f"s3://{s3_bucket}/ds"
    _upload(local_pack, url)
    want = _batches(Loader(str(local_pack), num_workers=0, **LOADER_KW))
    knobs = {"fail_every": 5, "cut_every": 3, "cut_at": 700}
    s3_proxy.faults.reset(**knobs)
    opts: dict[str, Any] = {"endpoint_url": s3_proxy.base_url, "retries": 8, "backoff": 0.001}
    made: list[int] = []  # the request log's length as each loader is made

    def make() -> Loader:
        made.append(len(s3_proxy.faults.requests))
        return Loader(url, num_workers=0, **LOADER_KW, **opts)

    # The uninterrupted pass (the first loader made) is the faulty read checked: its batches
    # and the faults of its requests (those logged before the second loader was made).
    items = assert_resumes_exactly(make, check_at=[0, 3, len(want)])
    assert [(x["input_ids"], x["labels"]) for x in items] == want
    first_pass = list(s3_proxy.faults.requests)[: made[1]]
    failed, cuts = _assert_faults_recovered(first_pass, local_pack, **knobs)
    assert failed >= 3 and cuts >= 3, (failed, cuts)


def test_one_epoch_over_http_asks_no_range_of_a_shard_twice(tmp_path: Path) -> None:
    """The server's request log of one epoch at 0 workers holds each ranged GET of a shard
    once: a window's whole read must not be dropped by the window cache and its samples read
    alone again by the next fill (with the whole read started after the copy, 461 of these
    1,411 GETs were repeats, about one a batch; 1,872 of 5,665 with the 400 documents this
    test had, for ~4x its CPU)."""
    docs = "".join(
        json.dumps({"text": " ".join(f"w{i}x{j}" for j in range(300))}) + "\n" for i in range(100)
    )
    (tmp_path / "in.jsonl").write_text(docs)
    args = ["--seq-len", "64", "--shard-size", "40KB", "--workers", "0", "-q"]
    result = CliRunner().invoke(main, ["pack", str(tmp_path / "in.jsonl"), "--output",
                                       str(tmp_path / "ds"), *args])  # fmt: skip
    assert result.exit_code == 0, result.output
    with FileServer(tmp_path / "ds") as server:
        server.faults.reset()
        batches = sum(1 for _ in Loader(server.base_url, num_workers=0, **LOADER_KW))
        tar = [r for r in server.faults.requests if r[1].endswith(".tar")]
    assert batches > 400 and len(tar) > 900  # 49 shards, 461 batches
    repeated = len(tar) - len(set(tar))
    assert repeated == 0, f"{repeated} of {len(tar)} ranged GETs of shards were repeats"


def test_two_workers_fetch_what_no_workers_fetch(tmp_path: Path) -> None:
    """With workers, a rank's epoch asks the server for the same shard ranges as without:
    the training process reads the first step's samples alone, and the workers' first
    chunks run to a multiple of ``K`` (one-step chunks read their few samples alone before
    their windows whole: a GET per sample more, 8 of ~50 an epoch in the bench)."""
    write_synthetic_dataset(str(tmp_path / "ds"), n_docs=600, sample_tokens=65,
                            samples_per_shard=100)  # fmt: skip
    kw = {"seq_len": 64, "batch_size": 4, "seed": 1, "epochs": 1, "chunk_batches": 4}
    asked = {}
    with FileServer(tmp_path / "ds") as server:
        for workers in (0, 2):
            server.faults.reset()
            n = sum(1 for _ in Loader(server.base_url, num_workers=workers, **kw))
            asked[workers] = sorted(r for r in server.faults.requests if r[1].endswith(".tar"))
            assert n > 100
    assert asked[2] == asked[0]
