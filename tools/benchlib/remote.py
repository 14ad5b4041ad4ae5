"""Remote: wdstream reading ``s3://`` from a loopback moto server, plain and delayed.

One child process starts a helper process (``bench.py --serve-s3``: moto's
``ThreadedMotoServer`` and the storage tests' ``FaultProxy`` in front of it), uploads the
dataset once, then reads it in interleaved rounds: local disk, S3 through the proxy with no
delay, and with a per-GET delay, the delayed read also with the node-local cache
(``cache_dir``) after one epoch filled it (the epoch-2 rate). Ratios are per round, against
the same round's local-disk, no-delay and uncached runs. The same section also reads the
dataset over ``http://`` from a real nginx (``benchlib.nginx``; its result under ``"nginx"``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchlib import nginx
from benchlib.common import BATCH, BENCH_PY, ROOT, SEQ_LEN
from benchlib.read import child_read
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, millions, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

LATENCY_GOAL = 0.95  # delayed GETs over no delay, tokens/s (issue 26: read-ahead adapts)
# Every run of this part (local disk, S3, cached) is timed at least this many times the read
# table's --min-seconds (3 s at the default 1 s). From S3 the batches come in bursts (the
# workers' chunks of each window as it arrives, ~0.1-0.25 s apart at moto's ~110 MB/s) and
# a timing ends at the first batch after its mark: one run's rate taken at any mark in
# 0.9-1.1 s spread 13 % (median of 12 runs; near 3 s: 3.9 %), and leaving the loop (~0.13 s:
# the GETs in flight at the `break`, which a later change of session 46 stopped waiting for)
# was 1/8 of a 1 s timing (docs/STORAGE.md, session 46).
TIMING_FACTOR = 3

_AWS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def child_remote(
    root: str,
    batches: int,
    warmup: int,
    min_seconds: float,
    delays: list[float],
    workers: list[int],
    repeats: int = 1,
) -> dict[str, Any]:
    """Per ``"local/W"`` and ``"s3/W/DELAY"``: one read result per round."""
    import boto3

    os.environ.update(_AWS)
    server = subprocess.Popen(
        [sys.executable, str(BENCH_PY), "--serve-s3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    stdin, stdout = server.stdin, server.stdout

    def set_delay(delay: float) -> int:
        stdin.write(json.dumps({"delay": delay}) + "\n")
        stdin.flush()
        return int(json.loads(stdout.readline())["requests"])

    try:
        ports = json.loads(stdout.readline())
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{ports['s3']}")
        s3.create_bucket(Bucket="bench")
        for f in sorted(Path(root).rglob("*")):
            if f.is_file():
                s3.upload_file(str(f), "bench", f"ds/{f.relative_to(root).as_posix()}")
        proxy = {"endpoint_url": f"http://127.0.0.1:{ports['proxy']}"}
        kw: dict[str, Any] = {"batches": batches, "warmup": warmup, "min_seconds": min_seconds}
        out: dict[str, list[dict[str, Any]]] = {}
        for rnd, (w, delay, order) in schedule(workers, delays, repeats):
            if delay is None:
                res, key = child_read("wdstream", root, w, **kw), f"local/{w}"
            elif order == "cached":
                with tempfile.TemporaryDirectory(prefix="wdstream-bench-cache-") as cache:
                    opts = {**proxy, "cache_dir": cache}
                    set_delay(delay)
                    fill_s = _read_one_epoch("s3://bench/ds", w, opts)
                    fill_gets = set_delay(delay)
                    res = child_read("wdstream", "s3://bench/ds", w, **kw, options=opts)
                    res.update(requests=set_delay(0.0), fill_s=fill_s, fill_requests=fill_gets)
                key = f"s3/{w}/{delay}/cached"
            else:
                set_delay(delay)
                opts = {**proxy, "order": order}
                res = child_read("wdstream", "s3://bench/ds", w, **kw, options=opts)
                res["requests"] = set_delay(0.0)
                key = f"s3/{w}/{delay}" + ("/streams" if order == "streams" else "")
            res["round"] = rnd
            out.setdefault(key, []).append(res)
        return out
    finally:
        stdin.close()
        server.wait(timeout=30)


Run = tuple[int, float | None, str]  # (workers, delay (None: local disk), order or "cached")


def schedule(workers: list[int], delays: list[float], repeats: int) -> Iterator[tuple[int, Run]]:
    """``(round, run)`` of every run, in interleaved rounds (:func:`interleave`).

    Per worker count: local disk, S3 at each delay, the delayed read also in the per-rank
    streams order (to compare the global order's reads, only the rows' own samples, with
    the streams' windows) and through the node-local cache. The S3 reads at the different
    delays, which the latency rows compare, are one unit of the rotation, run back to back
    and in turn first. Rotated one by one, at 2 workers the delayed read ran right after the
    undelayed one in every round of 3, and at 0 workers round 2 put them at the two ends of
    the round; on a busy host the second of two back-to-back S3 runs measured 2-5 % slower
    in the medians (within that host's noise; docs/STORAGE.md, session 46).
    """
    units: list[list[Run]] = []
    for w in workers:
        units += [[(w, None, "global")], [(w, d, "global") for d in delays]]
        units += [[(w, max(delays), "streams")], [(w, max(delays), "cached")]]
    for rnd, unit in interleave(units, repeats):
        for run in unit[::-1] if rnd % 2 else unit:
            yield rnd, run


def _read_one_epoch(url: str, workers: int, options: dict[str, Any]) -> float:
    """Read epoch 0 as the measured runs do (same seed and shuffle), filling the cache;
    return its seconds."""
    import wdstream

    t0 = time.perf_counter()
    loader = wdstream.Loader(url, seq_len=SEQ_LEN, batch_size=BATCH, shuffle=True, seed=0,
                             num_workers=workers, epochs=1, **options)  # fmt: skip
    for _ in loader:
        pass
    return time.perf_counter() - t0


def serve_s3() -> None:
    """Helper process: moto S3 on 127.0.0.1 and a delaying proxy in front of it.

    Prints ``{"s3": port, "proxy": port}``; then each stdin line ``{"delay": s}`` sets the
    proxy's per-GET delay and answers ``{"requests": n}``, the requests the proxy forwarded
    since the line before; EOF stops both. Every S3 read goes through the proxy (delay 0 or
    not), so the two S3 figures differ only by the delay.
    """
    from moto.server import ThreadedMotoServer

    sys.path.insert(0, str(ROOT / "tests"))
    from servers import FaultProxy  # the storage tests' proxy, with its ``delay`` knob

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    proxy = FaultProxy(("127.0.0.1", port))
    print(json.dumps({"s3": port, "proxy": proxy.port}), flush=True)
    try:
        for line in sys.stdin:
            served = len(proxy.faults.requests)
            proxy.faults.reset(delay=float(json.loads(line)["delay"]), methods=("GET",))
            print(json.dumps({"requests": served}), flush=True)
    finally:
        proxy.stop()
        moto.stop()


def measure(b: Bench) -> dict[str, Any]:
    """The loopback S3 runs, and under ``"nginx"`` the nginx runs."""
    res = _measure_s3(b)
    res["nginx"] = nginx.measure(b)
    return res


def _measure_s3(b: Bench) -> dict[str, Any]:
    a = b.args
    try:
        from wdstream.storage import S3Store  # noqa: F401
    except ImportError as exc:
        return {"error": f"wdstream.storage has no S3 backend: {exc}"}
    res = run_child(
        "remote",
        timeout=400,
        root=b.path("wdstream:tiktoken"),
        batches=a.read_batches,
        warmup=a.warmup,
        min_seconds=a.min_seconds * TIMING_FACTOR,
        delays=[0.0, a.delay],
        workers=b.workers,
        repeats=a.repeats,
    )
    res["min_seconds"] = a.min_seconds * TIMING_FACTOR  # what the section says
    b.log(f"remote: {b.brief(res, 'wall_s')}")
    return res


def _cached_row(
    x: dict[str, Any], workers: int, d: float, uncached: Any, local: Any, plain: Any,
    notes: list[str],
) -> list[list[Any]]:  # fmt: skip
    """The delayed S3 read through the node-local cache, epoch 2 (after one filling epoch)."""
    runs = x.get(f"s3/{workers}/{d}/cached")
    if not runs:
        return []
    v = value_spread(runs, "tokens_per_s")
    gets = value_spread(runs, "requests")
    fill = value_spread(runs, "fill_s")
    vs_uncached = ratio_spread(runs, uncached, "tokens_per_s")
    vs_local = ratio_spread(runs, local, "tokens_per_s")
    if vs_uncached:
        notes.append(
            f"remote, {workers} workers: with the node-local cache, epoch 2 from S3 (+{d * 1000:.0f}"
            f" ms/GET) runs at {vs_uncached.fmt()} the uncached rate and "
            f"{vs_local.fmt() if vs_local else '?'} the local-disk rate."
        )
    label = (
        f"same, node-local cache, epoch 2 (vs uncached: {vs_uncached.fmt() if vs_uncached else '?'}"
        f"; filling epoch: {fill.mid:.1f} s)"
        if fill
        else "same, node-local cache, epoch 2"
    )
    return [
        [
            workers,
            label,
            millions(v.mid) if v else None,
            vs_local,
            ratio_spread(runs, plain, "tokens_per_s"),
            f"{gets.mid:.0f}" if gets else None,
            first_error(runs) or "ok",
        ]
    ]


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    x = r.get("remote")
    head = ["## Remote (loopback S3)", ""]
    if not x:
        return head + ["Not run.", ""]
    http = nginx.section(x.get("nginx"), notes)
    if "error" in x:
        return head + [f"Not measured: {x['error']}", "", *http]
    delay = r["args"]["delay"]
    timed = x.get("min_seconds", r["args"]["min_seconds"])  # runs before session 46: the same
    rows: list[list[Any]] = []
    goals: list[str] = []
    for workers in (0, 2):
        local = x.get(f"local/{workers}")
        if local is None:
            continue
        v = value_spread(local, "tokens_per_s")
        rows.append(
            [
                workers,
                "local disk",
                millions(v.mid) if v else None,
                "baseline",
                "–",
                "–",
                first_error(local) or "ok",
            ]
        )
        plain = x.get(f"s3/{workers}/0.0")
        for d in (0.0, delay):
            runs = x.get(f"s3/{workers}/{d}")
            v = value_spread(runs, "tokens_per_s")
            gets = value_spread(runs, "requests")
            vs_local = ratio_spread(runs, local, "tokens_per_s")
            vs_plain = ratio_spread(runs, plain, "tokens_per_s") if d else None
            label = "S3 via proxy, no delay" if d == 0 else f"S3 via proxy, +{d * 1000:.0f} ms/GET"
            rows.append(
                [
                    workers,
                    label,
                    millions(v.mid) if v else None,
                    vs_local,
                    vs_plain if d else "baseline",
                    f"{gets.mid:.0f}" if gets else None,
                    first_error(runs) or "ok",
                ]
            )
            if d:
                goals.append(goal(f"+{d * 1000:.0f} ms per GET vs none, {workers} workers",
                                  vs_plain, LATENCY_GOAL))  # fmt: skip
            if vs_plain and vs_plain.mid < 0.8:
                notes.append(
                    f"remote, {workers} workers: a {d * 1000:.0f} ms delay per GET cuts wdstream "
                    f"to {vs_plain.fmt()} of its no-delay S3 rate: its read-ahead does not hide "
                    "that latency here."
                )
            if d == delay:
                rows += _cached_row(x, workers, d, runs, local, plain, notes)
                old = x.get(f"s3/{workers}/{d}/streams")
                if old:
                    o = value_spread(old, "tokens_per_s")
                    o_gets = value_spread(old, "requests")
                    vs_old = ratio_spread(runs, old, "tokens_per_s")
                    rows.append(
                        [
                            workers,
                            "same, per-rank streams order (global vs streams: "
                            f"{vs_old.fmt() if vs_old else '?'})",
                            millions(o.mid) if o else None,
                            ratio_spread(old, local, "tokens_per_s"),
                            ratio_spread(old, plain, "tokens_per_s"),
                            f"{o_gets.mid:.0f}" if o_gets else None,
                            first_error(old) or "ok",
                        ]
                    )
            if d == 0 and vs_local and vs_local.mid < 0.5:
                notes.append(
                    f"remote, {workers} workers: from loopback S3 wdstream reaches "
                    f"{vs_local.fmt()} of its local-disk rate; moto is a Python server and is "
                    "likely the bound here, so this ratio says little about a real endpoint."
                )
    return head + [
        "wdstream `Loader` reading `s3://` from moto's `ThreadedMotoServer` on 127.0.0.1 (in its "
        "own process), through the storage tests' `FaultProxy` (tests/servers.py) with no delay "
        "and with a per-GET delay; same warm-up as the read table, every run timed at least "
        f"{timed:g} s (from S3 the batches come in bursts, and a timing ends at the first batch "
        "after its mark), all in one process, interleaved (the S3 reads at the two delays back "
        "to back, each first in turn). The delayed read is also made in the "
        "per-rank streams order "
        '(`order="streams"`; the default is the global order), and through the node-local '
        "cache (`cache_dir`, a fresh folder per round): one unmeasured epoch fills it, then a "
        "new `Loader` is measured like the others (the epoch-2 rate). Ratios: per round, median "
        "(min–max) over "
        f"{r['args']['repeats']} round(s). GETs: requests the proxy forwarded during one run.",
        "",
        table(
            ["workers", "source", "M tokens/s", "vs local", "vs no delay", "GETs", "status"], rows
        ),
        "",
        "Goals (read-ahead that hides the delay): " + ("; ".join(goals) or "not measured") + ".",
        "",
        *http,
    ]
