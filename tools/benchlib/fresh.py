"""Fresh: a short epoch in a fresh process, as a training script starts, against LitData.

The read part times a long run after a warm-up; a training job starts in a new process, and
a short epoch (the bench dataset's is ~430 batches) is mostly start: first windows, first
page faults, worker start. Every measurement here is one new process (``run_child``), its
imports untimed, the readers interleaved round by round:

* ``epoch``: 0 workers, constructing the loader -> its first batch, then the rest of one
  epoch in tokens/s (the steady read of a short epoch).
* ``first``: 2 workers, constructing the loader -> its first batch, in a script that imported
  what training scripts import first (``HEAVY``: transformers and its Llama model code where
  installed, and a handful of standard-library packages). Forked workers copy the whole
  process: what they cost must not grow with what the script imported.
* ``resume``: the same script, ``load_state_dict`` of a state taken at 90 % of an epoch
  (made once per reader, in its own process, and saved as JSON) -> the first batch.

Ratios are wdstream / LitData of the same round (time: lower is better; tokens/s: higher).
"""

from __future__ import annotations

import importlib
import json
import os
import time
from typing import TYPE_CHECKING, Any

from benchlib import readers
from benchlib.common import BATCH, SEQ_LEN, TOKENS_PER_BATCH
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, millions, ms, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

# What a training script has imported before it builds its loader (the handful of
# standard-library packages, then transformers' model code where installed).
HEAVY = (
    "json", "email", "http.client", "xml.dom.minidom", "unittest", "asyncio", "decimal",
    "argparse", "transformers", "transformers.models.llama.modeling_llama",
)  # fmt: skip
BEFORE = "wdstream-before"
# name -> (reader, its dataset (a pack tool), label)
READERS = {
    "wdstream": ("wdstream", "wdstream:tiktoken", "wdstream `Loader`"),
    "litdata": ("litdata", "litdata", "litdata `StreamingDataLoader`"),
    "memmap": ("memmap", "memmap", "np.memmap (nanoGPT `get_batch`)"),
    BEFORE: ("wdstream", "wdstream:tiktoken", "wdstream `Loader`, the code before"),
}
# measure -> (readers measuring it: memmap has no workers' start worth timing and no state)
MEASURES = {
    "epoch": ("wdstream", "litdata", "memmap", BEFORE),
    "first": ("wdstream", "litdata", BEFORE),
    "resume": ("wdstream", "litdata", BEFORE),
}
WORKERS = 2  # of the first and resume measures
# The first measure also times the batch that ends the first chunk of 16: a loader that hands
# its first batch early (wdstream's training process makes it before forking the workers)
# must not just move the workers' start to the batches after it.
FOLLOW = 16
RESUME_AT = 0.9
MEMMAP_EPOCH = 460  # batches of the memmap "epoch" (it has none): the bench dataset's size
# wdstream / LitData, same round: time at most, tokens/s at least
GOALS = {"epoch_first": 1.0, "epoch_tps": 1.0, "first": 1.0, "follow": 1.0, "resume": 1.0}


def _import(reader: str, heavy: bool) -> list[str]:
    """Import what the script has before its loader (untimed); the heavy modules found."""
    found = []
    for name in HEAVY if heavy else ():
        try:
            importlib.import_module(name)
            found.append(name)
        except ImportError:
            continue
    import torch  # noqa: F401

    if reader == "wdstream":
        import wdstream

        _ = wdstream.Loader  # the package imports its reader lazily (also an older commit's)
    else:
        importlib.import_module(readers.MODULES[reader])
    return found


def _make(reader: str, root: str, workers: int) -> Any:
    if reader == "wdstream":  # any commit's Loader (readers.make_loader names this one's)
        import wdstream

        return wdstream.Loader(root, seq_len=SEQ_LEN, batch_size=BATCH, shuffle=True, seed=0,
                               num_workers=workers, epochs=None)  # fmt: skip
    return readers.make_loader(reader, root, workers)


def _check(reader: str, b: Any) -> None:
    for key in ("input_ids", "labels"):
        if tuple(b[key].shape) != (BATCH, SEQ_LEN):
            raise ValueError(f"{reader}: {key} shape {tuple(b[key].shape)}")


def child_epoch(reader: str, root: str) -> dict[str, Any]:
    """0 workers: seconds to the first batch, then tokens/s over the rest of one epoch."""
    _import(reader, heavy=False)
    t0 = time.perf_counter()
    loader = _make(reader, root, 0)
    epoch = MEMMAP_EPOCH if reader == "memmap" else len(loader)
    it = readers.batches(reader, loader)
    _check(reader, next(it))
    t1 = time.perf_counter()
    for _ in range(epoch - 1):
        next(it)
    t2 = time.perf_counter()
    return {"first_batch_s": t1 - t0, "tokens_per_s": (epoch - 1) * TOKENS_PER_BATCH / (t2 - t1),
            "batches": epoch}  # fmt: skip


def child_state(reader: str, root: str, out: str) -> dict[str, Any]:
    """Write the state at ``RESUME_AT`` of an epoch (2 workers) to ``out``, as JSON."""
    _import(reader, heavy=False)
    loader = _make(reader, root, WORKERS)
    epoch = len(loader)
    at = int(RESUME_AT * epoch)
    it = iter(loader)
    for _ in range(at):
        next(it)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(loader.state_dict(), fh)
    return {"at": at, "epoch_batches": epoch}


def child_first(reader: str, root: str, state: str | None = None) -> dict[str, Any]:
    """2 workers, after the heavy imports: seconds from constructing the loader (and loading
    ``state``, a JSON file, if given) to its first batch, and to its ``FOLLOW``-th."""
    heavy = _import(reader, heavy=True)
    saved = None
    if state is not None:
        with open(state, encoding="utf-8") as fh:
            saved = json.load(fh)
    t0 = time.perf_counter()
    loader = _make(reader, root, WORKERS)
    if saved is not None:
        loader.load_state_dict(saved)
    it = iter(loader)
    _check(reader, readers.as_batch(reader, next(it)))
    t1 = time.perf_counter()
    for _ in range(FOLLOW - 1):
        _check(reader, readers.as_batch(reader, next(it)))
    return {"first_batch_s": t1 - t0, "follow_s": time.perf_counter() - t0, "heavy": heavy}


def measure(b: Bench) -> dict[str, Any]:
    """Every measure's readers, each measurement a fresh process, rounds interleaved."""
    names = [n for n in READERS if n != BEFORE or b.before_root]
    states: dict[str, Any] = {}
    for name in names:
        reader, dataset, _ = READERS[name]
        if name in MEASURES["resume"] and os.path.exists(b.path(dataset)):
            path = str(b.work / f"fresh-state-{name}.json")
            states[name] = run_child("fresh_state", timeout=240, reader=reader,
                                     root=b.path(dataset), out=path,
                                     code_root=_code(b, name))  # fmt: skip
            states[name]["path"] = path
    contenders = [(m, n) for m, ns in MEASURES.items() for n in ns if n in names]
    runs: dict[str, list[dict[str, Any]]] = {f"{m}/{n}": [] for m, n in contenders}
    for rnd, (m, name) in interleave(contenders, b.args.repeats):
        reader, dataset, _ = READERS[name]
        root = b.path(dataset)
        if not os.path.exists(root):
            res: dict[str, Any] = {"error": "no dataset (its pack failed)"}
        elif m == "resume" and "error" in states.get(name, {"error": "no state"}):
            res = {"error": f"no state: {states.get(name, {}).get('error')}"}
        else:
            kind = {"epoch": "fresh_epoch", "first": "fresh_first", "resume": "fresh_first"}[m]
            extra = {"state": states[name]["path"]} if m == "resume" else {}
            res = run_child(kind, timeout=240, reader=reader, root=root,
                            code_root=_code(b, name), **extra)  # fmt: skip
        res["round"] = rnd
        runs[f"{m}/{name}"].append(res)
        b.log(f"fresh {m}/{name} #{rnd}: {b.brief(res, 'first_batch_s')}")
    return {"runs": runs, "states": states}


def _code(b: Bench, name: str) -> str | None:
    return b.before_root if name == BEFORE else None


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    part = r.get("fresh")
    if not part:
        return ["## Short epoch in a fresh process", "", "Not run.", ""]
    runs = part["runs"]
    lit = {m: runs.get(f"{m}/litdata") for m in MEASURES}
    shown = [n for n in READERS if any(f"{m}/{n}" in runs for m in MEASURES)]
    rows = []
    for name in shown:
        ep, fi, re = (runs.get(f"{m}/{name}") for m in MEASURES)
        tps, t0 = value_spread(ep, "tokens_per_s"), value_spread(ep, "first_batch_s")
        t2, tr = value_spread(fi, "first_batch_s"), value_spread(re, "first_batch_s")
        tf = value_spread(fi, "follow_s")
        rows.append([
            READERS[name][2],
            millions(tps.mid) if tps else None,
            ratio_spread(ep, lit["epoch"], "tokens_per_s"),
            ms(t0.mid) if t0 else None,
            ratio_spread(ep, lit["epoch"], "first_batch_s"),
            ms(t2.mid) if t2 else None,
            ratio_spread(fi, lit["first"], "first_batch_s"),
            ms(tf.mid) if tf else None,
            ratio_spread(fi, lit["first"], "follow_s"),
            ms(tr.mid) if tr else None,
            ratio_spread(re, lit["resume"], "first_batch_s"),
            first_error(ep) or first_error(fi) or first_error(re) or "ok",
        ])  # fmt: skip
    wd = {m: runs.get(f"{m}/wdstream") for m in MEASURES}
    goals = [
        goal("steady tokens/s, 0 workers, wdstream / LitData",
             ratio_spread(wd["epoch"], lit["epoch"], "tokens_per_s"), GOALS["epoch_tps"]),
        goal("first batch, 0 workers, wdstream / LitData",
             ratio_spread(wd["epoch"], lit["epoch"], "first_batch_s"), GOALS["epoch_first"],
             at_most=True),
        goal(f"first batch, {WORKERS} workers, heavy script, wdstream / LitData",
             ratio_spread(wd["first"], lit["first"], "first_batch_s"), GOALS["first"],
             at_most=True),
        goal(f"batch {FOLLOW}, {WORKERS} workers, heavy script, wdstream / LitData",
             ratio_spread(wd["first"], lit["first"], "follow_s"), GOALS["follow"],
             at_most=True),
        goal(f"resume -> first batch, {WORKERS} workers, wdstream / LitData",
             ratio_spread(wd["resume"], lit["resume"], "first_batch_s"), GOALS["resume"],
             at_most=True),
    ]  # fmt: skip
    for g, m in zip(goals, ("epoch", "epoch", "first", "first", "resume"), strict=True):
        if "NOT met" in g:
            notes.append(f"fresh process, {m}: {g}.")
    heavy = next((x["heavy"] for x in wd["first"] or () if "heavy" in x), None)
    state = part["states"].get("wdstream", {})
    return [
        "## Short epoch in a fresh process",
        "",
        "Each measurement is a new process (imports untimed), the readers interleaved round by "
        "round, as a training script starts. Epoch: 0 workers, constructing the loader -> first "
        "batch, then tokens/s over the rest of one epoch "
        f"({next((x['batches'] for x in wd['epoch'] or () if 'batches' in x), '–')} batches; "
        f"memmap: {MEMMAP_EPOCH}). First batch, {WORKERS} workers: from a script that imported "
        f"{', '.join(heavy) if heavy else '(nothing extra)'} first: workers are forked from "
        f"that process; batch {FOLLOW}: the same run, the end of a first chunk (a first batch "
        "made before the workers start must not hide their start). Resume: the same script, a "
        "fresh loader + `load_state_dict` of a state "
        f"taken at batch {state.get('at', '–')} of {state.get('epoch_batches', '–')} -> its "
        "first batch. Ratios: the reader's over LitData's in the same round, median (min–max) "
        f"over {r['args']['repeats']} round(s); times and rates: medians.",
        "",
        table(
            [
                "reader",
                "epoch M tokens/s",
                "vs LitData",
                "first batch ms, 0 workers",
                "vs LitData",
                f"first batch ms, {WORKERS} workers",
                "vs LitData",
                f"batch {FOLLOW} ms",
                "vs LitData",
                f"resume -> first batch ms, {WORKERS} workers",
                "vs LitData",
                "status",
            ],
            rows,
        ),  # fmt: skip
        "",
        "Goals (wdstream against LitData, same round): " + "; ".join(goals) + ".",
        "",
    ]
