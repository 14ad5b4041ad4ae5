"""The global batch sequence: ``batch_at(k)`` time against k, and elastic resume.

``batch_at``: for k = 10, 1,000 and 100,000 (past the first epoch: steps run on through
epochs), a fresh loader is built outside the timing and ``batch_at(k)`` is timed, the three
interleaved round by round; the ratio is each k's time over k = 10's in the same round, so a
flat line means the cost does not grow with k (no replay).

Elastic resume: a 2-rank run's state (rank 0, batch 4 per rank) taken halfway through an
epoch is loaded by a 1-rank loader (batch 8, same global batch): time from constructing it to
its first batch, against a fresh 1-rank loader's first batch, alternating in one process. The
resumed batch must equal the two ranks' batches of that step side by side.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from benchlib.common import BATCH, SEQ_LEN
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, ms, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

STEPS = (10, 1_000, 100_000)
ELASTIC_GOAL = 1.5  # resumed on another world size / fresh start, at most


def _loader(root: str, world: int = 1, rank: int = 0) -> Any:
    import wdstream

    return wdstream.Loader(root, seq_len=SEQ_LEN, batch_size=BATCH // world, rank=rank,
                           world_size=world, shuffle=True, seed=0, num_workers=0)  # fmt: skip


def child_sequence(root: str, repeats: int) -> dict[str, Any]:
    """Per round: batch_at seconds per k; elastic resume and fresh-start seconds."""
    import torch

    out: dict[int, dict[str, Any]] = {}
    for rnd, k in interleave(list(STEPS), repeats):
        loader = _loader(root)
        t0 = time.perf_counter()
        loader.batch_at(k)
        out.setdefault(rnd, {"round": rnd})[f"at_{k}_s"] = time.perf_counter() - t0

    half = len(_loader(root)) // 2
    saver = _loader(root, world=2, rank=0)
    it = iter(saver)
    for _ in range(half):
        next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    del it, saver
    want = torch.cat([_loader(root, 2, r).batch_at(half)["input_ids"] for r in range(2)])
    exact = True
    for rnd, kind in interleave(["elastic", "fresh"], repeats):
        t0 = time.perf_counter()
        loader = _loader(root)
        if kind == "elastic":
            loader.load_state_dict(state)
        batch = next(iter(loader))
        out[rnd][f"{kind}_s"] = time.perf_counter() - t0
        if kind == "elastic":
            exact = exact and bool(torch.equal(batch["input_ids"], want))
    return {"rounds": list(out.values()), "exact": exact, "at": half}


def measure(b: Bench) -> dict[str, Any]:
    root = b.path("wdstream:tiktoken")
    if not os.path.exists(root):
        return {"error": "no dataset (its pack failed)"}
    res = run_child("sequence", timeout=300, root=root, repeats=max(3, b.args.repeats))
    b.log(f"sequence: {b.brief(res, 'exact')}")
    return res


def _ms(v: Any) -> str:
    return f"{v.mid * 1000:.1f}" if v else "?"


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    x = r.get("sequence")
    head = ["## Global order: `batch_at` and elastic resume", ""]
    if not x:
        return head + ["Not run.", ""]
    if "error" in x:
        return head + [f"Not measured: {x['error']}", ""]
    runs = x["rounds"]
    base = "at_10_s"
    rows = []
    for k in STEPS:
        v = value_spread(runs, f"at_{k}_s")
        rows.append([f"{k:,}", ms(v.mid) if v else None,
                     ratio_spread(runs, runs, f"at_{k}_s", base_key=base)])  # fmt: skip
    elastic = ratio_spread(runs, runs, "elastic_s", base_key="fresh_s")
    e, f = value_spread(runs, "elastic_s"), value_spread(runs, "fresh_s")
    return head + [
        "`Loader.batch_at(k)` on the bench dataset (global order, batch "
        f"{BATCH} x {SEQ_LEN}, 0 workers), a fresh loader per call built outside the timing; "
        "the three k interleaved per round. Ratio: time over k = 10's, same round, median "
        f"(min–max) over {len(runs)} rounds.",
        "",
        table(["step k", "ms (median)", "vs k = 10"], rows),
        "",
        f"Elastic resume: a state of rank 0 of 2 (batch {BATCH // 2} each) at step {x['at']} "
        f"loaded by a 1-rank loader (batch {BATCH}): {_ms(e)} ms from constructing it to its "
        f"first batch, against {_ms(f)} ms for a fresh start (medians); resumed / fresh "
        f"{elastic.fmt() if elastic else '?'}; exact (the batch equals both "
        f"ranks' batches of that step): {'yes' if x['exact'] else 'NO'}. "
        + goal("elastic resume", elastic, ELASTIC_GOAL, at_most=True),
        "",
        first_error(x) or "",
    ]
