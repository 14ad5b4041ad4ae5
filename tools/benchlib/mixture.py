"""Mixtures: read speed of a 3-source mixture against one dataset of the same bytes, and
the proportion error of the exact interleave against random weighted draws.

Read: the corpus's documents are dealt round-robin into three JSONL files, packed as three
datasets (``web``, ``code``, ``books``: names only) and, together, as one dataset: the same
documents and bytes. ``Loader(spec.json)`` with weights proportional to the three datasets'
rows is timed against ``Loader(one)`` (batch 8 x 2048, shuffle on) with the read part's child
(``benchlib.read.child_read``), 0 and 2 workers, the four contenders interleaved per round;
the ratio is mixture / one dataset within each round.

Proportions: after n = 10^3, 10^4, 10^5 rows of weights 0.5 / 0.3 / 0.2, the largest
``|count_i - w_i n|`` over the sources, at n and over every prefix up to n; ours (the
interleave the Loader uses) against torchdata's ``MultiNodeWeightedSampler`` (seed 0) where
it imports, else a seeded numpy ``choice``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchlib.common import BATCH, SEQ_LEN, WORKERS
from benchlib.corpus import read_texts
from benchlib.rounds import Spread, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, millions, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

NAMES = ("web", "code", "books")
READ_GOAL = 0.95  # mixture tokens/s over one dataset's, at least (issue 26)
PROPORTIONS = {"web": 0.5, "code": 0.3, "books": 0.2}
ROWS = (1_000, 10_000, 100_000)


def _split_corpus(b: Bench, where: Path) -> list[str]:
    """The corpus's documents dealt round-robin into one JSONL file per source."""
    where.mkdir(parents=True, exist_ok=True)
    paths = [where / f"{n}.jsonl" for n in NAMES]
    outs = [p.open("w", encoding="utf-8") for p in paths]
    try:
        for i, text in enumerate(read_texts(b.r["corpus"]["files"])):
            outs[i % len(outs)].write(json.dumps({"text": text}) + "\n")
    finally:
        for f in outs:
            f.close()
    return [str(p) for p in paths]


def _pack_sources(b: Bench) -> dict[str, Any]:
    """Pack the three sources and the one dataset of all three; write the spec."""
    where = b.work / "mixture"
    files = _split_corpus(b, where / "text")
    roots = {n: str(where / n) for n in NAMES}
    for out, inputs in [*((roots[n], [f]) for n, f in zip(NAMES, files, strict=True)),
                        (str(where / "one"), files)]:  # fmt: skip
        res = run_child("pack", timeout=600, tool="wdstream:tiktoken", files=inputs, out=out,
                        threads=b.cores)  # fmt: skip
        if "error" in res:
            return {"error": f"pack {out}: {res['error']}"}
    rows = {n: _rows(roots[n]) for n in NAMES}
    total = sum(rows.values())
    weights = {n: round(r / total, 2) for n, r in rows.items()}
    spec = where / "mix.json"
    spec.write_text(json.dumps({"sources": roots, "weights": weights}))
    return {"spec": str(spec), "one": str(where / "one"), "weights": weights, "rows": rows}


def _rows(root: str) -> int:
    index = json.loads(Path(root, "index.json").read_text())
    return sum(s["tokens"] for s in index["shards"]) // (SEQ_LEN + 1)


def _errors(sources: np.ndarray, p: np.ndarray) -> dict[str, float]:
    """Largest |count_i - p_i n| at each n of ROWS and over all prefixes up to it."""
    onehot = np.zeros((len(sources), len(p)), dtype=np.int64)
    onehot[np.arange(len(sources)), sources] = 1
    counts = np.cumsum(onehot, axis=0)
    n = np.arange(1, len(sources) + 1)[:, None]
    err = np.abs(counts - n * p[None, :]).max(axis=1)
    out = {}
    for m in ROWS:
        out[f"at_{m}"] = float(err[m - 1])
        out[f"max_{m}"] = float(err[:m].max())
    return out


def _random_draws(p: np.ndarray, n: int) -> tuple[str, np.ndarray]:
    """torchdata's weighted sampler where it imports, else a seeded numpy draw."""
    try:
        from torchdata.nodes import IterableWrapper, Loader, MultiNodeWeightedSampler
    except ImportError:
        rng = np.random.default_rng(0)
        return "numpy `default_rng(0).choice`", rng.choice(len(p), size=n, p=p)
    nodes = {name: IterableWrapper(itertools.repeat(i)) for i, name in enumerate(PROPORTIONS)}
    sampler = MultiNodeWeightedSampler(nodes, dict(PROPORTIONS), seed=0)
    it = iter(Loader(sampler))
    return "torchdata `MultiNodeWeightedSampler` (seed 0)", np.fromiter(
        (next(it) for _ in range(n)), dtype=np.int64, count=n
    )


def _proportions() -> dict[str, Any]:
    from wdstream.read.mixture.interleave import Interleave, exact_weights

    p = np.array(list(PROPORTIONS.values()))
    inter = Interleave(exact_weights(list(PROPORTIONS.values()), list(PROPORTIONS)))
    ours, _ = inter.locate(np.arange(ROWS[-1], dtype=np.int64))
    label, drawn = _random_draws(p, ROWS[-1])
    return {"ours": _errors(ours, p), "random": _errors(drawn, p), "random_label": label}


def measure(b: Bench) -> dict[str, Any]:
    out: dict[str, Any] = {"proportions": _proportions()}
    b.log(f"mixture: proportion error at 1e5 rows: ours {out['proportions']['ours']['at_100000']}"
          f", random {out['proportions']['random']['at_100000']}")  # fmt: skip
    data = _pack_sources(b)
    out.update(data)
    if "error" in data:
        return out
    a = b.args
    kinds = ["one", "mixture"] + (["one@before", "mixture@before"] if b.before_root else [])
    contenders = [(kind, w) for w in WORKERS for kind in kinds]
    runs: dict[str, list[dict[str, Any]]] = {f"{k}/{w}": [] for k, w in contenders}
    for rnd, (kind, workers) in interleave(contenders, a.repeats):
        root = data["spec"] if kind.startswith("mixture") else data["one"]
        code = b.before_root if kind.endswith("@before") else None
        res = run_child("read", timeout=240, reader="wdstream", root=root, workers=workers,
                        batches=a.read_batches, warmup=a.warmup,
                        min_seconds=a.min_seconds, code_root=code)  # fmt: skip
        res["round"] = rnd
        runs[f"{kind}/{workers}"].append(res)
        b.log(f"mixture read {kind}/{workers} #{rnd}: {b.brief(res, 'tokens_per_s')}")
    out["runs"] = runs
    return out


def _met(ratio: Spread | None) -> str:
    if ratio is None:
        return "not measured"
    return "met" if ratio.mid >= READ_GOAL else "NOT met"


def _fmt(v: float) -> str:
    return f"{v:.2f}" if v < 10 else f"{v:,.0f}"


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    x = r.get("mixture")
    head = ["## Mixtures: read speed and exact proportions", ""]
    if not x:
        return head + ["Not run.", ""]
    lines = list(head)
    if "runs" in x:
        runs = x["runs"]
        rows = []
        for w in WORKERS:
            one, mix = runs.get(f"one/{w}"), runs.get(f"mixture/{w}")
            tps_one, tps_mix = value_spread(one, "tokens_per_s"), value_spread(mix, "tokens_per_s")
            ratio = ratio_spread(mix, one, "tokens_per_s")
            goal(f"mixture / one dataset, {w} workers", ratio, READ_GOAL)  # for the summary
            err = next((y["error"] for y in (mix or []) + (one or []) if "error" in y), "")
            rows.append([str(w), millions(tps_one.mid) if tps_one else None,
                         millions(tps_mix.mid) if tps_mix else None, ratio,
                         _met(ratio) + (f" {err}" if err else "")])  # fmt: skip
            old_one, old_mix = runs.get(f"one@before/{w}"), runs.get(f"mixture@before/{w}")
            if old_mix:
                old_ratio = ratio_spread(old_mix, old_one, "tokens_per_s")
                o1, om = (value_spread(x, "tokens_per_s") for x in (old_one, old_mix))
                rows.append([f"{w}, the code before ({r.get('before')})",
                             millions(o1.mid) if o1 else None, millions(om.mid) if om else None,
                             old_ratio, _met(old_ratio)])  # fmt: skip
        weights = ", ".join(f"{n} {w}" for n, w in x["weights"].items())
        lines += [
            f"The corpus dealt into three datasets ({weights} by rows) read as a mixture, "
            f"against the same documents packed as one dataset; batch {BATCH} x {SEQ_LEN}, "
            f"shuffle on, same run, contenders interleaved per round; ratio: mixture / one "
            f"dataset within each round, median (min–max) over {len(runs['one/0'])} rounds.",
            "",
            table(
                [
                    "workers",
                    "one dataset, M tokens/s",
                    "mixture, M tokens/s",
                    "mixture / one",
                    f"goal >= {READ_GOAL}x",
                ],
                rows,
            ),  # fmt: skip
            "",
        ]
    elif "error" in x:
        lines += [f"Read not measured: {x['error']}", ""]
    p = x["proportions"]
    rows = []
    for m in ROWS:
        rows.append([f"{m:,}", _fmt(p["ours"][f"at_{m}"]), _fmt(p["ours"][f"max_{m}"]),
                     _fmt(p["random"][f"at_{m}"]), _fmt(p["random"][f"max_{m}"])])  # fmt: skip
    lines += [
        "Proportion error of weights "
        + ", ".join(f"{n} {w}" for n, w in PROPORTIONS.items())
        + ": the largest |rows of a source - weight x n| over the sources, after n rows and "
        f"over every prefix up to n. Ours is the Loader's interleave; random is "
        f"{p['random_label']}.",
        "",
        table(
            ["rows n", "ours, at n", "ours, max up to n", "random, at n", "random, max up to n"],
            rows,
        ),  # fmt: skip
        "",
    ]
    return lines
