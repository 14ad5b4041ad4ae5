"""Shared by the Ray pack tests: the inputs, the pack options, and the tools to fault a task.

Ray must be imported after ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set (it keeps every
address on the loopback interface); importing this module sets it first.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import make_corpus

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from wdstream.write.pack import pack  # noqa: E402

NODE: dict[str, Any] = {
    "num_cpus": 1,
    "object_store_memory": 80 << 20,
    "node_ip_address": "127.0.0.1",
}
PACK_OPTS: dict[str, Any] = {"seq_len": 255, "shard_size": "96KB", "workers": 0, "progress": False}


@contextmanager
def ray_driver(address: str) -> Iterator[None]:
    """This process connected to the cluster at ``address`` as a Ray driver, and after it
    left with the SIGTERM handler it had: ``ray.init`` installs one that raises SystemExit,
    and ``ray.shutdown`` leaves it, so a pool forked by a later test in this process hung
    in ``terminate()`` (its workers, told to stop, ran Python instead of ending)."""
    import ray

    before = signal.getsignal(signal.SIGTERM)
    ray.init(address=address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        if before is not None:  # None: not set from Python (cannot be put back)
            signal.signal(signal.SIGTERM, before)


def write_corpus(d: Path) -> Path:
    """Inputs exercising every kind of piece, in ``d``: a JSONL large enough to be cut into
    byte ranges (with bad, blank and empty records), a gzip file, plain JSONL, ``.txt`` lines."""
    docs = make_corpus(2100, seed=2)
    with open(d / "a-big.jsonl", "w", encoding="utf-8") as f:
        for i, t in enumerate(docs[:1500]):
            f.write(json.dumps({"text": t}) + "\n")
            if i % 97 == 5:
                f.write("{bad json\n")
            if i % 89 == 3:
                f.write("\n")
            if i % 101 == 7:
                f.write(json.dumps({"text": ""}) + "\n")
    assert (d / "a-big.jsonl").stat().st_size > 2 * (256 << 10)  # more than one range
    with gzip.open(d / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        for t in docs[1500:1600]:
            f.write(json.dumps({"text": t}) + "\n")
    with open(d / "c.jsonl", "w", encoding="utf-8") as f:
        for t in docs[1600:1800]:
            f.write(json.dumps({"text": t}) + "\n")
    (d / "d.txt").write_text("\n".join(t.replace("\n", " ") for t in docs[1800:]) + "\n")
    return d


def digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def ray_workers_running(task: str) -> list[int]:
    """Pids of this test process's Ray workers whose title says they run ``task`` now.

    This process's: the worker's raylet is a child of this process (the clusters the
    tests start in-process), so a cluster of another test process (another pytest-xdist
    worker, a CLI run's own) is never touched.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if not cmdline.startswith(f"ray::{task}".encode()):
                continue
            raylet = int(proc_stat(int(entry.name))[1])
            if int(proc_stat(raylet)[1]) == os.getpid():
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def inputs_with_long_task(corpus: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The corpus plus ``e.jsonl.gz``, a gzip input (one whole-file task: gzip is never cut
    into byte ranges) that takes seconds to tokenise, so a fault can land mid-task; and the
    reference pack of those inputs.

    Inputs must be regular files (``pack`` refuses FIFOs), so the task is not blocked on
    its input: :func:`frozen_task` stops a running one instead.
    """
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for p in corpus.iterdir():
        (inputs / p.name).symlink_to(p)
    with gzip.open(inputs / "e.jsonl.gz", "wt", encoding="utf-8") as f:
        for t in make_corpus(6000, seed=5):
            f.write(json.dumps({"text": t}) + "\n")
    reference = tmp_path / "reference"
    pack([str(inputs)], str(reference), on_error="skip", lines=True, **PACK_OPTS)
    return inputs, reference


def pack_in_thread(inputs: Path, out: Path, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            pack([str(inputs)], str(out), on_error="skip", lines=True, engine="ray", **PACK_OPTS)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def frozen_task(timeout: float = 60) -> int:
    """The pid of a tokenising worker stopped (SIGSTOP) in the middle of its task.

    A worker's title says ``ray::tokenize_piece`` only while the task runs; read again once
    the worker is stopped, it proves the stop landed mid-task (a worker that finished in
    between is continued and the search goes on). The caller kills it, or its node.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in ray_workers_running("tokenize_piece"):
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            if pid in ray_workers_running("tokenize_piece"):
                return pid
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError("no tokenising worker caught mid-task")


def kill_and_reap(pid: int, timeout: float = 30) -> None:
    """SIGKILL ``pid`` and wait until it has exited (:func:`wait_exited`): ``os.kill`` only
    queues the signal (SIGKILL ends a stopped process too)."""
    os.kill(pid, signal.SIGKILL)
    wait_exited(pid, "SIGKILL", timeout)


def wait_exited(pid: int, after: str, timeout: float = 30) -> None:
    """Wait until ``pid`` has exited (gone, or a zombie: its files closed); ``after`` names
    what should have ended it, for the error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = proc_stat(pid)[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} still alive {timeout} s after {after}")


def proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name: state, parent pid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
