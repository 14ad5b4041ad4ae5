"""Scale of the peers: what N shards cost MosaicML streaming and LitData (for docs/SCALE.md).

What: for each N (default 10, 10000, 100000) this writes, under ``--root`` (default
``/tmp/peers-scale``), an MDS dataset (``streaming.MDSWriter``) and a LitData optimized
dataset (``litdata``'s ``BinaryWriter``, the writer ``optimize`` runs) of N tiny shards: 8
samples a shard, each 65 uint32 tokens stored as ``bytes`` (MDS: ``size_limit`` chosen so
that exactly 8 fit; LitData: ``chunk_size=8``). It reports the seconds to write and the
bytes of each library's ``index.json`` (total and per shard), then, in a fresh process per
library, N and worker count:

- seconds to construct the dataset (``streaming.StreamingDataset(local=..., remote=None,
  batch_size=8)`` / ``litdata.StreamingDataset(input_dir=...)``) and to read its first sample
  (0 workers: ``next(iter(ds))``; 2 workers: first batch of a torch ``DataLoader``);
- RSS after import, after the first sample, and peak (VmHWM), in MB; with 2 workers the RSS,
  USS and peak of each worker (psutil children) after the first batch;
- what appears in ``/dev/shm``, in ``$TMPDIR`` (a fresh folder per child, under
  ``--root``/tmp) and in LitData's ``~/.lightning/chunks`` while the dataset is open, and what
  stays in ``$TMPDIR`` after exit (how per-shard state is shared between processes on a node).

Each case runs in ``--repeat`` (default 3) fresh processes: the seconds are their medians
(each run's are kept), the memory and entries those of the first.

Local folders only, no network. Nothing of ours is pickled: samples are raw bytes.

Usage (the peers live in the bench venv, see tools/setup_bench_env.sh)::

    /work/benchvenv/bin/python tools/scale_peers.py                 # all sizes
    /work/benchvenv/bin/python tools/scale_peers.py --sizes 10,1000 --out /tmp/x.json

Prints the JSON result and writes it to ``--out`` (default ``/tmp/peers-scale.json``).
``--write-limit`` (seconds, default 600) skips writing larger N once the rate measured so far
says a library would take longer; the skipped entry then gives the rate and the estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

SAMPLES, TOKENS = 8, 65
MDS_SIZE_LIMIT = 2500  # 8 samples of 260 bytes (+ MDS framing) fit, a 9th does not
LIBS = ("mosaicml", "litdata")


def _mb(n: float) -> float:
    return round(n / 2**20, 1)


def _hwm(pid: int | str = "self") -> float:
    """Peak RSS (VmHWM) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return -1.0


def _sample() -> bytes:
    import numpy as np

    return np.arange(TOKENS, dtype=np.uint32).tobytes()


def write(lib: str, path: Path, n: int) -> float:
    """Write n shards of SAMPLES samples with lib into path; seconds taken."""
    shutil.rmtree(path, ignore_errors=True)
    tok = _sample()
    if lib == "mosaicml":
        from streaming import MDSWriter
    else:
        from litdata.streaming.writer import BinaryWriter
    t0 = time.perf_counter()  # imports (seconds) left out
    if lib == "mosaicml":
        with MDSWriter(
            out=str(path),
            columns={"tokens": "bytes"},
            size_limit=MDS_SIZE_LIMIT,
            progress_bar=False,
        ) as w:
            for _ in range(n * SAMPLES):
                w.write({"tokens": tok})
    else:
        bw = BinaryWriter(str(path), chunk_size=SAMPLES)
        for i in range(n * SAMPLES):
            bw.add_item(i, tok)
        bw.done()
        bw.merge(1)
    return time.perf_counter() - t0


def index_facts(lib: str, path: Path, n: int) -> dict[str, Any]:
    index = path / "index.json"
    doc = json.loads(index.read_text())
    shards = doc["shards"] if lib == "mosaicml" else doc["chunks"]
    per = {s["samples"] if lib == "mosaicml" else s["chunk_size"] for s in shards}
    size = index.stat().st_size
    files = [p for p in path.iterdir() if p.name != "index.json"]
    return {
        "index_bytes": size,
        "index_bytes_per_shard": round(size / n, 1),
        "shards": len(shards),
        "samples_per_shard": sorted(per),
        "files": len(files),
        "data_bytes": sum(p.stat().st_size for p in files),
    }


def _listing() -> dict[str, int]:
    """Entries of /dev/shm, $TMPDIR (private to the child) and LitData's cache, with sizes."""
    out = {}
    for d in ("/dev/shm", tempfile.gettempdir(), str(Path.home() / ".lightning" / "chunks")):
        try:
            for e in os.scandir(d):
                try:
                    out[e.path] = e.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
        except OSError:
            pass
    return out


def _new(before: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in _listing().items() if k not in before}


def child(lib: str, path: str, workers: int) -> dict[str, Any]:
    """Runs in a fresh process: construct, first sample/batch, memory, shm/tmp entries."""
    import psutil

    t0 = time.perf_counter()
    if lib == "mosaicml":
        import streaming
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    else:
        import litdata
    import torch  # noqa: F401 (imported by both anyway)
    from torch.utils.data import DataLoader

    proc = psutil.Process()
    res: dict[str, Any] = {
        "import_s": round(time.perf_counter() - t0, 3),
        "rss_after_import_mb": _mb(proc.memory_info().rss),
    }
    before = _listing()
    t0 = time.perf_counter()
    if lib == "mosaicml":
        ds = streaming.StreamingDataset(local=path, remote=None, batch_size=SAMPLES)
    else:
        ds = litdata.StreamingDataset(input_dir=path)
    res["construct_s"] = round(time.perf_counter() - t0, 4)
    res["rss_after_construct_mb"] = _mb(proc.memory_info().rss)
    t1 = time.perf_counter()
    if workers == 0:
        first = next(iter(ds))
    else:
        dl = DataLoader(ds, batch_size=SAMPLES, num_workers=workers)
        it = iter(dl)
        first = next(it)
    res["first_s"] = round(time.perf_counter() - t1, 4)
    res["construct_plus_first_s"] = round(time.perf_counter() - t0, 4)
    res["first_type"] = type(first).__name__
    res["rss_after_first_mb"] = _mb(proc.memory_info().rss)
    res["uss_after_first_mb"] = _mb(proc.memory_full_info().uss)
    res["peak_rss_mb"] = _hwm()
    if workers:
        kids = []
        for c in proc.children(recursive=True):
            try:
                mi = c.memory_full_info()
                kids.append(
                    {
                        "cmd": " ".join(c.cmdline())[-60:],
                        "rss_mb": _mb(mi.rss),
                        "uss_mb": _mb(mi.uss),
                        "pss_mb": _mb(mi.pss),
                        "peak_rss_mb": _hwm(c.pid),
                    }
                )
            except (psutil.Error, OSError):
                pass
        res["workers"] = kids
    new = _new(before)
    res["new_entries"] = dict(sorted(new.items())[:40])
    res["new_entries_count"] = len(new)
    return res


def run_child(lib: str, path: Path, workers: int, tmp: Path) -> dict[str, Any]:
    """One fresh process with its own empty $TMPDIR (so what it leaves there is its own)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--child", lib, str(path), str(workers)]
    t0 = time.perf_counter()
    env = dict(os.environ, TMPDIR=str(tmp))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    wall = round(time.perf_counter() - t0, 2)
    if p.returncode != 0:
        return {"error": p.stderr.strip().splitlines()[-5:], "wall_s": wall}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["process_wall_s"] = wall
    res["left_in_tmpdir_after_exit"] = sorted(e.name for e in os.scandir(tmp))
    return res


def measure(lib: str, path: Path, workers: int, repeat: int, root: Path) -> dict[str, Any]:
    """The first run's full result; construct and first-sample seconds the medians of `repeat` runs."""
    runs = [
        run_child(lib, path, workers, root / "tmp" / f"{path.name}-w{workers}-{i}")
        for i in range(repeat)
    ]
    res = runs[0]
    for key in ("construct_s", "first_s", "construct_plus_first_s"):
        got = [r[key] for r in runs if key in r]
        if got:
            res[key] = median(got)
            res[key + "_runs"] = got
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,10000,100000")
    ap.add_argument("--root", type=Path, default=Path("/tmp/peers-scale"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/peers-scale.json"))
    ap.add_argument("--write-limit", type=float, default=600.0)
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per case")
    ap.add_argument("--reuse", action="store_true", help="keep datasets whose index exists")
    ap.add_argument("--child", nargs=3, metavar=("LIB", "PATH", "WORKERS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        lib, path, workers = a.child
        print(json.dumps(child(lib, path, int(workers))))
        return
    result: dict[str, Any] = {
        "samples_per_shard": SAMPLES,
        "tokens_per_sample": TOKENS,
        "python": sys.executable,
        "runs": [],
    }
    rate: dict[str, float] = {}
    for n in (int(s) for s in a.sizes.split(",")):
        for lib in LIBS:
            path = a.root / f"{lib}-{n}"
            entry: dict[str, Any] = {"lib": lib, "n": n, "path": str(path)}
            est = n / rate[lib] if lib in rate else 0.0
            if est > a.write_limit:
                entry["skipped"] = (
                    f"writing would take ~{est:.0f} s at "
                    f"{rate[lib]:.0f} shards/s (limit {a.write_limit:.0f} s)"
                )
                result["runs"].append(entry)
                print(json.dumps(entry), file=sys.stderr, flush=True)
                continue
            if a.reuse and (path / "index.json").exists():
                entry["write_s"] = None
            else:
                secs = write(lib, path, n)
                entry["write_s"] = round(secs, 2)
                entry["write_shards_per_s"] = round(n / secs, 1)
                rate[lib] = n / secs
            entry.update(index_facts(lib, path, n))
            for w in (0, 2):
                entry[f"workers_{w}"] = measure(lib, path, w, a.repeat, a.root)
            result["runs"].append(entry)
            print(json.dumps(entry), file=sys.stderr, flush=True)
    text = json.dumps(result, indent=1)
    print(text)
    a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
