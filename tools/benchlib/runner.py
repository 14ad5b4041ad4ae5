"""One measurement per child process, with the peak PSS of the child's whole process tree.

Every measurement runs as ``python tools/bench.py --child '["kind", {kwargs}]'``: the child
imports only what it measures (no peer's import, threads or memory leaks into another's
numbers) and prints its result as one ``BENCH_RESULT {json}`` line on stdout. The parent
never raises for a failed child: it returns ``{"error": "..."}`` (the last line of the
child's stderr, or the timeout), and the report prints it in the row's status.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from benchlib.common import BENCH_PY, ROOT

RESULT_TAG = "BENCH_RESULT "

# kind -> "module:function"; resolved in the child, so it imports only that part
CHILDREN = {
    "pack": "benchlib.pack:child_pack",
    "read": "benchlib.read:child_read",
    "resume": "benchlib.resume:child_resume",
    "fresh_epoch": "benchlib.fresh:child_epoch",
    "fresh_state": "benchlib.fresh:child_state",
    "fresh_first": "benchlib.fresh:child_first",
    "sequence": "benchlib.sequence:child_sequence",
    "epoch_memory": "benchlib.memory:child_epoch_memory",
    "remote": "benchlib.remote:child_remote",
    "nginx": "benchlib.nginx:child_nginx",
    "gpu": "benchlib.gpu:child_gpu",
    "open_shards": "benchlib.open_shards:child_open_shards",
    "versions": "benchlib.env:versions",
    "rawtext": "benchlib.rawtext:child_rawtext",
    "rawtext_state": "benchlib.rawtext:child_state",
}


def tree_pss_kb(pid: int) -> tuple[int, str | None]:
    """PSS of ``pid`` and all its descendants in KiB, and ``"PSS"``.

    PSS splits each shared page between the processes mapping it, so forked workers sharing
    the parent's torch pages are not counted twice (RSS would). Falls back to RSS (kind
    ``"RSS"``) where PSS cannot be read; ``(0, None)`` once ``pid`` is gone.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, None
    total, kind = 0, "PSS"
    for i, p in enumerate(procs):
        try:
            info = p.memory_full_info()
            total += getattr(info, "pss", info.rss)
            kind = kind if hasattr(info, "pss") else "RSS"
        except psutil.Error:  # exited between the listing and the read, or a zombie
            if i == 0:
                return 0, None
    return total // 1024, kind


class PeakSampler:
    """Samples a process tree's memory every ``interval`` s in a thread; ``peak_mb`` after."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval = pid, interval
        self.peak_kb, self.kind, self.samples = 0, "PSS", 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            kb, kind = tree_pss_kb(self.pid)
            if kind is not None:
                self.samples += 1
                self.peak_kb = max(self.peak_kb, kb)
                self.kind = kind
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return self.peak_kb / 1024


def run_command(
    cmd: Sequence[str],
    timeout: float = 300,
    sample: bool = False,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``cmd`` (in ``env``, default this process's); its ``BENCH_RESULT`` line as a
    dict, or ``{"error": ...}``.

    Adds ``wall_s``, and with ``sample`` the tree's ``peak_mb`` and ``mem_kind``. The child
    runs in its own session (process group), so a timeout kills its workers and servers too;
    the group is killed before the child is reaped, so its id cannot belong to another.
    """
    errfile = tempfile.TemporaryFile(mode="w+")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=errfile,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    sampler = PeakSampler(proc.pid) if sample else contextlib.nullcontext()
    try:
        with sampler:
            out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    result = None
    for line in out.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
    if result is None:
        errfile.seek(0)
        tail = [ln for ln in errfile.read().strip().splitlines() if ln.strip()]
        return {"error": (tail[-1] if tail else f"exit {proc.returncode}")[:300]}
    result["wall_s"] = wall
    if isinstance(sampler, PeakSampler):
        result["peak_mb"] = sampler.peak_mb
        result["mem_kind"] = sampler.kind
    return result


def run_child(
    kind: str,
    timeout: float = 300,
    sample: bool = False,
    code_root: str | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run the measurement ``CHILDREN[kind](**kwargs)`` in a child process.

    With ``code_root`` (a checkout of another commit, :mod:`benchlib.before`) the child
    imports ``wdstream`` from there: ``PYTHONPATH`` comes before the installed package.
    """
    if kind not in CHILDREN:
        raise ValueError(f"unknown child kind {kind!r}, expected one of {sorted(CHILDREN)}")
    cmd = [sys.executable, str(BENCH_PY), "--child", json.dumps([kind, kwargs])]
    env = None
    if code_root is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (code_root, os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    return run_command(cmd, timeout=timeout, sample=sample, env=env)


def child_main(spec: str) -> None:
    """In the child: run one measurement and print its result line."""
    kind, kwargs = json.loads(spec)
    module, func = CHILDREN[kind].split(":")
    try:
        result = getattr(importlib.import_module(module), func)(**kwargs)
    except ImportError as exc:
        result = {"error": f"not installed: {exc}"}
    print(RESULT_TAG + json.dumps(result), flush=True)
