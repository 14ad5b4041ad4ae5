"""The pack process under faults: killed, a failed shard write, two packs at once."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from faultlib.common import Attempt, corpus_lines, run_cli
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store

# ---------------------------------------------------------------- the writer


def pack_args(src: Path, out: Path | str) -> list[str]:
    return ["pack", str(src), "-o", str(out), "--seq-len", "63", "--shard-size", "16KB",
            "--workers", "0", "-q"]  # fmt: skip


def pack_input(work: Path) -> tuple[Path, Path]:
    """A JSONL input and its uninterrupted pack (the reference every rerun must equal)."""
    src, ref = work / "pack-in.jsonl", work / "pack-ref"
    if not ref.exists():
        src.write_text("\n".join(corpus_lines(300)) + "\n")
        subprocess.run([sys.executable, "-m", "wdstream.cli", *pack_args(src, ref)], check=True)
    return src, ref


def _rerun(src: Path, out: Path) -> str | None:
    """Rerun the same pack command; None when it exits 0 with no traceback, else what went
    wrong (its exit status and last line)."""
    cmd = [sys.executable, "-m", "wdstream.cli", *pack_args(src, out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode == 0 and "Traceback" not in proc.stderr:
        return None
    said = (proc.stderr.strip().splitlines() or [""])[-1]
    return f"{'traceback' if 'Traceback' in proc.stderr else 'exit'} {proc.returncode}: {said}"


def same_tree(a: Path, b: Path) -> bool:
    """Whether folders ``a`` and ``b`` hold the same files with the same bytes."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    other = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files == other and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def killed_packs(work: Path, scale: float) -> Iterator[Attempt]:
    src, ref = pack_input(work)
    shards = len(read_index(open_store(str(ref))).shards)
    for i, at in enumerate(np.linspace(1, shards - 1, max(2, int(6 * scale))).astype(int)):
        out = work / f"killed-{i}"

        def attempt(out: Path = out, at: int = int(at)) -> str:
            cmd = [sys.executable, "-m", "wdstream.cli", *pack_args(src, out)]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if len(list(out.glob("*.tar"))) >= at:
                    proc.kill()
                    break
                time.sleep(0.005)
            proc.wait()
            failed = _rerun(src, out)
            # Killed once it had finished (index.json published, journal removed), it left a
            # complete dataset, which the rerun refuses to overwrite and says so: fine.
            finished = (
                failed is not None
                and failed.startswith("exit")
                and ("already holds a complete dataset" in failed)
            )
            if failed is not None and not finished:
                return f"crash: the rerun failed ({failed})"
            return "handled" if same_tree(out, ref) else "silent wrong"

        yield attempt


def failed_shard_write(work: Path, scale: float) -> Iterator[Attempt]:
    src, ref = pack_input(work)
    for i, k in enumerate((1, 2)):
        out = work / f"failwrite-{i}"

        def attempt(out: Path = out, k: int = k) -> str:
            blocker = out / f"data-{k:06d}.tar"
            blocker.mkdir(parents=True)  # a directory where the shard must go: its write fails
            first = run_cli(pack_args(src, out), 120)
            blocker.rmdir()
            if first != "clear error":
                return first
            failed = _rerun(src, out)
            if failed is not None:
                return f"crash: the rerun failed ({failed})"
            return "handled" if same_tree(out, ref) else "silent wrong"

        yield attempt


def concurrent_packs(work: Path, scale: float) -> Iterator[Attempt]:
    src, ref = pack_input(work)
    for i in range(max(1, int(3 * scale))):
        out = work / f"concurrent-{i}"

        def attempt(out: Path = out) -> str:
            cmd = [sys.executable, "-m", "wdstream.cli", *pack_args(src, out)]
            procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True) for _ in range(2)]  # fmt: skip
            codes = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in procs]
            ok = [c for c, _ in codes if c == 0]
            refused = [e for c, e in codes if c != 0]
            if any("Traceback" in e for e in refused):
                return "crash"
            if not ok or any("another pack" not in e for e in refused):
                return "crash"
            return "handled" if same_tree(out, ref) else "silent wrong"

        yield attempt
