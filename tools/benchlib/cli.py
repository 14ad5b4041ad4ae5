"""Options, the order of the parts, and where the report goes.

The report goes to ``--output`` (default ``out/BENCHMARKS.md``, gitignored): a quick or
default run never touches the committed ``docs/BENCHMARKS.md``; only a full run given
``--output docs/BENCHMARKS.md`` explicitly writes it.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchlib import (
    before,
    bestfit,
    chat,
    fresh,
    gpu,
    memory,
    mixture,
    open_shards,
    pack,
    pack_large,
    rawtext,
    ray_pack,
    read,
    remote,
    report,
    resume,
    sequence,
)
from benchlib.common import COMMITTED_REPORT, DEFAULT_OUTPUT, DEFAULT_RESULTS, ROOT, WORKERS
from benchlib.corpus import build_corpus
from benchlib.env import machine
from benchlib.runner import run_child

PARTS = {
    "pack": pack,
    "pack_large": pack_large,
    "read": read,
    "resume": resume,
    "fresh": fresh,
    "sequence": sequence,
    "memory": memory,
    "remote": remote,
    "bestfit": bestfit,
    "mixture": mixture,
    "ray_pack": ray_pack,
    "chat": chat,
    "gpu": gpu,
    "rawtext": rawtext,
    "open_shards": open_shards,
}
QUICK_SKIPS = ("memory", "pack_large")
CUDA_ONLY = ("gpu",)  # in the default parts only where CUDA is available


class Bench:
    """One run: its options, work dir and results; the parts' ``measure`` functions use it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="wdbench-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.cores = os.cpu_count() or 1
        # --quick leaves out the 2-worker resume, memory and remote runs (not the reads)
        self.workers = [0] if args.quick else list(WORKERS)
        self.r: dict[str, Any] = {"args": vars(args)}
        self.t_start = time.perf_counter()
        self.before_root: str | None = None  # --before: that commit's checkout

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    @staticmethod
    def brief(res: dict[str, Any], key: str) -> str:
        if "error" in res:
            return "ERROR " + res["error"]
        v = res.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"{key}={v:,.3f}"
        return f"{key}={v}"

    def path(self, tool: str, suffix: str = "") -> str:
        """Where ``tool`` (a pack tool) writes its dataset."""
        name = {"wdstream:tiktoken": "wdstream", "wdstream:bpe-openai": "wdstream-bpe"}.get(
            tool, tool
        )
        return str(self.work / "out" / (name + suffix + (".bin" if tool == "memmap" else "")))

    def run(self) -> dict[str, Any]:
        self.r["machine"] = machine()
        self.r["versions"] = run_child("versions")
        self.r["versions"].pop("wall_s", None)
        mb = self.args.mb
        self.log(f"corpus: {mb} MB of Python sources")
        info = build_corpus(self.work / "corpus", int(mb * 1e6))
        self.r["corpus"] = info
        self.log(f"corpus: {info['docs']} docs, {info['text_bytes'] / 1e6:.1f} MB")
        if self.args.before:
            self.before_root, self.r["before"] = before.checkout(
                self.args.before, self.work / "before"
            )
            self.log(f"before: wdstream at {self.r['before']} in {self.before_root}")
        for tree in filter(None, (str(ROOT), self.before_root)):
            bytecode(Path(tree))
        try:
            for name in self.args.parts:
                self.r[name] = PARTS[name].measure(self)
        finally:
            if self.before_root:
                before.remove(self.before_root)
        self.r["total_s"] = time.perf_counter() - self.t_start
        return self.r


def bytecode(tree: Path) -> None:
    """Compile ``tree``'s ``wdstream`` package to bytecode before anything is timed.

    An installed package has its bytecode (``pip install`` compiles it; so do the peers' in
    the bench venv), and a checkout imported once has it in ``__pycache__``; but with
    ``PYTHONDONTWRITEBYTECODE`` set (as on the hosts these runs are made on) every child
    would compile wdstream's sources again, inside the clock where an import is timed (a
    Ray worker's task module: ~70 ms against ~30 from bytecode, docs/RAY.md session 45).
    """
    compileall.compile_dir(str(tree / "wdstream"), quiet=1)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tools/bench.py", description="wdstream against its peers, in one run."
    )
    p.add_argument(
        "--quick", action="store_true", help="8 MB corpus, 1 round, no memory or pack_large part"
    )
    p.add_argument("--mb", type=float, help="corpus size in MB of text (default 28, quick 8)")
    p.add_argument("--repeats", type=int, help="interleaved rounds (default 3, quick 1)")
    p.add_argument("--read-batches", type=int, help="measured batches per read (default 360)")
    p.add_argument("--warmup", type=int, default=64, help="batches before timing a read")
    p.add_argument(
        "--min-seconds",
        type=float,
        help="time every read at least this long (default 1.0, quick 0.3)",
    )
    p.add_argument("--scale", type=int, help="memory part: dataset x1 vs x SCALE (default 4)")
    p.add_argument("--delay", type=float, default=0.02, help="remote: seconds of delay per GET")
    p.add_argument("--chat-mb", type=float, help="chat: MB of conversations (default 24, quick 4)")
    p.add_argument(
        "--parts",
        help=f"comma-separated, of {','.join(PARTS)} (default all; quick: all but memory; "
        "'' for none)",
    )
    p.add_argument(
        "--before",
        metavar="COMMIT",
        help="also measure wdstream at COMMIT (checked out in the work dir) where a part "
        "can: read, fresh, mixture and rawtext, rounds interleaved with this commit's",
    )
    p.add_argument("--gpu", action="store_true", help="add the gpu part (needs CUDA)")
    p.add_argument("--gpu-device", default="cuda", help="gpu: the device (cpu: smoke test only)")
    p.add_argument("--gpu-tiny", action="store_true", help="gpu: a tiny model (smoke test only)")
    p.add_argument(
        "--gpu-steps", type=int, help="gpu: timed steps per run (default 300, quick 100)"
    )
    p.add_argument("--gpu-warmup", type=int, help="gpu: untimed steps first (default 30)")
    p.add_argument(
        "--gpu-profile-steps", type=int, help="gpu: profiled steps in round 0 (default 40)"
    )
    p.add_argument("--workdir", help="where corpus and datasets go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the temp work dir")
    p.add_argument(
        "--output",
        default=str(DEFAULT_OUTPUT),
        help="the report (default out/BENCHMARKS.md; docs/BENCHMARKS.md only for a full run)",
    )
    p.add_argument(
        "--results",
        default=str(DEFAULT_RESULTS),
        help="the raw results as JSON, for --report-only (default out/bench-results.json)",
    )
    p.add_argument("--report-only", metavar="RESULTS_JSON", help="re-render a saved run")
    a = p.parse_args(argv)
    a.mb = a.mb or (8.0 if a.quick else 28.0)
    a.repeats = a.repeats or (1 if a.quick else 3)
    a.read_batches = a.read_batches or (40 if a.quick else 360)
    a.scale = a.scale or (2 if a.quick else 4)
    a.chat_mb = a.chat_mb or (4.0 if a.quick else 24.0)
    a.min_seconds = a.min_seconds if a.min_seconds is not None else (0.3 if a.quick else 1.0)
    tiny = a.gpu_tiny
    a.gpu_steps = a.gpu_steps or (6 if tiny else 100 if a.quick else 300)
    a.gpu_warmup = a.gpu_warmup if a.gpu_warmup is not None else (2 if tiny else 30)
    a.gpu_profile_steps = (
        a.gpu_profile_steps if a.gpu_profile_steps is not None else (3 if tiny else 40)
    )
    if a.parts is None:
        a.parts = [n for n in PARTS if not (a.quick and n in QUICK_SKIPS)]
        if not (a.gpu or a.report_only or _cuda_available()):
            a.parts = [n for n in a.parts if n not in CUDA_ONLY]
    else:
        a.parts = [s.strip() for s in a.parts.split(",") if s.strip()]
    if a.gpu and "gpu" not in a.parts:
        a.parts.append("gpu")
    unknown = [n for n in a.parts if n not in PARTS]
    if unknown:
        p.error(f"unknown parts {unknown}, expected some of {','.join(PARTS)}")
    if a.quick and Path(a.output).resolve() == COMMITTED_REPORT.resolve():
        p.error(f"a --quick run does not write {COMMITTED_REPORT.relative_to(ROOT)}")
    return a


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device, asked in a child (the parent never imports torch);
    without a GPU driver (NVIDIA's, or ROCm's ``/dev/kfd``) no child is started."""
    if not any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/kfd")):
        return False
    code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = Path(args.output)
    if args.report_only:
        r = json.loads(Path(args.report_only).read_text())
        text = report.render(r, r.get("command", "python tools/bench.py"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        return
    bench = Bench(args)
    command = " ".join([Path(sys.executable).as_posix(), "tools/bench.py", *argv])
    bench.r["command"] = command
    try:
        r = bench.run()
        for path in (out, Path(args.results)):
            path.parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(json.dumps(r, indent=1, default=str))
        out.write_text(report.render(r, command), encoding="utf-8")
        bench.log(f"wrote {out} and {args.results}")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(bench.work, ignore_errors=True)
