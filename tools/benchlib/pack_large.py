"""Pack at scale: input MB/s on a corpus of at least 100 MB, wdstream against the ceiling.

The pack part's 28 MB corpus packs in ~2-3 s, where wdstream's fixed start-up (the tokenizer's
check against tiktoken, the process pool's start) weighs; the issue's second goal is the
speed once that is amortised: >= 2x raw tiktoken on >= 100 MB. Same ceiling and the same
child measurement as the pack part (``benchlib.pack.child_pack``), on a corpus of real text
(the standard library's sources, then site-packages') built for this part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from benchlib.corpus import build_corpus
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

MIN_BYTES = 100_000_000
TOOLS = {
    "ceiling": "raw tiktoken `encode_ordinary_batch` (ceiling)",
    "wdstream:tiktoken": "wdstream pack, backend tiktoken",
    "wdstream:bpe-openai": "wdstream pack, backend bpe-openai",
}
GOALS = {"wdstream:bpe-openai": 2.0}  # vs the ceiling, on >= 100 MB


_built: dict[str, dict[str, Any]] = {}  # the large corpus, built once per bench run


def large_corpus(b: Bench) -> dict[str, Any]:
    """The >= 100 MB corpus (``build_corpus``'s result), built on first use in this run."""
    where = str(b.work / "corpus-large")
    if where not in _built:
        _built[where] = build_corpus(where, MIN_BYTES)
    return _built[where]


def measure(b: Bench) -> dict[str, Any]:
    """Build the large corpus, then every tool once per round, interleaved."""
    info = large_corpus(b)
    b.log(f"pack_large corpus: {info['docs']} docs, {info['text_bytes'] / 1e6:.1f} MB")
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in TOOLS}
    for rnd, tool in interleave(list(TOOLS), b.args.repeats):
        out = b.path(tool, "-large")
        res = run_child("pack", tool=tool, files=info["files"], out=out, threads=b.cores)
        res["round"] = rnd
        runs[tool].append(res)
        b.log(f"pack_large {tool} #{rnd}: {b.brief(res, 'seconds')}")
    return {"corpus": {k: v for k, v in info.items() if k != "files"}, "runs": runs}


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    head = ["## Pack at scale (>= 100 MB)", ""]
    part = r.get("pack_large")
    if not part:
        return head + ["Not run (full runs only).", ""]
    runs, mb = part["runs"], part["corpus"]["text_bytes"] / 1e6
    base = runs.get("ceiling")
    rows = []
    for tool, label in TOOLS.items():
        s = value_spread(runs.get(tool), "seconds")
        ratio = (
            "baseline"
            if tool == "ceiling"
            else ratio_spread(runs.get(tool), base, "seconds", inverse=True)
        )
        rows.append([label, mb / s.mid if s else None, ratio, first_error(runs.get(tool)) or "ok"])
    goals = [
        goal(t.split(":")[1], ratio_spread(runs.get(t), base, "seconds", inverse=True), want)
        for t, want in GOALS.items()
    ]
    for t, want in GOALS.items():
        x = ratio_spread(runs.get(t), base, "seconds", inverse=True)
        if x and x.mid < want:
            notes.append(f"pack at scale: {t.split(':')[1]} {x.fmt()} of the ceiling.")
    return head + [
        f"Input MB/s of text on a {mb:.1f} MB corpus ({part['corpus']['docs']:,} documents of "
        f"Python sources), {r['machine']['cores']} workers/threads, measured as in the pack "
        "part (timed from after the imports; the ceiling on texts already in memory with the "
        "encoder loaded). Ratios: speed over the ceiling's in the same round, median (min–max) "
        f"over {r['args']['repeats']} interleaved round(s); MB/s: median.",
        "",
        table(["tool", "MB/s", "vs ceiling", "status"], rows),
        "",
        "Goals: " + "; ".join(goals) + ".",
        "",
    ]
