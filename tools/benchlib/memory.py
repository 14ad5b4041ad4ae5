"""Memory bounded by buffers: wdstream's peak PSS over a whole epoch, 1x vs N x the data.

The corpus is packed once more N times over (the same JSONL files linked N times), and one
epoch of each dataset is read at 0 and 2 workers, interleaved round by round. If the reader's
memory is bounded by its buffers, the peak of the N x dataset stays that of the 1x one: the
ratio N x / 1x (same round, same workers) should be near 1.0x, not N.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchlib.common import BATCH, SEQ_LEN, TOKENS_PER_BATCH
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import millions, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

TOOL = "wdstream:bpe-openai"  # the x1 dataset is the read part's bpe-openai pack


def child_epoch_memory(root: str, workers: int) -> dict[str, Any]:
    """wdstream: one whole epoch (the parent samples the memory)."""
    import wdstream

    loader = wdstream.Loader(
        root,
        seq_len=SEQ_LEN,
        batch_size=BATCH,
        shuffle=True,
        seed=0,
        num_workers=workers,
        epochs=1,
    )
    t0 = time.perf_counter()
    n = sum(1 for _ in loader)
    seconds = time.perf_counter() - t0
    return {"batches": n, "tokens_per_s": n * TOKENS_PER_BATCH / seconds}


def measure(b: Bench) -> dict[str, Any]:
    files = b.r["corpus"]["files"]
    scale = b.args.scale
    big = b.work / f"corpus-x{scale}"
    big.mkdir(exist_ok=True)
    many = []
    for k in range(scale):
        for f in files:
            link = big / f"c{k}-{Path(f).name}"
            if not link.exists():
                link.symlink_to(f)
            many.append(str(link))
    out = b.path(TOOL, f"-x{scale}")
    packed = run_child("pack", timeout=400, tool=TOOL, files=many, out=out, threads=b.cores)
    b.log(f"memory: packed x{scale}: {b.brief(packed, 'seconds')}")
    res: dict[str, Any] = {"pack_x": packed}
    roots = {"x1": b.path(TOOL), f"x{scale}": out}
    contenders = [(label, w) for w in b.workers for label in roots]
    for rnd, (label, workers) in interleave(contenders, b.args.repeats):
        key = f"{label}/{workers}"
        if os.path.exists(roots[label]):
            x = run_child(
                "epoch_memory", timeout=300, sample=True, root=roots[label], workers=workers
            )
        else:
            x = {"error": "no dataset (its pack failed)"}
        x["round"] = rnd
        res.setdefault(key, []).append(x)
        b.log(f"memory {key} #{rnd}: {b.brief(x, 'peak_mb')}")
    return res


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    m = r.get("memory")
    if not m:
        return ["## Memory bounded by buffers", "", "Not run.", ""]
    scale = r["args"]["scale"]
    rows = []
    for workers in (0, 2):
        one = m.get(f"x1/{workers}")
        for label in ("x1", f"x{scale}"):
            x = m.get(f"{label}/{workers}")
            if x is None:
                continue
            peak, tps = value_spread(x, "peak_mb"), value_spread(x, "tokens_per_s")
            batches = next((y["batches"] for y in x if "batches" in y), None)
            rows.append(
                [
                    label,
                    workers,
                    batches,
                    peak.mid if peak else None,
                    "baseline" if x is one else ratio_spread(x, one, "peak_mb"),
                    millions(tps.mid) if tps else None,
                    first_error(x) or "ok",
                ]
            )
            big = ratio_spread(x, one, "peak_mb") if label != "x1" else None
            if big and big.mid > 1.25:
                notes.append(
                    f"memory, {workers} workers: the peak grows with the dataset "
                    f"(x{scale} / x1 = {big.fmt()})."
                )
    return [
        "## Memory bounded by buffers",
        "",
        f"wdstream `Loader`, one whole epoch of the corpus packed once (x1) and {scale} times "
        f"(x{scale}); peak PSS of the process tree, sampled every 0.1 s. Ratio: peak over the "
        "x1 peak of the same round and worker count, median (min–max) over "
        f"{r['args']['repeats']} interleaved round(s); the rest: medians.",
        "",
        table(
            [
                "dataset",
                "workers",
                "batches",
                "peak MB (PSS)",
                "vs x1 peak",
                "M tokens/s incl. start",
                "status",
            ],
            rows,
        ),
        "",
    ]
