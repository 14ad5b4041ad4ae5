"""Resume: a fresh loader + ``load_state_dict`` at 90 % of an epoch -> its first batch.

Against a fresh loader at 0 % (no state), in the same process, the two alternating round by
round (``interleave``), so the ratio resumed / fresh is taken per round. Exact: the batches
after resume must equal (``torch.equal``) those the uninterrupted run delivered after the
step at which the state was taken. webdataset and the memmap reader have no loader state.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from benchlib import readers
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, ms, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

# reader -> (its dataset (a pack tool), label)
RESUMERS = {
    "wdstream": ("wdstream:tiktoken", "wdstream"),
    "mosaicml": ("mosaicml", "mosaicml-streaming"),
    "litdata": ("litdata", "litdata"),
}
FRACTION = 0.9
CHECK = 3  # batches compared after resume
GOAL = 1.5  # wdstream: resumed / fresh at most


def _json(x: Any) -> Any:
    return json.loads(json.dumps(x))  # a checkpoint is JSON-like: no tensors or tuples survive


def child_resume(reader: str, root: str, workers: int, repeats: int) -> dict[str, Any]:
    """Per round: seconds from a fresh loader (+ state) to its first batch, resumed and not."""
    import torch

    ref_loader = readers.make_loader(reader, root, workers)
    epoch = len(ref_loader)
    at = max(1, int(FRACTION * epoch))
    if at + CHECK > epoch:
        raise ValueError(f"epoch of {epoch} batches too short for resume at {at} + {CHECK}")
    it = iter(ref_loader)
    for _ in range(at):
        next(it)
    state = _json(ref_loader.state_dict())
    ref = [readers.copied(reader, next(it)) for _ in range(CHECK)]
    del it, ref_loader

    def first_batch(state: dict[str, Any] | None) -> tuple[float, list[dict[str, Any]]]:
        t0 = time.perf_counter()
        loader = readers.make_loader(reader, root, workers)
        if state is not None:
            loader.load_state_dict(_json(state))
        it = iter(loader)
        got = [readers.copied(reader, next(it))]
        seconds = time.perf_counter() - t0
        got.extend(readers.copied(reader, next(it)) for _ in range(CHECK - 1))
        del it, loader
        return seconds, got

    rounds: dict[int, dict[str, Any]] = {}
    mismatch = ""
    for rnd, kind in interleave(["resume", "cold"], repeats):
        seconds, got = first_batch(state if kind == "resume" else None)
        rounds.setdefault(rnd, {"round": rnd})[f"{kind}_s"] = seconds
        if kind == "resume" and not mismatch:
            for k, (a, b) in enumerate(zip(ref, got, strict=True)):
                for key in ("input_ids", "labels"):
                    if not torch.equal(a[key], b[key]):
                        mismatch = mismatch or f"batch {k} after resume differs ({key})"
    return {
        "epoch_batches": epoch,
        "at": at,
        "rounds": list(rounds.values()),
        "exact": not mismatch,
        "mismatch": mismatch,
        "state_bytes": len(json.dumps(state)),
    }


def measure(b: Bench) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for workers in b.workers:
        for reader, (dataset, _) in RESUMERS.items():
            root = b.path(dataset)
            key = f"{reader}/{workers}"
            if not os.path.exists(root):
                runs[key] = {"error": "no dataset (its pack failed)"}
                continue
            runs[key] = run_child(
                "resume",
                timeout=300,
                reader=reader,
                root=root,
                workers=workers,
                repeats=b.args.repeats,
            )
            b.log(f"resume {key}: {b.brief(runs[key], 'exact')}")
    return runs


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    runs = r.get("resume")
    if not runs:
        return ["## Resume", "", "Not run.", ""]
    rows, goals = [], []
    for key, x in runs.items():
        reader, workers = key.split("/")
        label = RESUMERS[reader][1]
        if "error" in x:
            rows.append([label, workers, None, None, None, None, None, None, x["error"]])
            continue
        res, cold = value_spread(x["rounds"], "resume_s"), value_spread(x["rounds"], "cold_s")
        ratio = ratio_spread(x["rounds"], x["rounds"], "resume_s", base_key="cold_s")
        rows.append(
            [
                label,
                workers,
                f"{x['at']}/{x['epoch_batches']}",
                ms(res.mid) if res else None,
                ms(cold.mid) if cold else None,
                ratio,
                "yes" if x["exact"] else f"NO: {x['mismatch']}",
                x["state_bytes"],
                first_error(x) or "ok",
            ]
        )
        if reader == "wdstream":
            goals.append(goal(f"{workers} workers", ratio, GOAL, at_most=True))
            if not x["exact"]:
                goals.append(f"{workers} workers NOT exact")
    for key, x in runs.items():
        reader, workers = key.split("/")
        wd = runs.get(f"wdstream/{workers}", {})
        if reader != "wdstream" and "rounds" in x and "rounds" in wd:
            p, w = value_spread(x["rounds"], "resume_s"), value_spread(wd["rounds"], "resume_s")
            if p and w and p.mid < w.mid:
                notes.append(
                    f"resume, {workers} workers: {RESUMERS[reader][1]} reaches its first batch "
                    f"after load_state_dict in {p.mid * 1000:.0f} ms, wdstream in "
                    f"{w.mid * 1000:.0f} ms (medians, measured in separate processes)."
                )
    return [
        "## Resume",
        "",
        f"A fresh loader (constructed inside the timing) + `load_state_dict(state)` taken after "
        f"{FRACTION * 100:.0f} % of an epoch -> its first batch, against a fresh loader at 0 % (no "
        "state), the two alternating in one process. Ratio: resumed / fresh of the same round, "
        f"median (min–max) over {r['args']['repeats']} round(s); times: medians. Exact: the "
        f"{CHECK} batches after resume equal (`torch.equal`, input_ids and labels) the {CHECK} "
        "batches the uninterrupted run delivered after the step the state was taken at. "
        "webdataset and the memmap reader have no loader state.",
        "",
        table(
            [
                "loader",
                "workers",
                "resume at batch",
                "resume → first batch ms",
                "fresh → first batch ms",
                "resumed / fresh",
                "exact",
                "state bytes",
                "status",
            ],
            rows,
        ),
        "",
        f"Goal (wdstream, resume at {FRACTION * 100:.0f} % ≤ {GOAL}x a fresh start): "
        + ("; ".join(goals) or "wdstream rows missing")
        + ".",
        "",
    ]
