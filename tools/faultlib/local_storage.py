"""The read side when local storage runs out or is changed under it: the node cache
(``cache_dir``) on a small tmpfs that is full from the start or fills mid-epoch, read-only,
a file, cleared while read, its block files cut short in place or replaced by FIFOs while
read; the torch workers' piece exchange with ``/dev/shm`` full from the start or filling
mid-epoch, and its piece files cut short while taken. Every attempt is a fresh process
(``local_storage_driver.py``) in a mount namespace of its own where it mounts a tmpfs (on a
folder of the attempt, or on ``/dev/shm``: the host's is never touched), reading the tests'
HTTP file server at 0, 2 or 3 workers. Oracle: the same Loader over the local folder without
cache or workers (every batch, and the second half resumed from the state at the middle); a
process killed by a signal (SIGBUS from a file cut short under a map) is a crash.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from faultlib.common import Attempt
from wdstream.testing import write_synthetic_dataset

_DRIVER = str(Path(__file__).with_name("local_storage_driver.py"))
_PIECES = "/dev/shm/wdstream-share-*/*[0-9]"  # piece files (claims and marks end .c/.x)


def _dataset(work: Path) -> str:
    """12 MB in 8 shards of 1.5 MB (a cache block each), 366 batches of [8, 1024]."""
    root = work / "local-storage-ds"
    if not root.exists():
        write_synthetic_dataset(str(root), doc_lens=[2000] * 1500, sample_tokens=1025,
                                samples_per_shard=400)  # fmt: skip
    return str(root)


def _run(spec: dict[str, Any], mount: tuple[str, str] | None, timeout: float = 50.0) -> str:
    """The driver's outcome; ``mount``: (tmpfs options, where) in its own mount namespace."""
    cmd = [sys.executable, _DRIVER, json.dumps(spec)]
    if mount is not None:
        script = f'mount -t tmpfs -o {mount[0]} tmpfs {mount[1]} && exec "$@"'
        cmd = ["unshare", "-m", "sh", "-c", script, "sh", *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "hang"
    if proc.returncode < 0:
        return f"crash: killed by signal {-proc.returncode}: {proc.stderr[-200:]}"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return f"crash: exit {proc.returncode}: {proc.stderr[-250:]}"
    return str(json.loads(lines[-1]))


def _cases(work: Path) -> list[tuple[str, dict[str, Any], tuple[str, str] | None]]:
    """(label, driver spec without root, mount) of every attempt, the likeliest first."""
    mnt = str(work / "local-storage-mnt")
    cache = f"{mnt}/cache"
    cases: list[tuple[str, dict[str, Any], tuple[str, str] | None]] = []
    for w in (0, 2):
        for size in ("64k", "1m"):
            cases.append((f"cache disk full from the start ({size})",
                          {"cache": cache, "workers": w, "fault": "fill", "target": mnt, "at": -1},
                          (f"size={size}", mnt)))  # fmt: skip
        for at in (3, 60, 200):
            cases.append((f"cache disk fills at batch {at}",
                          {"cache": cache, "workers": w, "fault": "fill", "target": mnt, "at": at},
                          ("size=8m", mnt)))  # fmt: skip
        for at in (2, 90):
            cases.append((f"cache cleared from batch {at}",
                          {"cache": cache, "workers": w, "fault": "clear", "target": cache, "at": at},
                          ("size=64m", mnt)))  # fmt: skip
        for frac in (0.0, 0.5):
            for at in (1, 40):
                cases.append((f"cached blocks cut to {frac:.0%} from batch {at}",
                              {"cache": cache, "workers": w, "fault": "cut", "prefill": True,
                               "target": f"{cache}/*/*.blk", "frac": frac, "at": at},
                              ("size=64m", mnt)))  # fmt: skip
        cases.append(("cached blocks replaced by FIFOs from batch 5",
                      {"cache": cache, "workers": w, "fault": "fifo", "prefill": True,
                       "target": f"{cache}/*/*.blk", "at": 5}, ("size=64m", mnt)))  # fmt: skip
        cases.append(("read-only cache disk",
                      {"cache": cache, "workers": w, "fault": "none", "at": 0},
                      ("size=1m,ro", mnt)))  # fmt: skip
        cases.append(("cache_dir is a file",
                      {"cache": str(work / "local-storage-ds" / "index.json"), "workers": w,
                       "fault": "none", "at": 0}, None))  # fmt: skip
    for w in (2, 3):
        for size in ("64k", "1m"):
            cases.append((f"/dev/shm full from the start ({size})",
                          {"cache": None, "workers": w, "fault": "fill", "target": "/dev/shm",
                           "at": -1}, (f"size={size}", "/dev/shm")))  # fmt: skip
        for at in (2, 60):
            cases.append((f"/dev/shm fills at batch {at}",
                          {"cache": None, "workers": w, "fault": "fill", "target": "/dev/shm",
                           "at": at}, ("size=32m", "/dev/shm")))  # fmt: skip
        for frac in (0.0, 0.5):
            cases.append((f"exchanged pieces cut to {frac:.0%}",
                          {"cache": None, "workers": w, "fault": "cut", "target": _PIECES,
                           "frac": frac, "at": 0}, ("size=256m", "/dev/shm")))  # fmt: skip
    return cases


def local_storage(work: Path, scale: float) -> Iterator[Attempt]:
    root = _dataset(work)
    (work / "local-storage-mnt").mkdir(exist_ok=True)
    groups: dict[tuple[str, int], list[tuple[str, dict[str, Any], Any]]] = {}
    for label, spec, mount in _cases(work):  # a kind of fault at a worker count: a group
        groups.setdefault((label.split(" (")[0].split(" from")[0].split(" at")[0],
                           spec["workers"]), []).append((label, spec, mount))  # fmt: skip
    for group in groups.values():  # every kind at every worker count, at any scale
        for label, spec, mount in group[: max(1, round(scale * len(group)))]:

            def attempt(label: str = label, spec: dict[str, Any] = spec, mount: Any = mount) -> str:
                out = _run({**spec, "root": root}, mount)
                kind, _, rest = out.partition(": ")
                ok = kind in ("clear error", "handled")
                return out if ok else f"{kind}: {label}, {spec['workers']} workers: {rest or kind}"

            yield attempt
