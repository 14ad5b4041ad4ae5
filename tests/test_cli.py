"""The CLI through click's CliRunner, and once as a real subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import wdstream
from wdstream.cli import main


@pytest.fixture
def packed(tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]) -> Path:
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:50])
    out = tmp_path / "ds"
    res = CliRunner().invoke(
        main,
        [
            "pack",
            str(src),
            "-o",
            str(out),
            "--seq-len",
            "63",
            "--shard-size",
            "16KB",
            "--workers",
            "0",
        ],
    )
    assert res.exit_code == 0, res.output
    assert res.output.startswith("packed 50 documents")
    return out


def test_inspect_root_and_single_tar(packed: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["inspect", str(packed), "-n", "2"])
    assert res.exit_code == 0, res.output
    assert "data-000000.tar#0: 64 tokens" in res.output and "doc 0:" in res.output
    assert "data-000000.tar#1" in res.output and "...cont" in res.output
    # A lone tar without its sidecar is scanned.
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(packed / "data-000001.tar", lone / "x.tar")
    res = CliRunner().invoke(main, ["inspect", str(lone / "x.tar"), "-n", "1"])
    assert res.exit_code == 0, res.output
    assert "x.tar#0: 64 tokens" in res.output


def test_stats(packed: Path) -> None:
    res = CliRunner().invoke(main, ["stats", str(packed), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    idx = wdstream.DatasetIndex.from_json((packed / "index.json").read_text())
    assert s["documents"] == 50 == sum(s["doc_len_histogram"].values())
    assert s["tokens"] == idx.total_tokens and s["shards"] == len(idx.shards)
    res = CliRunner().invoke(main, ["stats", str(packed)])
    assert res.exit_code == 0 and "document length" in res.output


def test_verify_ok_and_corrupt(packed: Path) -> None:
    res = CliRunner().invoke(main, ["verify", str(packed)])
    assert res.exit_code == 0 and res.output.startswith("OK:"), res.output
    idx = wdstream.DatasetIndex.from_json((packed / "index.json").read_text())
    shard = packed / idx.shards[2].name
    data = bytearray(shard.read_bytes())
    data[512 + 3 + 1024 + 512] ^= 0xFF  # inside sample 1's msgpack map header
    shard.write_bytes(bytes(data))
    res = CliRunner().invoke(main, ["verify", str(packed)])
    assert res.exit_code == 1
    assert (
        f"{idx.shards[2].name}: sample 1 at byte" in res.output
        or f"{idx.shards[2].name}: sha256" in res.output
    )
    (packed / idx.shards[0].name).write_bytes(b"")
    res = CliRunner().invoke(main, ["verify", str(packed)])
    assert res.exit_code == 1 and idx.shards[0].name in res.output


def test_verify_names_sample_and_offset(packed: Path) -> None:
    from wdstream.format.sidecar import ShardSidecar

    idx = wdstream.DatasetIndex.from_json((packed / "index.json").read_text())
    name = idx.shards[1].name
    side = ShardSidecar.from_bytes((packed / idx.shards[1].sidecar).read_bytes())
    data = bytearray((packed / name).read_bytes())
    off = int(side.offsets[2])
    data[off : off + 4] = b"\xc1\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    (packed / name).write_bytes(bytes(data))
    res = CliRunner().invoke(main, ["verify", str(packed)])
    assert res.exit_code == 1
    assert f"{name}: sample 2 at byte {off}" in res.output


def test_pack_errors_are_clean(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["pack", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o")]
    )
    assert res.exit_code == 1 and "missing.jsonl" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(
        main, ["pack", "x", "-o", str(tmp_path / "o"), "--tokenizer", "nosuch"]
    )
    assert res.exit_code == 1


def test_real_subprocess(
    tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:20])
    exe = shutil.which("wdstream") or str(Path(sys.executable).parent / "wdstream")
    out = tmp_path / "ds"
    proc = subprocess.run(
        [exe, "pack", str(src), "--output", str(out), "--seq-len", "127"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "packed 20 documents" in proc.stdout
    # No progress bar off a terminal: stderr holds only the one-shard warning.
    assert proc.stderr.startswith("Warning: the dataset is 1 shard")
    assert len(proc.stderr.splitlines()) == 1
    proc = subprocess.run([exe, "verify", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("OK: ")


def test_demo(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["demo", "--workdir", str(tmp_path), "--megabytes", "0.5"])
    assert res.exit_code == 0, res.output
    assert "corpus:" in res.output and "packed" in res.output
    assert "input_ids (4, 128)" in res.output
    assert "resume: batches 3..5 from a restored loader match" in res.output
