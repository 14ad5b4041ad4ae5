"""Scale simulation: what opening a many-shard dataset costs per process and per node.

Builds datasets of N shards as the open-shards bench does (``benchlib.open_shards.build``:
hard links to a real pack's shards, a real ``index.json`` and shard table), then measures,
each in fresh processes on this host:

- **memory**: RSS (and USS) of the training process and of each torch worker after the
  first batch, 2 workers, against the same at 10 shards;
- **first batch**: seconds from constructing a 0-worker ``Loader`` to its first batch;
- **HTTP, one node**: the dataset served by a counting HTTP server (Range GETs, per kind of
  object); R ranks x W workers started together as real processes sharing one
  ``cache_dir`` (one simulated node; ``--nodes`` simulates several, each its own cache
  folder), then started again on the same caches: GETs and bytes per kind;
- **tools**: seconds and peak RSS of ``wdstream stats`` (``verify`` would stop at the
  second copy of a shard: these datasets list a few shards over and over).

Usage::

    python tools/scale.py --sizes 10,10000,100000 --output docs/SCALE.md.tables
    python tools/scale.py --sizes 10,1000 --ranks 2 --workers 2      # a quick look

The tables are printed (and written to ``--output``); ``docs/SCALE.md`` holds a run's
tables with the extrapolation to 1,024 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SEQ_LEN, BATCH = 64, 8


def _kind(path: str) -> str:
    name = path.rsplit("/", 1)[-1].split("?", 1)[0]
    for suffix in (".tar", ".idx", ".prov", ".json", ".shards"):
        if name.endswith(suffix):
            return name if suffix in (".json", ".shards") else suffix
    return "other"


class _Counting(SimpleHTTPRequestHandler):
    """Files of one folder with Range support; counts GETs and bytes per kind of object."""

    counts: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = Path(self.translate_path(self.path))
        if not path.is_file():
            self.send_error(404)
            return
        size = path.stat().st_size
        start, end = 0, size
        ranged = self.headers.get("Range")
        if ranged and ranged.startswith("bytes="):
            a, _, b = ranged[6:].partition("-")
            start = int(a)
            end = min(size, int(b) + 1) if b else size
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        with path.open("rb") as f:
            f.seek(start)
            self.wfile.write(f.read(end - start))
        kind = _kind(self.path)
        with self.lock:
            self.counts[(kind, "gets")] += 1
            self.counts[(kind, "bytes")] += end - start

    def do_HEAD(self) -> None:  # noqa: N802
        with self.lock:
            self.counts[(_kind(self.path), "heads")] += 1
        super().do_HEAD()


def serve_counting(folder: str) -> tuple[ThreadingHTTPServer, str]:
    """``folder`` over HTTP on 127.0.0.1 (a free port) from a thread; ``server.handler.
    counts`` counts GETs, HEADs and bytes per kind of object. Returns the server and URL."""
    handler = type("H", (_Counting,), {"counts": Counter()})

    def make(*args: Any) -> SimpleHTTPRequestHandler:
        return handler(*args, directory=folder)

    server = ThreadingHTTPServer(("127.0.0.1", 0), make)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.handler = handler  # type: ignore[attr-defined]
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _run_child(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True,
                         text=True, timeout=1800, check=False)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"child {args} failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_open(source: str, workers: int, rank: int, world: int, cache: str) -> dict[str, Any]:
    """One rank: a Loader's first batch; RSS/USS of this process and its workers after it."""
    import psutil
    import torch  # noqa: F401 - imports are not timed

    import wdstream

    me = psutil.Process()
    make = wdstream.Loader  # the lazy import of the reader is not timed (as in tools/bench.py)
    before = me.memory_info().rss
    opts: dict[str, Any] = {"cache_dir": cache} if cache else {}
    start = time.perf_counter()
    loader = make(source, seq_len=SEQ_LEN, batch_size=BATCH, num_workers=workers,
                             rank=rank, world_size=world, **opts)  # fmt: skip
    batches = iter(loader)  # held: its workers live until it goes
    batch = next(batches)
    seconds = time.perf_counter() - start
    assert batch["input_ids"].shape == (BATCH, SEQ_LEN)
    kids = me.children(recursive=True)
    infos = [k.memory_full_info() for k in kids]
    mine = me.memory_full_info()
    return {"first_batch_s": seconds, "main_rss": mine.rss, "main_uss": mine.uss,
            "main_before": before, "worker_rss": [i.rss for i in infos],
            "worker_uss": [i.uss for i in infos]}  # fmt: skip


def _tool(cmd: list[str]) -> dict[str, Any]:
    """Seconds and peak RSS of one CLI command in its own process (RSS sampled every 20 ms:
    ``ru_maxrss`` would count this process's own peak, which a child inherits at fork)."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watched, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    proc.wait()
    return {"s": time.perf_counter() - start, "peak_mb": peak / 2**20, "rc": proc.returncode}


def _http(folder: str, ranks: int, workers: int, nodes: int, work: Path) -> dict[str, Any]:
    """R ranks x W workers per node over a counting server; then started again."""
    server, url = serve_counting(folder)
    caches = [str(work / f"node-{n}") for n in range(nodes)]
    result: dict[str, Any] = {}
    try:
        for phase in ("first start", "second start"):
            server.handler.counts.clear()  # type: ignore[attr-defined]
            start = time.perf_counter()
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        "open",
                        url,
                        str(workers),
                        str(n * ranks + r),
                        str(nodes * ranks),
                        caches[n],
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )  # fmt: skip
                for n in range(nodes)
                for r in range(ranks)
            ]
            outs = [p.communicate(timeout=1800) for p in procs]
            bad = [e for p, (_, e) in zip(procs, outs, strict=True) if p.returncode]
            if bad:
                raise RuntimeError(bad[0][-3000:])
            ranks_out = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
            counts = dict(server.handler.counts)  # type: ignore[attr-defined]
            result[phase] = {
                "wall_s": time.perf_counter() - start,
                "first_batch_s": max(r["first_batch_s"] for r in ranks_out),
                "counts": {f"{k}|{m}": v for (k, m), v in sorted(counts.items())},
            }
    finally:
        server.shutdown()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sizes", default="10,10000,100000,1000000")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--work", default="/tmp/wdstream-scale")
    ap.add_argument("--output", help="also write the result as JSON here")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, *rest = args.child
        assert kind == "open"
        src, w, r, world, cache = rest
        print(json.dumps(child_open(src, int(w), int(r), int(world), cache)))
        return
    from benchlib.open_shards import build

    sizes = tuple(int(s) for s in args.sizes.split(","))
    work = Path(args.work)
    built = time.perf_counter()
    roots = build(work / "data", sizes)
    print(f"built {sizes} in {time.perf_counter() - built:.0f} s", flush=True)
    cli = str(Path(sys.executable).with_name("wdstream"))
    report: dict[str, Any] = {"sizes": {}, "ranks": args.ranks, "workers": args.workers,
                              "nodes": args.nodes}  # fmt: skip
    for n in sizes:
        root = roots[n]
        row: dict[str, Any] = {
            "index_json_bytes": os.path.getsize(f"{root}/index.json"),
            "table_bytes": os.path.getsize(f"{root}/index.shards"),
            "memory": _run_child("open", root, str(args.workers), "0", "1", ""),
            "first_batch_0w": [
                _run_child("open", root, "0", "0", "1", "")["first_batch_s"] for _ in range(3)
            ],  # fmt: skip
        }
        if n < 1_000_000:  # 1M: memory and first batch only (stats reads every sample)
            row["http"] = _http(root, args.ranks, args.workers, args.nodes, work / f"cache-{n}")
            row["stats"] = _tool([cli, "stats", root])
        report["sizes"][n] = row
        print(json.dumps({n: row}), flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
