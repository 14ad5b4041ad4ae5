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
    """Pids of worker processes whose title says they run ``task`` now."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(f"ray::{task}".encode()):
            found.append(int(entry.name))
    return found


def inputs_with_fifo(corpus: Path, tmp_path: Path) -> tuple[Path, Path, bytes]:
    """The corpus behind symlinks, its reference pack, then ``c.jsonl`` turned into a FIFO.

    The FIFO sits at the path the reference read as a file: its task blocks reading it, so
    a fault lands mid-task; the test then feeds it the same bytes.
    """
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for p in corpus.iterdir():
        (inputs / p.name).symlink_to(p)
    reference = tmp_path / "reference"
    pack([str(inputs)], str(reference), on_error="skip", lines=True, **PACK_OPTS)
    content = (corpus / "c.jsonl").read_bytes()
    (inputs / "c.jsonl").unlink()
    os.mkfifo(inputs / "c.jsonl")
    return inputs, reference, content


def pack_in_thread(inputs: Path, out: Path, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        try:
            pack([str(inputs)], str(out), on_error="skip", lines=True, engine="ray", **PACK_OPTS)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def blocked_task(timeout: float = 60) -> int:
    """The pid of a tokenising worker that stays busy (the one reading the FIFO)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in ray_workers_running("tokenize_piece"):
            time.sleep(0.5)
            if pid in ray_workers_running("tokenize_piece"):
                return pid
        time.sleep(0.05)
    raise AssertionError("no tokenising worker found blocked on its input")


def kill_and_reap(pid: int, timeout: float = 30) -> None:
    """SIGKILL ``pid`` and wait until it has exited (:func:`wait_exited`).

    ``os.kill`` only queues the signal. A worker blocked opening the FIFO already counts as
    its reader, so a writer opening it before the worker is gone pairs with the dying
    reader and gets a broken pipe instead of the retried task.
    """
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
