"""Read: tokens/s of every reader, 0 and 2 workers, all against one baseline.

The baseline of every row is the 0-worker ``np.memmap`` run of the same round (nanoGPT's
``get_batch`` in the training process): what a reader costs a training loop next to the
simplest thing it could do instead. The 2-worker memmap row is a contender like the others;
it shows what handing a DataLoader one batch per message costs, not what memmap costs.
Each row also says how its batches cross processes.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import TYPE_CHECKING, Any

from benchlib import readers
from benchlib.common import BATCH, SEQ_LEN, TOKENS_PER_BATCH, WORKERS
from benchlib.cputime import tree_cpu_s
from benchlib.rounds import Spread, first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, millions, ms, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

# name -> (reader, its dataset (a pack tool), loader options, label)
BEFORE = "wdstream-before"
READERS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "memmap": ("memmap", "memmap", {}, "np.memmap random windows (nanoGPT `get_batch`)"),
    "wdstream": ("wdstream", "wdstream:tiktoken", {}, "wdstream `Loader` (CRC32C checks on)"),
    "wdstream-nocrc": (
        "wdstream",
        "wdstream:tiktoken",
        {"checksums": False},
        "wdstream `Loader`, `checksums=False`",
    ),
    "mosaicml": ("mosaicml", "mosaicml", {}, "mosaicml `StreamingDataset` + `StreamingDataLoader`"),
    "litdata": (
        "litdata",
        "litdata",
        {},
        "litdata `StreamingDataset` + `TokensLoader` + `StreamingDataLoader`",
    ),
    "webdataset": ("webdataset", "webdataset", {}, "webdataset pipeline, shuffle buffer 1000"),
    # measured only with --before: the same Loader from that commit's checkout
    BEFORE: ("wdstream", "wdstream:tiktoken", {}, "wdstream `Loader` (checks on), the code before"),
}
BASELINE = "memmap/0"
PEERS = ("mosaicml", "litdata", "webdataset", "memmap")
# wdstream (checks on) vs the 0-worker memmap run; 2 workers: the global order must not lose
# the level reached before it (1.0x, issue "One global batch sequence")
GOALS = {0: 1.0, 2: 1.0}


def child_read(
    reader: str,
    root: str,
    workers: int,
    batches: int,
    warmup: int,
    min_seconds: float = 0.0,
    max_batches: int = 50_000,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokens/s after ``warmup`` batches (enough to drain every prefetch buffer).

    Times at least ``batches`` batches and at least ``min_seconds`` (fast readers would
    otherwise be timed over a few milliseconds); epochs follow one another as in training.
    The first batch is timed from constructing the loader, imports excluded. ``cpu_s``: CPU
    seconds of the whole process tree (this process and its workers) over the same batches,
    for the CPU each delivered row costs.
    """
    module = readers.MODULES[reader]  # an unknown reader fails here, before torch is imported
    import torch  # noqa: F401  (imports are not part of the loader's start-up)

    importlib.import_module(module)
    t0 = time.perf_counter()
    loader = readers.make_loader(reader, root, workers, **(options or {}))
    first = None
    n = 0
    t1 = cpu1 = 0.0
    for b in readers.batches(reader, loader):
        n += 1
        if n == 1:
            first = time.perf_counter() - t0
            for key in ("input_ids", "labels"):
                if tuple(b[key].shape) != (BATCH, SEQ_LEN):
                    raise ValueError(f"{reader}: {key} shape {tuple(b[key].shape)}")
        if n == warmup:
            cpu1 = tree_cpu_s()
            t1 = time.perf_counter()
        if n >= warmup + batches and (
            time.perf_counter() - t1 >= min_seconds or n >= warmup + max_batches
        ):
            break
    seconds = time.perf_counter() - t1
    cpu_s = tree_cpu_s() - cpu1
    measured = n - warmup
    return {
        "tokens_per_s": measured * TOKENS_PER_BATCH / seconds,
        "first_batch_s": first,
        "batches": measured,
        "seconds": seconds,
        "cpu_s": cpu_s,
        "rows": measured * BATCH,
        "transport": readers.transport(reader, workers, loader),
    }


def measure(b: Bench) -> dict[str, list[dict[str, Any]]]:
    """Every reader at 0 and 2 workers, interleaved over ``repeats`` rounds."""
    a = b.args
    names = [n for n in READERS if n != BEFORE or b.before_root]
    contenders = [(name, w) for w in WORKERS for name in names]
    runs: dict[str, list[dict[str, Any]]] = {f"{n}/{w}": [] for n, w in contenders}
    for rnd, (name, workers) in interleave(contenders, a.repeats):
        reader, dataset, options, _ = READERS[name]
        root = b.path(dataset)
        key = f"{name}/{workers}"
        if not os.path.exists(root):
            res: dict[str, Any] = {"error": "no dataset (its pack failed)"}
        else:
            res = run_child(
                "read",
                sample=True,
                timeout=240,
                reader=reader,
                root=root,
                workers=workers,
                batches=a.read_batches,
                warmup=a.warmup,
                min_seconds=a.min_seconds,
                options=options,
                code_root=b.before_root if name == BEFORE else None,
            )
        res["round"] = rnd
        runs[key].append(res)
        b.log(f"read {key} #{rnd}: {b.brief(res, 'tokens_per_s')}")
    return runs


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    runs = r.get("read")
    if not runs:
        return ["## Read", "", "Not run.", ""]
    base = runs.get(BASELINE)
    rows = []
    for workers in WORKERS:
        for name, (reader, _, _, label) in READERS.items():
            x = runs.get(f"{name}/{workers}")
            if name == BEFORE and x is None:
                continue
            tps = value_spread(x, "tokens_per_s")
            mem = value_spread(x, "peak_mb")
            first = value_spread(x, "first_batch_s")
            kind = next((y["mem_kind"] for y in x or () if "mem_kind" in y), "PSS")
            how = next((y["transport"] for y in x or () if "transport" in y), None)
            rows.append(
                [
                    label,
                    workers,
                    how or readers.transport(reader, workers),
                    millions(tps.mid) if tps else None,
                    "baseline" if x is base else ratio_spread(x, base, "tokens_per_s"),
                    ms(first.mid) if first else None,
                    f"{mem.mid:.0f} ({kind})" if mem else None,
                    first_error(x) or "ok",
                ]
            )
    goals = [
        goal(
            f"tokens/s vs memmap, {w} workers",
            ratio_spread(runs.get(f"wdstream/{w}"), base, "tokens_per_s"),
            want,
        )
        for w, want in GOALS.items()
    ]
    _notes(runs, notes)
    a = r["args"]
    starts = []
    for w in WORKERS:
        wd, lit = runs.get(f"wdstream/{w}"), runs.get(f"litdata/{w}")
        starts.append(
            goal(
                f"first batch, time / LitData's, {w} workers",
                ratio_spread(wd, lit, "first_batch_s"),
                1.0,
                True,
            )
        )
    changes = []
    for w in WORKERS:
        wd, old = runs.get(f"wdstream/{w}"), runs.get(f"{BEFORE}/{w}")
        t_new, t_old = value_spread(wd, "first_batch_s"), value_spread(old, "first_batch_s")
        if t_new and t_old:
            changes.append(
                f"{w} workers: first batch {ms(t_old.mid):.1f} -> {ms(t_new.mid):.1f} ms "
                f"(after / before {_fmt(ratio_spread(wd, old, 'first_batch_s'))}), tokens/s "
                f"after / before {_fmt(ratio_spread(wd, old, 'tokens_per_s'))}"
            )
    tail = [
        "First batch, wdstream's time over LitData's in the same round (issue 26: no slower "
        "than LitData's): " + "; ".join(starts) + ".",
        "",
    ]
    if changes:
        tail += [
            f"Before ({r.get('before')}) and after, same rounds: " + "; ".join(changes) + ".",
            "",
        ]
    return [
        "## Read",
        "",
        f"Shuffled `[{BATCH}, {SEQ_LEN}]` int64 `input_ids` + `labels`; tokens/s over at least "
        f"{a['read_batches']} batches and at least {a['min_seconds']} s, after {a['warmup']} "
        "warm-up batches (enough to drain every prefetch buffer, so the rate is the steady one; "
        "epochs follow one another as in training). First batch: from constructing the loader "
        "to its first batch (imports excluded). Peak memory: PSS of the reader's whole process "
        "tree (main + workers), sampled every 0.1 s; about 500 MB of it is the torch import. "
        'Warm page cache. "Batches cross processes": how a batch reaches the training loop. '
        f"Every row's ratio is to the **0-worker** `np.memmap` run of the same round "
        f"(nanoGPT's `get_batch` in the training process): median (min–max) over "
        f"{a['repeats']} interleaved round(s). Raw rates and memory: medians.",
        "",
        table(
            [
                "reader",
                "workers",
                "batches cross processes",
                "M tokens/s",
                "vs memmap, 0 workers",
                "first batch ms",
                "peak MB",
                "status",
            ],
            rows,
        ),
        "",
        "Goals (wdstream, checks on, vs the 0-worker memmap run): " + "; ".join(goals) + ".",
        "",
        *tail,
    ]


def _fmt(x: Spread | None) -> str:
    return x.fmt() if x else "–"


def _notes(runs: dict[str, Any], notes: list[str]) -> None:
    for workers in WORKERS:
        wd = runs.get(f"wdstream/{workers}")
        others = [f"{p}/{workers}" for p in PEERS] + ([BASELINE] if workers else [])
        for key in others:
            x = ratio_spread(runs.get(key), wd, "tokens_per_s")
            if x and x.mid > 1:
                peer, w = key.split("/")
                why = (
                    " — memmap samples random windows of one flat file, with no shards, no "
                    "epoch, no cursor, no documents and no checksums"
                    if peer == "memmap"
                    else ""
                )
                notes.append(
                    f"read, {workers} workers: {peer} at {w} workers reaches {x.fmt()} "
                    f"wdstream's tokens/s{why}."
                )
        w = value_spread(wd, "peak_mb")
        for peer in PEERS:
            p = value_spread(runs.get(f"{peer}/{workers}"), "peak_mb")
            if w and p and p.mid < w.mid * 0.95:
                notes.append(
                    f"read memory, {workers} workers: {peer} peaks at {p.mid:.0f} MB, "
                    f"wdstream at {w.mid:.0f} MB."
                )
