"""Pack at scale: input MB/s on a corpus of at least 100 MB, wdstream against the ceiling.

The pack part's 28 MB corpus packs in ~2-3 s, where wdstream's fixed start-up (the tokenizer's
check against tiktoken, the process pool's start) weighs; the issue's second goal is the
speed once that is amortised: >= 2x raw tiktoken on >= 100 MB. Same ceiling and the same
child measurement as the pack part (``benchlib.pack.child_pack``), on a corpus of real text
(the standard library's sources, then site-packages') built for this part.

It also measures the CPU of the packing process itself (``getrusage(RUSAGE_SELF)``: every
thread of the process that calls ``pack``, none of its tokenizer workers), the serial part
that caps a pack on many cores: per 100 MB of text, as the large pack's CPU less a
one-document pack's (the fixed start-up: tokenizer load, pool start), median (min-max) over
the rounds. In these packs the packing process does not tokenise while its workers start
(``TokenPool.inline_while_starting`` off), a start-up cost that is not per byte.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import TYPE_CHECKING, Any

from benchlib.common import ROOT, SEQ_LEN, SHARD_BYTES
from benchlib.corpus import build_corpus
from benchlib.rounds import first_error, interleave, ratio_spread, spread, value_spread
from benchlib.runner import RESULT_TAG, run_child, run_command
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
CPU_BACKEND = "bpe-openai"  # the fastest tokenizer: where the packing process matters most
CPU_GOAL = 0.4  # s of packing-process CPU per 100 MB of text (issue 26)
# The CPU children run pack() from ``-c`` (no script for the pool's workers to re-import).
_CPU_CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from benchlib.pack_large import child_parent_cpu; child_parent_cpu(sys.argv[2])"
)


_built: dict[str, dict[str, Any]] = {}  # the large corpus, built once per bench run


def large_corpus(b: Bench) -> dict[str, Any]:
    """The >= 100 MB corpus (``build_corpus``'s result), built on first use in this run."""
    where = str(b.work / "corpus-large")
    if where not in _built:
        _built[where] = build_corpus(where, MIN_BYTES)
    return _built[where]


def child_parent_cpu(spec: str) -> None:
    """In a child: pack ``files`` (JSON ``spec``: files, out, workers) and print the packing
    process's CPU seconds (all its threads), wall seconds and tokens as a result line."""
    from wdstream.write.pack import pack
    from wdstream.write.tokenpool import TokenPool

    kw = json.loads(spec)
    TokenPool.inline_while_starting = False  # start-up tokenising is not per byte
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    res = pack(kw["files"], kw["out"], backend=CPU_BACKEND, seq_len=SEQ_LEN,
               workers=kw["workers"], shard_size=SHARD_BYTES, progress=False, overwrite=True)  # fmt: skip
    seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    out = {"cpu_s": cpu, "seconds": seconds, "tokens": res.index.total_tokens}
    print(RESULT_TAG + json.dumps(out), flush=True)


def _parent_cpu(files: list[str], out: str, workers: int) -> dict[str, Any]:
    spec = json.dumps({"files": files, "out": out, "workers": workers})
    return run_command([sys.executable, "-c", _CPU_CHILD, str(ROOT / "tools"), spec], 600)


def _one_document(b: Bench) -> list[str]:
    """A one-document corpus: a pack of it costs the packing process its fixed start-up."""
    path = b.work / "corpus-one" / "one.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"text": "def f():\n    return 1\n"}) + "\n")
    return [str(path)]


def measure(b: Bench) -> dict[str, Any]:
    """Build the large corpus, then every tool once per round, interleaved; then, per
    round, the packing process's CPU on the large corpus and on one document."""
    info = large_corpus(b)
    b.log(f"pack_large corpus: {info['docs']} docs, {info['text_bytes'] / 1e6:.1f} MB")
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in TOOLS}
    for rnd, tool in interleave(list(TOOLS), b.args.repeats):
        out = b.path(tool, "-large")
        res = run_child("pack", tool=tool, files=info["files"], out=out, threads=b.cores)
        res["round"] = rnd
        runs[tool].append(res)
        b.log(f"pack_large {tool} #{rnd}: {b.brief(res, 'seconds')}")
    one, cpu = _one_document(b), []
    for rnd in range(max(b.args.repeats, 3)):
        large = _parent_cpu(info["files"], b.path("cpu", "-large"), b.cores)
        fixed = _parent_cpu(one, b.path("cpu", "-one"), b.cores)
        cpu.append({"round": rnd, "large": large, "fixed": fixed})
        b.log(f"pack_large packing-process CPU #{rnd}: {large.get('cpu_s')} s, "
              f"fixed {fixed.get('cpu_s')} s")  # fmt: skip
    return {"corpus": {k: v for k, v in info.items() if k != "files"}, "runs": runs, "cpu": cpu}


def _cpu_lines(part: dict[str, Any], cores: int) -> list[str]:
    """The packing process's CPU per 100 MB, and the goal."""
    mb = part["corpus"]["text_bytes"] / 1e6
    rounds = [r for r in part.get("cpu", []) if "cpu_s" in r["large"] and "cpu_s" in r["fixed"]]
    if not rounds:
        errors = [r["large"].get("error") or r["fixed"].get("error") for r in part.get("cpu", [])]
        return [f"Packing-process CPU: not measured ({errors[0] if errors else 'not run'}).", ""]
    per = spread([(r["large"]["cpu_s"] - r["fixed"]["cpu_s"]) * 100 / mb for r in rounds])
    whole = spread([r["large"]["cpu_s"] * 100 / mb for r in rounds])
    fixed = spread([r["fixed"]["cpu_s"] for r in rounds])
    assert per is not None and whole is not None and fixed is not None
    judged = goal("packing-process CPU per 100 MB", per, CPU_GOAL, True, " s")
    return [
        f"Packing-process CPU (`getrusage` of the process calling `pack`, all its threads, "
        f"not its workers; backend {CPU_BACKEND}, {cores} workers, {len(rounds)} rounds): "
        f"**{per.fmt(' s')} per 100 MB** of text (the large pack's less a one-document "
        f"pack's {fixed.fmt(' s')} of fixed start-up); {whole.fmt(' s')} per 100 MB with it. "
        f"Goal: {judged}.",
        "",
    ]


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
        *_cpu_lines(part, r["machine"]["cores"]),
    ]
