"""Opening a dataset of many shards: a fresh ``Loader``'s first batch at 10, 3,731 and
100,000 shards (issue 26: ≤ 10 µs a shard, 3,731 shards within 3x of 10, 100,000 ≤ 1.5 s).

The datasets hold shards of 8 samples of 65 tokens (``seq_len`` 64). Packing 100,000 shards
would take many minutes (each is written and fsynced on its own), so a few dozen distinct
shards are packed once (``wdstream.pack``, with provenance tables as every pack has) and the
datasets list them over and over, each name a hard link to one of them (a copy where links
fail), in an ``index.json`` made by :class:`wdstream.format.index.DatasetIndex` with each
entry's own names. What is timed (the
index parsed and checked, the order planned, the first batch's samples read and verified) is
the same as for distinct shards; no reader checks that two shards differ.

Each measurement is one fresh process (``--child open_shards``): ``import torch`` and
``wdstream`` are not timed; from constructing a ``Loader`` (0 workers) to its first batch is.
Two kinds, interleaved with the sizes round by round:

- **raw**: right after the imports, as a training script would. ``import torch`` leaves a
  full collection owed (~170,000 objects, 70-130 ms on the shared host), and it fires in
  whatever first makes a few thousand objects, so it may land inside the timing;
- **gc paid**: ``gc.collect()`` after the imports, before the timing: the open alone.

The child also counts the full collections that ran inside the timing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchlib.rounds import first_error, interleave, ratio_spread, spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

SIZES = (10, 3_731, 100_000)
QUICK_SIZES = (10, 3_731)
KINDS = ("raw", "gc")
SAMPLE_TOKENS, SHARD_SAMPLES, BATCH = 65, 8, 8
RATIO_GOAL = 3.0  # 3,731 shards / 10 shards, at most
PER_SHARD_GOAL_US = 10.0
LARGEST_GOAL_S = 1.5


def build(root: Path, sizes: tuple[int, ...]) -> dict[int, str]:
    """One dataset per size under ``root``, sharing the shard files of a base dataset
    packed by ``wdstream.pack`` (pretokenized documents: its index, sidecars and provenance
    tables are a real pack's)."""
    import dataclasses

    import wdstream
    from wdstream.format.index import INDEX_NAME, DatasetIndex
    from wdstream.storage.local import LocalStore
    from wdstream.write.commit import write_index

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    docs = root / "docs.jsonl"
    with docs.open("w") as f:
        for d in range(240):
            ids = [(d * 7 + i) % 50_000 for i in range(1 + (d * 37) % 300)]
            f.write(json.dumps({"input_ids": ids}) + "\n")
    base_dir = root / "base"
    wdstream.pack([str(docs)], str(base_dir), seq_len=SAMPLE_TOKENS - 1, pretokenized=True,
                  shard_samples=SHARD_SAMPLES, progress=False)  # fmt: skip
    base = DatasetIndex.from_json((base_dir / INDEX_NAME).read_bytes())
    full = [s for s in base.shards if s.samples == SHARD_SAMPLES]  # not a short last one
    out = {}
    for n in sizes:
        d = root / f"shards-{n}"
        d.mkdir()
        entries = []
        for i in range(n):
            src = full[i % len(full)]
            files = {"name": ".tar", "sidecar": ".idx", "provenance": ".prov"}
            names = {key: f"data-{i:06d}{suffix}" for key, suffix in files.items()}
            for key, name in names.items():
                try:
                    os.link(base_dir / getattr(src, key), d / name)
                except OSError:
                    shutil.copyfile(base_dir / getattr(src, key), d / name)
            entries.append(dataclasses.replace(src, **names))
        stats = {**base.stats, "documents": sum(e.documents for e in entries)}
        index = dataclasses.replace(base, shards=tuple(entries), stats=stats)
        write_index(LocalStore(d), index)  # index.json and its shard table, as a pack
        out[n] = str(d)
    return out


def child_open_shards(root: str, gc_first: bool) -> dict[str, Any]:
    """Seconds from constructing a 0-worker ``Loader`` to its first batch, imports excluded;
    with ``gc_first`` the collection owed after the imports is paid before the timing."""
    import gc

    import torch  # noqa: F401  (imports are not part of the open)

    from wdstream import Loader  # the package imports its reader lazily

    if gc_first:
        gc.collect()
    full: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(count)
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    loader = Loader(root, seq_len=SAMPLE_TOKENS - 1, batch_size=BATCH, seed=0, num_workers=0)
    batches = iter(loader)  # kept: dropping it would wait for the read-ahead it started
    batch = next(batches)
    seconds, cpu, main = (
        time.perf_counter() - t0,
        time.process_time() - c0,
        time.thread_time() - m0,
    )
    gc.callbacks.remove(count)
    if tuple(batch["input_ids"].shape) != (BATCH, SAMPLE_TOKENS - 1):
        return {"error": f"first batch of shape {tuple(batch['input_ids'].shape)}"}
    return {
        "first_batch_s": seconds,
        "cpu_s": cpu,
        "main_cpu_s": main,
        "full_collections": len(full),
    }


def measure(b: Bench) -> dict[str, Any]:
    """Every size and kind once per round, the order rotating; at least 5 rounds."""
    sizes = QUICK_SIZES if b.args.quick else SIZES
    t0 = time.perf_counter()
    roots = build(b.work / "open_shards", sizes)
    b.log(f"open_shards: datasets of {', '.join(map(str, sizes))} shards built in "
          f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {}
    contenders = [(n, kind) for n in sizes for kind in KINDS]
    for rnd, (n, kind) in interleave(contenders, max(5, b.args.repeats)):
        res = run_child("open_shards", timeout=300, root=roots[n], gc_first=kind == "gc")
        runs.setdefault(f"{n}/{kind}", []).append({**res, "round": rnd})
    shutil.rmtree(b.work / "open_shards", ignore_errors=True)
    res = {"sizes": list(sizes), "runs": runs}
    key = f"{sizes[1]}/gc"
    v = value_spread(runs.get(key), "first_batch_s")
    b.log(f"open_shards: {key} first batch {_ms(v) if v else first_error(runs.get(key))}")
    return res


def per_shard_us(runs: dict[str, Any], n: int, kind: str) -> Any:
    """Per round: (first batch at n shards - at 10 shards) / (n - 10), in µs."""
    a = {x["round"]: x for x in runs.get(f"{n}/{kind}", []) if "error" not in x}
    b = {x["round"]: x for x in runs.get(f"10/{kind}", []) if "error" not in x}
    return spread(
        [
            (a[r]["first_batch_s"] - b[r]["first_batch_s"]) / (n - 10) * 1e6
            for r in a.keys() & b.keys()
        ]
    )


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    x = r.get("open_shards")
    head = ["## Opening a dataset of many shards", ""]
    if not x:
        return head + ["Not run.", ""]
    if "error" in x:
        return head + [f"Not measured: {x['error']}", ""]
    sizes, runs = x["sizes"], x["runs"]
    rows = []
    for n in sizes:
        for kind in KINDS:
            got = [y for y in runs.get(f"{n}/{kind}", []) if "error" not in y]
            v = value_spread(got, "first_batch_s")
            full = f"{sum(y['full_collections'] > 0 for y in got)} of {len(got)}"
            ratio = ratio_spread(got, runs.get(f"10/{kind}"), "first_batch_s")
            per = per_shard_us(runs, n, kind) if n != 10 else None
            rows.append([
                f"{n:,}", "raw" if kind == "raw" else "gc paid first", _ms(v) if v else None,
                full, ratio if n != 10 else None, per.fmt(" µs", 1) if per else None,
            ])  # fmt: skip
    mid, big = sizes[1], sizes[-1]
    header = ["shards", "kind", "first batch", "runs with a full collection inside",
              "vs 10 shards", "µs a shard"]  # fmt: skip
    lines = head + [
        f"A fresh `Loader` (0 workers, batch {BATCH} x {SAMPLE_TOKENS - 1}) to its first batch "
        f"over datasets of shards of {SHARD_SAMPLES} samples of {SAMPLE_TOKENS} tokens, one "
        "fresh process per measurement, `import torch` and `wdstream` not timed; sizes and "
        "kinds interleaved, median (min–max) over the rounds. *raw*: timed right after the "
        "imports (the full collection `import torch` leaves owed may fire inside); *gc paid "
        "first*: `gc.collect()` before the timing. µs a shard: (time at n - time at 10) / "
        "(n - 10), same round.",
        "",
        table(header, rows),
        "",
    ]
    for kind in KINDS:
        ratio = ratio_spread(runs.get(f"{mid}/{kind}"), runs.get(f"10/{kind}"), "first_batch_s")
        lines.append("- " + goal(f"{mid:,} / 10 shards, {kind}", ratio, RATIO_GOAL, at_most=True))
        if ratio is not None and ratio.mid > RATIO_GOAL:
            notes.append(f"Opening {mid:,} shards ({kind}): {ratio.fmt()} the time of 10 shards "
                         f"(goal ≤ {RATIO_GOAL}x).")  # fmt: skip
    per = per_shard_us(runs, big, "gc")
    if per is not None:
        lines.append("- " + goal(f"{big:,} shards, gc paid first, a shard", per,
                                 PER_SHARD_GOAL_US, True, " µs", 1))  # fmt: skip
    v = value_spread(runs.get(f"{big}/raw"), "first_batch_s")
    if big >= 100_000 and v is not None:
        lines.append("- " + goal(f"{big:,} shards, raw, first batch", v, LARGEST_GOAL_S, True,
                                 " s"))  # fmt: skip
    errs = [first_error(v) for v in runs.values()]
    return lines + [""] + [e for e in errs if e] + [""]


def _ms(v: Any) -> str:
    return (
        f"{v.mid * 1e3:.1f} ms ({v.lo * 1e3:.1f}–{v.hi * 1e3:.1f})"
        if v.n > 1
        else f"{v.mid * 1e3:.1f} ms"
    )
