"""Shards built in the token pool's workers (``wdstream/write/worker_shards.py``) when a pack
fails: its error, what it leaves, and the rerun.

Attacked: the packing process SIGKILLed after 0-12 commits, a pool worker SIGKILLed, ^C to
the whole process group, ``/dev/shm`` filled once the pack runs (a 300 MB tmpfs on
``/dev/shm`` in a mount namespace of the pack's own, so the host's is never touched), the
output on a 2 MB tmpfs. Over concat with an EOS, concat with a BOS over a ``.gz`` and a
plain file with bad lines skipped, and docs mode. Oracles outside the code under test: the
same pack at ``workers=0`` (the usual pipeline; sha256 of every file after the rerun), the
``/dev/shm`` listing (a segment of the pack's pid left 10 s after it ended is a leak) and
``/proc`` (a pool process alive 10 s after the pack is a hang).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from faultlib.common import Attempt, corpus_lines
from wdstream.testing import alive, committed_shards, live_descendants

FAULTS = ("kill", "worker", "interrupt", "shm full", "disk full")
CONFIGS: dict[str, dict[str, Any]] = {
    "concat eos": dict(seq_len=31, shard_size="8KB"),
    "concat bos, skip": dict(seq_len=50, shard_size="5KB", bos=True, eos=False, on_error="skip"),
    "docs": dict(mode="docs", seq_len=400, shard_size="6KB", shard_samples=3, on_error="skip"),
}
# The pack as a fresh process: every journal commit followed by 20 ms (so a count of commits
# can be waited for), and for "shm full" a thread that fills /dev/shm after N commits.
_DRIVER = """
import json, os, subprocess, sys, threading, time
from wdstream.write.journal import Journal
_commit, _n = Journal.commit, [0]
def _paused(self, *a, **k):
    out = _commit(self, *a, **k); _n[0] += 1; time.sleep(0.02); return out
Journal.commit = _paused
import wdstream
inputs, out, workers, kw, fill = json.loads(sys.argv[1])
def _fill():
    while _n[0] < fill: time.sleep(0.002)
    st = os.statvfs("/dev/shm")
    subprocess.run(["fallocate", "-l", str(st.f_bavail * st.f_frsize - 8192), "/dev/shm/filler"])
if fill >= 0: threading.Thread(target=_fill, daemon=True).start()
try:
    wdstream.pack(inputs, out, workers=workers, batch_bytes=2048, progress=False, **kw)
except wdstream.WdstreamError as e:
    print("ERROR:", e, file=sys.stderr); sys.exit(3)
"""
_EXPECTED = {
    "worker": "a tokenizer worker process died",
    "shm full": "/dev/shm",  # a batch's segment, or the pool's semaphores at its start
    "disk full": "no space left on device while writing",
}


def _files(root: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.iterdir())
        if not p.name.startswith(".")
    }


def _cmd(
    inputs: list[str], out: Path, workers: int, kw: dict[str, Any], fill: int = -1
) -> list[str]:
    args = json.dumps([inputs, str(out), workers, kw, fill])
    cmd = [sys.executable, "-c", _DRIVER, args]
    if fill >= 0:  # a /dev/shm of its own: 300 MB, filled by the driver
        mount = 'mount -t tmpfs -o size=300m tmpfs /dev/shm && exec "$@"'
        return ["unshare", "-m", "sh", "-c", mount, "sh", *cmd]
    return cmd


def _inputs(root: Path) -> list[str]:
    """A JSONL file with blank, empty and malformed lines, its .gz, a plain JSONL file."""
    lines = corpus_lines(300)
    for k in (40, 41, 120, 299):
        lines.insert(k, ["", "   ", "{not json", '{"text": ""}'][k % 4])
    a = root / "a.jsonl"
    a.write_text("\n".join(lines) + "\n")
    (root / "b.jsonl.gz").write_bytes(gzip.compress(a.read_bytes()))
    (root / "c.jsonl").write_text("\n".join(corpus_lines(200)) + "\n")
    return [str(a), str(root / "b.jsonl.gz"), str(root / "c.jsonl")]


def _fault(
    fault: str, proc: subprocess.Popen[bytes], out: Path, after: int, rng: random.Random
) -> None:
    """Wait for ``after`` commits, then strike (``shm full`` strikes from inside the pack)."""
    while proc.poll() is None and committed_shards(out) < after:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.03))
    if proc.poll() is not None or fault in ("shm full", "disk full"):
        return
    if fault == "kill":
        os.kill(proc.pid, signal.SIGKILL)
    elif fault == "interrupt":
        os.killpg(proc.pid, signal.SIGINT)
    else:  # a pool worker: a grandchild (the forkserver's child)
        pool = [p for p in live_descendants(proc.pid) if p not in _children(proc.pid)]
        if pool:
            os.kill(rng.choice(sorted(pool)), signal.SIGKILL)


def _children(pid: int) -> set[int]:
    return {p for p in live_descendants(pid) if _parent(p) == pid}


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def worker_shards(work: Path, scale: float) -> Iterator[Attempt]:
    """Each fault over the configurations and commit counts, drawn (seeded)."""
    root = work / "worker-shards"
    root.mkdir(parents=True, exist_ok=True)
    inputs = _inputs(root)

    def attempt(i: int, fault: str, config: str, after: int) -> Attempt:
        def run() -> str:
            kw = CONFIGS[config]
            ref = root / f"ref-{config}"
            if not (ref / "index.json").exists():
                subprocess.run(_cmd(inputs, ref, 0, kw), check=True, capture_output=True)
            want = _files(ref)
            rng = random.Random(i)
            base = work / f"worker-shards-{i}"
            shutil.rmtree(base, ignore_errors=True)
            base.mkdir()
            if fault == "disk full":
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(base)], check=True
                )
            try:
                return _attempt(fault, inputs, base / "out", kw, after, rng, want)
            finally:
                if fault == "disk full":
                    subprocess.run(["umount", str(base)], check=False)

        return run

    rng = random.Random(23)
    combos = [(f, c, a) for f in FAULTS for c in CONFIGS for a in (0, 1, 3, 7, 12)]
    for i, combo in enumerate(rng.sample(combos, max(15, int(len(combos) * 0.4 * scale)))):
        yield attempt(i, *combo)


def _attempt(fault: str, inputs: list[str], out: Path, kw: dict[str, Any], after: int,
             rng: random.Random, want: dict[str, str]) -> str:  # fmt: skip
    """One fault, its aftermath checked, the rerun compared with the usual pipeline's bytes."""
    fill = after if fault == "shm full" else -1
    proc = subprocess.Popen(_cmd(inputs, out, 2, kw, fill), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    helpers: set[int] = set()
    while proc.poll() is None and not helpers and committed_shards(out) < after:
        helpers = live_descendants(proc.pid)
        time.sleep(0.01)
    _fault(fault, proc, out, after, rng)
    helpers |= live_descendants(proc.pid)
    _, err = proc.communicate()
    said = err.decode(errors="replace")
    deadline = time.monotonic() + 10
    while any(alive(p) for p in helpers) and time.monotonic() < deadline:
        time.sleep(0.05)
    if [p for p in helpers if alive(p)]:
        return "hang: pool processes alive 10 s after the pack ended"
    if fault != "shm full":
        while time.monotonic() < deadline + 10 and _segments(proc.pid):
            time.sleep(0.05)
        if _segments(proc.pid):
            return f"crash: shared memory left: {_segments(proc.pid)}"
    if proc.returncode == 0:
        return "handled" if _files(out) == want else "silent wrong: the pack's files differ"
    expected = _EXPECTED.get(fault)
    if expected is not None and (expected not in said or "Traceback" in said):
        return f"crash: not the fault's own error: {said.strip()[-300:]}"
    if fault == "disk full":
        subprocess.run(["mount", "-o", "remount,size=64m", str(out.parent)], check=True)
    again = subprocess.Popen(_cmd(inputs, out, 2, kw), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # fmt: skip
    _, err = again.communicate()
    if again.returncode != 0:
        return f"crash: the rerun failed: {err.decode(errors='replace')[-300:]}"
    if _segments(again.pid):
        return f"crash: the rerun left shared memory: {_segments(again.pid)}"
    return "clear error" if _files(out) == want else "silent wrong: the rerun's files differ"


def _segments(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"wds{pid}_"))
