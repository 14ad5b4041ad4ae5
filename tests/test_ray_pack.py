"""``pack(..., engine="ray")`` on a real 2-node Ray cluster on this machine (loopback only).

Every test compares against the local engine byte for byte: shards, sidecars, provenance
tables and ``index.json``. The cluster starts once for the module (two nodes of one CPU and
80 MB of object store each); S3 credentials for moto are in its environment, as a real
cluster's nodes carry their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

from tests.conftest import make_corpus
from tests.fixtures_remote import (  # noqa: F401 - fixtures used by name
    ACCESS_KEY,
    SECRET_KEY,
    SESSION_TOKEN,
    aws_env,
    moto_endpoint,
    s3_bucket,
)
from tests.ray_support import (
    NODE,
    PACK_OPTS,
    digests,
    frozen_task,
    inputs_with_long_task,
    kill_and_reap,
    pack_in_thread,
    ray_driver,
    write_corpus,
)

# Read by Ray when it is imported: "0" keeps every address on the loopback interface
# (127.0.0.1 is otherwise replaced by the machine's address), so nothing leaves the host.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from wdstream.errors import InputError, WdstreamError  # noqa: E402
from wdstream.inputs import InputFile  # noqa: E402
from wdstream.ray.layout import _consecutive_runs, _joined, index_runs  # noqa: E402
from wdstream.ray.pieces import split_pieces  # noqa: E402
from wdstream.write.pack import pack  # noqa: E402


@pytest.fixture(scope="module")
def cluster(moto_endpoint: str) -> Iterator[Any]:  # noqa: F811
    """Two Ray nodes (head + one) on 127.0.0.1, the driver (this process) connected."""
    from ray.cluster_utils import Cluster

    env = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_SESSION_TOKEN": SESSION_TOKEN,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto_endpoint,
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)  # inherited by the nodes' worker processes
        c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
        c.add_node(**NODE)
        c.wait_for_nodes()
        try:
            with ray_driver(c.address):
                yield c
        finally:
            c.shutdown()


def _wait_until_quiet(root: Path, quiet_s: float = 1.0, limit_s: float = 60.0) -> None:
    """Wait until no task of a killed driver still writes under ``root`` (the listing, sizes
    included, unchanged for ``quiet_s``): Ray stops a dead driver's tasks a moment after it
    dies, and until then their ``.partial`` files come and go (a copy of the folder could
    list one that vanishes before it is read). A task killed mid-write leaves its
    ``.partial`` behind for good; the rerun removes it under the lock."""
    deadline = time.monotonic() + limit_s
    last: list[tuple[str, int]] = []
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        now = []
        for p in root.iterdir():
            try:
                now.append((p.name, p.stat().st_size))
            except FileNotFoundError:
                now.append((p.name, -1))  # a file that vanished as it was listed
        now.sort()
        if now != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet_s:
            return
        time.sleep(0.1)
    raise AssertionError(f"tasks still writing under {root} after {limit_s} s")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("ray-inputs"))


@pytest.fixture(scope="module")
def local_outputs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The local engine's output for each mode (the reference)."""
    out = {}
    for mode in ("concat", "docs", "bestfit"):
        root = tmp_path_factory.mktemp(f"local-{mode}")
        pack([str(corpus)], str(root), mode=mode, on_error="skip", lines=True, **PACK_OPTS)
        out[mode] = root
    return out


@pytest.mark.parametrize("mode", ["concat", "docs", "bestfit"])
def test_ray_pack_is_byte_identical_to_local(
    cluster: Any, corpus: Path, local_outputs: dict[str, Path], tmp_path: Path, mode: str
) -> None:
    result = pack(
        [str(corpus)],
        str(tmp_path),
        mode=mode,
        on_error="skip",
        lines=True,
        engine="ray",
        **PACK_OPTS,
    )
    assert result.pool == "ray" and result.workers == 2
    expected = digests(local_outputs[mode])
    assert len([n for n in expected if n.endswith(".tar")]) > 3  # several shards to compare
    assert digests(tmp_path) == expected
    stats = json.loads((tmp_path / "index.json").read_text())["stats"]
    assert stats["records_skipped"] > 3 and stats["empty_documents_skipped"] > 3


@pytest.mark.parametrize("seed", range(20))
def test_a_shards_joined_runs_give_back_its_samples_indices(seed: int) -> None:
    """The runs a shard plan ships (per-sample runs, joined where one continues the one
    before, across samples too) expand to exactly the samples' token indices in order:
    consecutive documents, jumps, and bestfit's padding (-1)."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(rng.integers(1, 12)):
        parts = []
        for _ in range(rng.integers(1, 5)):
            n = int(rng.integers(1, 40))
            start = -1 if rng.random() < 0.2 else int(rng.integers(0, 10_000))
            parts.append(np.full(n, -1) if start < 0 else np.arange(start, start + n))
        samples.append(np.concatenate(parts))
    if seed % 2:  # a concat-like shard: one arange cut into samples
        whole = np.arange(500, 500 + sum(len(x) for x in samples))
        samples = np.split(whole, np.cumsum([len(x) for x in samples])[:-1])
    runs = _joined(np.concatenate([index_runs(x) for x in samples]))
    expanded = [np.full(n, -1) if a < 0 else np.arange(a, a + n) for a, n in runs.tolist()]
    assert np.array_equal(np.concatenate(expanded), np.concatenate(samples))
    assert not (runs[1:, 0] == runs[:-1].sum(axis=1))[runs[:-1, 0] >= 0].any()
    if seed % 2:
        assert runs.tolist() == [[500, sum(len(x) for x in samples)]]


def test_consecutive_runs_equal_the_full_search_and_refuse_anything_else() -> None:
    """The concat and docs layouts' shortcut (a run from each sample's first index and
    length) ships the runs the full search finds, and a sample that is not one run, or
    padding, is a driver error, not a wrong shard."""
    whole = np.arange(700, 700 + 5000)
    samples = np.split(whole, [2049, 4098, 4100])
    want = _joined(np.concatenate([index_runs(x) for x in samples]))
    assert _joined(_consecutive_runs(samples)).tolist() == want.tolist() == [[700, 5000]]
    docs = [np.arange(0, 30), np.arange(30, 31), np.arange(31, 90)]
    assert _consecutive_runs(docs).tolist() == [[0, 30], [30, 1], [31, 59]]
    for bad in ([np.array([5, 6, 8, 9])], [np.array([3, 2, 1, 4])], [np.array([-1, -1])]):
        with pytest.raises(RuntimeError, match="not one consecutive run"):
            _consecutive_runs(bad)


@pytest.mark.parametrize("size", [1, 999, 1000, 1001, 2999, 10_000])
def test_split_pieces_cuts_each_file_into_equal_ranges(size: int) -> None:
    """A splittable file becomes ceil(size / piece_bytes) contiguous ranges that differ by at
    most a byte (no short remainder task); compressed files and small ones stay whole."""
    files = [InputFile("a.jsonl", size), InputFile("b.jsonl.zst", 5000), InputFile("c.jsonl", 7)]
    pieces = split_pieces(files, 1000, lines=True, start=None)
    ranges = [(p.start, p.end) for p in pieces if p.file == 0]
    if size <= 1000:
        assert [p.whole for p in pieces if p.file == 0] == [True]
    else:
        assert len(ranges) == -(-size // 1000)
        assert ranges[0][0] == 0 and ranges[-1][1] == size
        assert all(b == c for (_, b), (c, _) in zip(ranges, ranges[1:], strict=False))
        lengths = [b - a for a, b in ranges]
        assert max(lengths) <= 1000 and max(lengths) - min(lengths) <= 1
    assert [(p.file, p.whole) for p in pieces if p.file > 0] == [(1, True), (2, True)]


def test_bad_record_in_a_later_range_is_named_by_its_line(cluster: Any, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": f"document {i} " + "word " * 200}) for i in range(900)]
    lines[700] = '{"text": "cut'
    src.write_text("\n".join(lines) + "\n")
    assert src.stat().st_size > 2 * (256 << 10)
    with pytest.raises(InputError) as local:
        pack([str(src)], str(tmp_path / "local"), **PACK_OPTS)
    with pytest.raises(InputError) as on_ray:
        pack([str(src)], str(tmp_path / "ray"), engine="ray", **PACK_OPTS)
    assert f"{src}:701:" in str(local.value)
    assert str(on_ray.value) == str(local.value)


def test_ray_pack_to_s3_is_byte_identical(
    cluster: Any,
    corpus: Path,
    local_outputs: dict[str, Path],
    s3_bucket: str,  # noqa: F811
    aws_env: str,  # noqa: F811
) -> None:
    pack(
        [str(corpus)],
        f"s3://{s3_bucket}/ds",
        on_error="skip",
        lines=True,
        engine="ray",
        **PACK_OPTS,
    )
    s3 = boto3.client("s3", endpoint_url=aws_env)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    got = {
        k.removeprefix("ds/"): hashlib.sha256(
            s3.get_object(Bucket=s3_bucket, Key=k)["Body"].read()
        ).hexdigest()
        for k in keys
    }
    assert got == digests(local_outputs["concat"])
    assert not s3.list_multipart_uploads(Bucket=s3_bucket).get("Uploads")


def test_worker_killed_mid_task_is_retried_and_output_identical(
    cluster: Any, corpus: Path, tmp_path: Path
) -> None:
    inputs, reference = inputs_with_long_task(corpus, tmp_path)
    errors: list[BaseException] = []
    thread = pack_in_thread(inputs, tmp_path / "out", errors)
    kill_and_reap(frozen_task())
    thread.join(timeout=120)
    assert not thread.is_alive() and not errors, errors
    assert digests(tmp_path / "out") == digests(reference)


def test_engine_gives_back_the_sigterm_handler(cluster: Any, tmp_path: Path) -> None:
    """A pack that connects to Ray itself leaves the process's SIGTERM handler as it found
    it: ray.init installs one raising SystemExit and ray.shutdown leaves it, so a worker
    forked afterwards (a DataLoader's, a pool's) would run Python when told to stop."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_corpus(40, seed=2)))
    code = (
        "import signal, ray\n"
        "from wdstream.write.pack import pack\n"
        "def mine(signum, frame): pass\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        "seen = []\n"
        "init = ray.init\n"
        "def watched(*a, **k):\n"
        "    out = init(*a, **k)\n"
        "    seen.append(signal.getsignal(signal.SIGTERM) is not mine)\n"
        "    return out\n"
        "ray.init = watched\n"
        f"pack([{str(src)!r}], {str(tmp_path / 'out')!r}, engine='ray',"
        f" ray_address={cluster.address!r}, **{PACK_OPTS!r})\n"
        "print(seen, signal.getsignal(signal.SIGTERM) is mine, ray.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, cwd=Path(__file__).parents[1])  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    # Ray did replace it while connected (else this test would prove nothing), and the
    # engine disconnected and put it back.
    assert out.stdout.split() == ["[True]", "True", "False"]


@pytest.mark.parametrize("mode", ["concat", "bestfit"])
def test_killed_driver_rerun_resumes_byte_identical(
    cluster: Any, tmp_path: Path, mode: str
) -> None:
    src = tmp_path / "in.jsonl"
    docs = make_corpus(3000, seed=5)
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    # bestfit: small blocks, so the resume point falls inside a block of several shards' rows
    opts = {**PACK_OPTS, "shard_size": "32KB", "mode": mode, "bestfit_buffer": 200}
    if mode != "bestfit":
        del opts["bestfit_buffer"]
    reference = tmp_path / "reference"
    pack([str(src)], str(reference), **opts)
    out = tmp_path / "out"
    code = (
        "import ray, sys\n"
        f"ray.init(address={cluster.address!r}, log_to_driver=False)\n"
        "from wdstream.write.pack import pack\n"
        f"pack([{str(src)!r}], {str(out)!r}, engine='ray', **{opts!r})\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[1])
    journal = out / ".wdstream-pack.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if journal.exists() and len(json.loads(journal.read_text())["shards"]) >= 2:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, "the pack finished before it could be killed"
    _wait_until_quiet(out)
    assert not (out / "index.json").exists()
    kept = len(json.loads(journal.read_text())["shards"])
    # A copy whose first kept shard was altered in place (same size): the rerun checks
    # kept shards against their sha256 and refuses it.
    altered = tmp_path / "altered"
    shutil.copytree(out, altered)
    tar = altered / "data-000000.tar"
    data = bytearray(tar.read_bytes())
    data[700] ^= 1
    tar.write_bytes(bytes(data))
    with pytest.raises(WdstreamError, match="data-000000.tar does not match its sha256"):
        pack([str(src)], str(altered), engine="ray", **opts)

    result = pack([str(src)], str(out), engine="ray", **opts)
    assert result.resumed_shards == kept >= 2
    assert digests(out) == digests(reference)


def test_ray_data_sink_writes_the_shards_pack_writes(cluster: Any, tmp_path: Path) -> None:
    import ray.data  # pandas and pyarrow: the ray[data] extra

    import wdstream.ray

    texts = make_corpus(600, seed=9)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    reference = tmp_path / "reference"
    pack([str(src)], str(reference), **PACK_OPTS)

    ctx = ray.data.DataContext.get_current()
    ordered, ctx.execution_options.preserve_order = ctx.execution_options.preserve_order, True
    try:
        rows = [{"text": t} for t in texts] + [{"text": ""}]
        ds = ray.data.from_items(rows, override_num_blocks=6).filter(lambda r: True)
        out = tmp_path / "sink"
        ds.write_datasink(wdstream.ray.Sink(str(out), seq_len=255, shard_size="96KB"))
    finally:
        ctx.execution_options.preserve_order = ordered
    shards = {n: d for n, d in digests(reference).items() if n.endswith((".tar", ".idx"))}
    assert len(shards) > 6
    got = digests(out)
    assert {n: d for n, d in got.items() if n.endswith((".tar", ".idx"))} == shards
    index = json.loads((out / "index.json").read_text())
    assert index["stats"]["empty_documents_skipped"] == 1
    assert index["stats"]["documents"] == len(texts)
    with pytest.raises(WdstreamError, match="empty output"):
        ds.write_datasink(wdstream.ray.Sink(str(out), seq_len=255))


def test_cli_pack_engine_ray(
    cluster: Any, corpus: Path, local_outputs: dict[str, Path], tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from wdstream.cli import main

    out = tmp_path / "cli"
    args = ["pack", str(corpus), "-o", str(out), "--seq-len", "255", "--shard-size", "96KB"]
    args += ["--on-error", "skip", "--lines", "--engine", "ray", "--ray-address", cluster.address]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "[cl100k_base/" in result.output and "ray]" in result.output
    assert digests(out) == digests(local_outputs["concat"])


def test_one_progress_bar_on_the_driver(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the bar is for a terminal
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_corpus(200, seed=3)))
    pack([str(src)], str(tmp_path / "out"), engine="ray", **{**PACK_OPTS, "progress": True})
    err = capsys.readouterr().err
    # tqdm redraws a bar in place with "\r" and ends it with one "\n" when it closes: one
    # bar is one line holding "pack:", whose last drawing is the finished bar.
    bars = [line for line in err.split("\n") if "pack:" in line]
    assert len(bars) == 1, f"{len(bars)} bars: {bars!r}"
    final = bars[0].split("\r")[-1]
    assert re.fullmatch(r"pack: 100%\|.*docs/s [\d,]+ tok/s\]", final), final
    assert all(d.startswith("pack: ") for d in bars[0].split("\r") if d), bars[0]


def test_failed_shard_write_raises_the_store_error(cluster: Any, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_corpus(200, seed=4)))
    out = tmp_path / "out"
    out.mkdir()
    (out / "data-000001.tar").mkdir()  # the second shard cannot be renamed into place
    with pytest.raises(OSError, match="data-000001.tar"):
        pack([str(src)], str(out), engine="ray", **{**PACK_OPTS, "shard_size": "32KB"})
    journal = json.loads((out / ".wdstream-pack.json").read_text())
    assert [s["name"] for s in journal["shards"]] == ["data-000000.tar"]


@pytest.mark.parametrize("kind", ["hf", "spm"])
def test_tokenizer_files_on_ray_are_byte_identical(
    cluster: Any, corpus: Path, tmp_path: Path, kind: str
) -> None:
    # Workers rebuild a file tokenizer from its recipe (path + sha256) on every node.
    from tests.tokenizer_files import build_hf_bpe, build_spm

    texts = make_corpus(300, seed=1)
    build = build_hf_bpe if kind == "hf" else build_spm
    spec = build(tmp_path / "tok", texts)
    src = corpus / "c.jsonl"
    opts = {**PACK_OPTS, "tokenizer": str(spec)}
    pack([str(src)], str(tmp_path / "local"), **opts)
    pack([str(src)], str(tmp_path / "ray"), engine="ray", **opts)
    assert digests(tmp_path / "ray") == digests(tmp_path / "local")
