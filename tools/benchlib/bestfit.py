"""Best-fit rows and bucketed batches (issue 11): what each way of making rows does to the
documents, and what it costs.

Layouts, all from the documents' token lengths (EOS included), rows of ``S = seq_len + 1``:

- concat: the token stream cut every ``S`` tokens (wdstream ``--mode concat``); the
  reader drops the last, short row.
- BOS-aligned crop (nanochat-style): every row starts at a document start; from a buffer of
  documents the longest that still fits goes in; when none fits, the shortest is cropped to
  fill the row and its rest is dropped (a document longer than a row is cropped to it); the
  last, short row is dropped as concat's is.
- pad each document: every document starts a row; a long one takes several; rows padded.
- bestfit: :func:`wdstream.write.bestfit.bestfit_rows` over blocks of ``--bestfit-buffer``
  documents, exactly as ``pack --mode bestfit`` lays them out.

Corpora: the bench corpus (tokenised with cl100k) and a deterministic long-tailed one
(log-normal lengths, ``numpy`` seed 11). Bucketed batches: :func:`bucket_plan` against random
batches of the same documents cut by the same token budget, each padded to its longest.
Pack speed: ``wdstream.pack`` concat vs bestfit on the bench corpus, interleaved rounds.
"""

from __future__ import annotations

import bisect
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from benchlib.common import SHARD_BYTES
from benchlib.corpus import load_encoding, text_batches
from benchlib.rounds import interleave, ratio_spread, value_spread
from benchlib.tables import goal, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

SEQ_LENS = (2048, 8192)
BUFFER = 1024  # documents per best-fit block: pack's default, and the crop model's buffer
BUDGET = 16384  # bucketed batches: input tokens per batch, padding included
LAYOUTS = {
    "concat": "concat (today)",
    "crop": "nanochat-style BOS-aligned crop",
    "pad": "pad each document to seq_len",
    "bestfit": "**bestfit**",
}


def long_tailed(n: int = 20000, seed: int = 11) -> np.ndarray:
    """Document lengths with a long tail: log-normal, median ~600 tokens, up to 200k."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(600), 1.4, n), 2, 200_000).astype(np.int64)


def corpus_lengths(files: list[str], threads: int) -> np.ndarray:
    enc = load_encoding()
    out: list[int] = []
    for batch in text_batches(files):
        out += [len(ids) + 1 for ids in enc.encode_ordinary_batch(batch, num_threads=threads)]
    return np.asarray(out, dtype=np.int64)


def _summary(lens: np.ndarray, rows: int, S: int, cut: int, dropped: int) -> dict[str, Any]:
    total = int(lens.sum())
    kept = total - dropped
    return {
        "rows": rows,
        "truncated": cut,
        "truncated_pct": 100 * cut / len(lens),
        "padding_pct": 100 * (rows * S - kept) / (rows * S) if rows else 0.0,
        "dropped_pct": 100 * dropped / total,
    }


def layout_concat(lens: np.ndarray, S: int) -> dict[str, Any]:
    end = np.cumsum(lens)
    start = end - lens
    cut = int(np.sum(start // S != (end - 1) // S))
    total = int(end[-1])
    return _summary(lens, total // S, S, cut, total % S)


def layout_pad(lens: np.ndarray, S: int) -> dict[str, Any]:
    rows = int(np.sum(-(-lens // S)))
    return _summary(lens, rows, S, int(np.sum(lens > S)), 0)


def layout_crop(lens: np.ndarray, S: int, buffer: int = BUFFER) -> dict[str, Any]:
    keys: list[tuple[int, int]] = []  # (length, document) in the buffer, sorted
    nxt = rows = cut = dropped = 0
    while nxt < len(lens) or keys:
        while len(keys) < buffer and nxt < len(lens):
            bisect.insort(keys, (int(lens[nxt]), nxt))
            nxt += 1
        free = S
        rows += 1
        while free and keys:
            at = bisect.bisect_right(keys, (free, len(lens))) - 1
            if at >= 0:  # the longest that fits
                free -= keys.pop(at)[0]
                continue
            n, _ = keys.pop(0)  # none fits: crop the shortest to fill the row
            cut += 1
            dropped += n - free
            free = 0
        if free:  # the documents ran out: a last, short row is dropped (as concat's is)
            rows -= 1
            dropped += S - free
    return _summary(lens, rows, S, cut, dropped)


def layout_bestfit(lens: np.ndarray, S: int, buffer: int = BUFFER) -> dict[str, Any]:
    from wdstream.write.bestfit import bestfit_blocks, bestfit_rows

    ends = bestfit_blocks(lens, buffer, S)
    rows = sum(len(bestfit_rows(lens[a:b], S)) for a, b in zip([0, *ends], ends, strict=False))
    return _summary(lens, rows, S, int(np.sum(lens > S)), 0)


def layouts(lens: np.ndarray) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for seq in SEQ_LENS:
        S = seq + 1
        t0 = time.perf_counter()
        out[str(seq)] = {
            "concat": layout_concat(lens, S),
            "crop": layout_crop(lens, S),
            "pad": layout_pad(lens, S),
            "bestfit": layout_bestfit(lens, S),
        }
        out[str(seq)]["seconds"] = time.perf_counter() - t0
    return out


def random_batches(rows: np.ndarray, budget: int, seed: int = 0) -> list[np.ndarray]:
    """Documents in a random order, cut greedily by the same budget: a batch grows while
    ``(size + 1) x longest`` stays within it."""
    order = np.random.default_rng(seed).permutation(len(rows))
    batches, start, top = [], 0, 0
    for i, n in enumerate(rows[order].tolist()):
        if (i + 1 - start) * max(top, n) > budget:
            batches.append(order[start:i])
            start, top = i, 0
        top = max(top, n)
    return [*batches, order[start:]] if start < len(order) else batches


def bucket_padding(lens: np.ndarray, seq_len: int = 8192, budget: int = BUDGET) -> dict[str, Any]:
    """Padding of bucketed vs random batches of the same documents and budget."""
    from wdstream.read.batches.buckets import bucket_plan

    rows = np.minimum(lens - 1, seq_len)
    bucketed = bucket_plan(rows, budget, seed=0, epoch=0)
    random = random_batches(rows, budget)

    def pct(plan: list[np.ndarray]) -> float:
        padded = sum(len(b) * int(rows[b].max()) for b in plan)
        return 100 * (padded - int(rows.sum())) / padded

    return {"bucketed_pct": pct(bucketed), "random_pct": pct(random),
            "bucketed_batches": len(bucketed), "random_batches": len(random)}  # fmt: skip


def read_buckets(b: Bench, files: list[str]) -> dict[str, Any]:
    """Tokens/s of ``BucketedBatches`` over a docs-mode pack of the bench corpus."""
    import wdstream
    from wdstream.read.batches.buckets import BucketedBatches

    out = str(b.work / "out" / "bf-docs")
    wdstream.pack(files, out, mode="docs", workers=b.cores, shard_size=SHARD_BYTES,
                  overwrite=True, progress=False)  # fmt: skip
    it = BucketedBatches(out, seq_len=8192, max_tokens=BUDGET, epochs=1)
    real = padded = n = 0
    t0 = time.perf_counter()
    for batch in it:
        real += int(batch["attention_mask"].sum())
        padded += batch["input_ids"].numel()
        n += 1
        if time.perf_counter() - t0 > max(2.0, 4 * b.args.min_seconds):
            break
    seconds = time.perf_counter() - t0
    return {"batches": n, "tokens_per_s": real / seconds, "padding_pct": 100 * (1 - real / padded)}


def measure(b: Bench) -> dict[str, Any]:
    import wdstream

    files = b.r["corpus"]["files"]
    res: dict[str, Any] = {}
    b.log("bestfit: tokenising the corpus for document lengths")
    lens = {"bench": corpus_lengths(files, b.cores), "long-tailed": long_tailed()}
    for name, ls in lens.items():
        res[name] = {"documents": len(ls), "tokens": int(ls.sum()), "layouts": layouts(ls),
                     "buckets": bucket_padding(ls)}  # fmt: skip
        b.log(f"bestfit: {name}: {len(ls)} documents laid out")
    res["read_buckets"] = read_buckets(b, files)
    runs: dict[str, list[dict[str, Any]]] = {"concat": [], "bestfit": []}
    for rnd, mode in interleave(list(runs), b.args.repeats):
        out = str(b.work / "out" / f"bf-{mode}")
        r = wdstream.pack(files, out, mode=mode, seq_len=2048, workers=b.cores,
                          shard_size=SHARD_BYTES, overwrite=True, progress=False)  # fmt: skip
        runs[mode].append({"round": rnd, "seconds": r.seconds})
        b.log(f"bestfit: pack {mode} #{rnd}: {r.seconds:.2f}s")
    res["pack"] = runs
    return res


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    res = r.get("bestfit")
    if not res:
        return ["## Rows that keep documents whole (bestfit)", "", "Not run.", ""]
    out = [
        "## Rows that keep documents whole (bestfit)",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
    ]
    worst = 0.0
    for name in ("bench", "long-tailed"):
        c = res[name]
        for seq in SEQ_LENS:
            lay = c["layouts"][str(seq)]
            rows = [
                [label, f"{lay[k]['truncated']:,} ({lay[k]['truncated_pct']:.2f} %)",
                 f"{lay[k]['padding_pct']:.2f} %", f"{lay[k]['dropped_pct']:.2f} %",
                 f"{lay[k]['rows']:,}"]
                for k, label in LAYOUTS.items()
            ]  # fmt: skip
            worst = max(worst, lay["bestfit"]["padding_pct"])
            out += [
                f"{name} corpus ({c['documents']:,} documents, {c['tokens']:,} tokens), "
                f"seq_len {seq}:",
                "",
                table(["layout", "documents split", "padding", "tokens dropped", "rows"], rows),
                "",
            ]
    bk = [[name, f"{res[name]['buckets']['bucketed_pct']:.2f} %",
           f"{res[name]['buckets']['random_pct']:.2f} %"] for name in ("bench", "long-tailed")]  # fmt: skip
    bucketed = max(res[n]["buckets"]["bucketed_pct"] for n in ("bench", "long-tailed"))
    rb = res["read_buckets"]
    pack = res["pack"]
    speed = ratio_spread(pack["bestfit"], pack["concat"], "seconds", inverse=True)
    out += [
        f"Bucketed batches (`max_tokens={BUDGET}`, rows capped at 8192): padding of the "
        "batches vs random batches of the same documents cut by the same budget:",
        "",
        table(["corpus", "bucketed", "random"], bk),
        "",
        f"`BucketedBatches` over a docs-mode pack of the bench corpus: "
        f"{rb['tokens_per_s'] / 1e6:.2f} M real tokens/s, {rb['padding_pct']:.2f} % padding "
        f"({rb['batches']} batches).",
        "",
        f"Pack speed, bestfit vs concat (seq_len 2048, same corpus, {r['args']['repeats']} "
        f"interleaved round(s)): {speed.fmt() if speed else 'n/a'} "
        f"(concat {value_spread(pack['concat'], 'seconds').mid:.2f} s median).",  # type: ignore[union-attr]
        "",
        "Goals: "
        + "; ".join(
            [
                _pct_goal("bestfit padding, worst case", worst, 1.0, 3.0),
                _pct_goal("bucketed padding, worst corpus", bucketed, 3.0, None),
                goal("bestfit pack vs concat", speed, 0.9),
            ]
        )
        + ".",
        "",
    ]
    return out


def _pct_goal(name: str, value: float, want: float, floor: float | None) -> str:
    """``"name 1.06 % (goal ≤ 1 %: NOT met; floor ≤ 3 %: met)"``."""
    verdict = f"goal ≤ {want:g} %: {'met' if value <= want else 'NOT met'}"
    if floor is not None:
        verdict += f"; floor ≤ {floor:g} %: {'met' if value <= floor else 'NOT met'}"
    return f"{name} {value:.2f} % ({verdict})"
