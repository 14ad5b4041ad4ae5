"""The loss-spike workflow, end to end, on the CPU in a few seconds (docs/OPERATIONS.md).

A run's loss jumps; the operator wants to know which data did it, and to go on without it
with every later batch exactly what it would have been:

    1. pack a corpus into which a burst of degenerate documents (random characters, one
       token repeated) was planted, at known lines of the input file
    2. train a tiny model (a hashed-vocabulary bigram LM, ~4k parameters), logging each
       step's loss and saving model + optimizer + loader state every CKPT_EVERY steps
    3. find the spike: steps whose loss exceeds a running median by SPIKE_RATIO
    4. explain the steps around it: `wdstream explain DATA --steps A:B --state ckpt.json
       --format jsonl`, one JSON record per row with every piece's input file:line and token
       span; join the records with the per-token losses of those batches (re-read exactly with
       `loader.batch_at(data_step)`, scored by the checkpoint before the spike): the planted
       documents' file:line come out on top
    5. roll back to the checkpoint before the spike, train up to it, `loader.skip_steps(n)`
       over every step that holds a culprit document, and continue: the continued run's
       training step t reads data step `loader.data_step(t)`, and each of its batches equals
       the uninterrupted run's batch at that data step; explain of the continued run's
       steps, with its state, maps training steps to data steps and finds no culprit left

    python examples/loss_spike.py [--workdir DIR]

Every number is seeded (corpus, model, data order) and the model runs on one CPU thread, so
the run is the same every time (the same workflow passed with seeds 0, 1, 2 and 5 too, the
spike landing at steps 85 to 240). Output:

    packed 3,173 samples; planted 6 documents at corpus.jsonl:1201-1206
    trained 400 steps: loss 5.01 -> 1.86
    step 232: loss 4.40, 2.4x the running median 1.86  <- spike at steps 232-237
    $ wdstream explain .../data --steps 216:254 --state .../ckpt/ckpt-200.json --format jsonl
    304 rows, 165 documents, median document loss 1.87; highest:
      11.02  corpus.jsonl:1204
      11.02  corpus.jsonl:1206
      11.02  corpus.jsonl:1202
       7.48  corpus.jsonl:1203
       7.43  corpus.jsonl:1201
       7.30  corpus.jsonl:1205
       2.26  corpus.jsonl:1253
       2.21  corpus.jsonl:1104
    6 culprits (loss > 2x the median): the planted documents, in steps 232-246
    rolled back to step 200, trained to 232, skipped 15 steps (data steps 232-246)
    continued to training step 384 = data step 399, every batch the uninterrupted run's at
    its data step; highest loss since the skip 1.94 (the spike's 4.40)
    OK

(The " banana" documents score 11: the bigram model had never seen " banana" follow itself.)
Measured on a shared 2-core CPU with a load average of 5-8 from other jobs: 12 s wall, 6 s
CPU; most of it is imports (torch, and the first optimizer step importing torch._dynamo:
2-4 s) and the explain subprocess (Python and torch started again: 2-5 s); the ~800 training
steps take about 1 s. Data steps 396-399 are in epoch 1: the continued run crosses the epoch
end after its skip.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

import wdstream
from wdstream.read.provenance import explain_steps, explanation_records

SEED = 3
SEQ_LEN, BATCH = 32, 8
SHUFFLE = dict(shuffle_window=64, shuffle_lanes=1)  # a burst stays a burst (see OPERATIONS.md)
STEPS = 400  # the uninterrupted run
CKPT_EVERY = 25
VOCAB, WIDTH = 128, 16  # token id t is bucket t % VOCAB: 2 x 128 x 16 + 128 = 4,224 parameters
LR = 0.03
SPIKE_RATIO, MEDIAN_OF = 1.5, 25  # a spike step: loss > 1.5 x the median of the last 25
MARGIN = 16  # steps explained on each side of the spike: two shuffle windows
NORMAL_DOCS, PLANT_AT, PLANTED = 1700, 1200, 6  # documents; the burst follows line PLANT_AT

NOUNS = "cat dog bird fish horse cow sheep goat fox bear wolf deer mouse owl frog duck".split()
VERBS = "sees likes finds chases follows hears meets feeds helps calls watches leaves".split()
ADJECTIVES = "big small red old young quick lazy happy brown green quiet loud".split()


def sentence(rng: random.Random) -> str:
    """One sentence of a tiny grammar: a bigram model can learn most of it."""
    noun, other = rng.choice(NOUNS), rng.choice(NOUNS)
    return f"The {rng.choice(ADJECTIVES)} {noun} {rng.choice(VERBS)} the {other}."


def degenerate(rng: random.Random, i: int) -> str:
    """A planted document of ~150 tokens: random characters (even i) or one token repeated
    (odd i: " banana" is one cl100k token)."""
    if i % 2 == 0:
        return "".join(chr(rng.randrange(0x21, 0x250)) for _ in range(100))
    return " banana" * 150


def write_corpus(path: Path) -> list[int]:
    """NORMAL_DOCS documents of the grammar with PLANTED degenerate ones after line
    PLANT_AT; returns the planted documents' (1-based) lines."""
    rng = random.Random(SEED)
    docs = [" ".join(sentence(rng) for _ in range(rng.randint(5, 12))) for _ in range(NORMAL_DOCS)]
    docs[PLANT_AT:PLANT_AT] = [degenerate(rng, i) for i in range(PLANTED)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return list(range(PLANT_AT + 1, PLANT_AT + PLANTED + 1))


class BigramLM(nn.Module):
    """An embedding and a linear layer: the next token's bucket from the current one."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids % VOCAB))


def token_losses(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token loss [B, seq_len]: position i predicts token i + 1 of the row."""
    logits = model(batch["input_ids"])
    labels = batch["labels"] % VOCAB
    return nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")


def batch_sha256(batch: dict[str, torch.Tensor]) -> str:
    """A fingerprint of the batch's tokens."""
    digest = hashlib.sha256()
    for key in ("input_ids", "labels"):
        digest.update(batch[key].to(torch.int64).numpy().tobytes())
    return digest.hexdigest()


def train(
    loader: wdstream.Loader, model: nn.Module, opt: torch.optim.Optimizer, first: int,
    last: int, ckpt: Path | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Train training steps ``[first, last)``; a log record per step (loss, the batch's data
    step and fingerprint); with ``ckpt``, save model, optimizer and loader state every
    CKPT_EVERY steps (the loader's to JSON too, for `wdstream explain --state`)."""
    log, batches = [], iter(loader)
    for step in range(first, last):
        if ckpt is not None and step % CKPT_EVERY == 0:
            state = loader.state_dict()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "data": state,
                        "step": step}, ckpt / f"ckpt-{step}.pt")  # fmt: skip
            (ckpt / f"ckpt-{step}.json").write_text(json.dumps(state))
        batch = next(batches)  # drawn only when trained on: the state stays exact
        loss = token_losses(model, batch).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log.append({"step": step, "data_step": loader.data_step(step), "loss": loss.item(),
                    "batch": batch_sha256(batch)})  # fmt: skip
    batches.close()  # leave the iterator: skip_steps refuses to run under a live one
    return log


def find_spike(losses: list[float]) -> tuple[int, int]:
    """The first and last step of the first run of steps whose loss exceeds SPIKE_RATIO x the
    median of the MEDIAN_OF steps before the run began."""
    for s in range(MEDIAN_OF, len(losses)):
        median = statistics.median(losses[s - MEDIAN_OF : s])
        if losses[s] > SPIKE_RATIO * median:
            e = s
            while e + 1 < len(losses) and losses[e + 1] > SPIKE_RATIO * median:
                e += 1
            print(f"step {s}: loss {losses[s]:.2f}, {losses[s] / median:.1f}x the running "
                  f"median {median:.2f}  <- spike at steps {s}-{e}")  # fmt: skip
            return s, e
    raise SystemExit("no loss spike found: the planted burst did not show")


def explain_jsonl(data: Path, first: int, end: int, state: Path) -> list[dict[str, Any]]:
    """`wdstream explain` of steps ``[first, end)`` as JSON Lines, run as an operator would."""
    cmd = [sys.executable, "-m", "wdstream.cli", "explain", str(data), "--steps",
           f"{first}:{end}", "--state", str(state), "--format", "jsonl"]  # fmt: skip
    print("$ wdstream " + " ".join(cmd[3:]))
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def rank_documents(
    records: list[dict[str, Any]], model: nn.Module, loader: wdstream.Loader
) -> list[tuple[float, str, int]]:
    """``(mean loss, file, line)`` of every document in ``records``, highest loss first: each
    piece's tokens scored by ``model`` on the batch re-read at the record's data step."""
    total: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0])
    losses: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for rec in records:
            d = rec["data_step"]
            if d not in losses:
                losses[d] = token_losses(model, loader.batch_at(d))
            row = losses[d][rec["rank_row"]]
            for p in rec["pieces"]:
                a, b = p["span"]  # row tokens [a, b): predicted at positions [a - 1, b - 1)
                scored = row[max(a, 1) - 1 : b - 1]
                acc = total[(p["file"], p["line"])]
                acc[0] += float(scored.sum())
                acc[1] += len(scored)
    ranked = [(s / n, f, line) for (f, line), (s, n) in total.items() if n]
    return sorted(ranked, reverse=True)


def find_culprits(
    ranked: list[tuple[float, str, int]], records: list[dict[str, Any]]
) -> tuple[set[tuple[str, int]], list[int]]:
    """The documents whose loss exceeds twice the median document's, and the steps that
    hold any of them (from the explained records)."""
    typical = statistics.median(loss for loss, _, _ in ranked)
    culprits = {(f, line) for loss, f, line in ranked if loss > 2 * typical}
    print(f"{len(records)} rows, {len(ranked)} documents, median document loss "
          f"{typical:.2f}; highest:")  # fmt: skip
    for loss, f, line in ranked[: len(culprits) + 2]:
        print(f"  {loss:5.2f}  {Path(f).name}:{line}")
    steps = sorted({r["step"] for r in records for p in r["pieces"]
                    if (p["file"], p["line"]) in culprits})  # fmt: skip
    return culprits, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="where corpus, dataset and checkpoints go (a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny ops: threads cost more than they gain, and one is exact
    work = Path(args.workdir or tempfile.mkdtemp(prefix="loss-spike-"))
    ckpt = work / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)

    # 1. The corpus with its planted burst, packed with provenance (input file and line).
    corpus, data = work / "corpus.jsonl", work / "data"
    planted = write_corpus(corpus)
    result = wdstream.pack([str(corpus)], str(data), seq_len=SEQ_LEN, shard_size="512KB",
                           workers=0, progress=False, overwrite=True)  # fmt: skip
    print(f"packed {sum(s.samples for s in result.index.shards):,} samples; planted "
          f"{PLANTED} documents at corpus.jsonl:{planted[0]}-{planted[-1]}")  # fmt: skip

    def fresh() -> tuple[wdstream.Loader, nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(SEED)
        loader = wdstream.Loader(str(data), seq_len=SEQ_LEN, batch_size=BATCH, seed=SEED,
                                 num_workers=0, **SHUFFLE)  # fmt: skip
        model = BigramLM()
        return loader, model, torch.optim.Adam(model.parameters(), lr=LR)

    # 2. The run that spikes (uninterrupted: its batches are the reference for step 5).
    loader, model, opt = fresh()
    full = train(loader, model, opt, 0, STEPS, ckpt)
    losses = [r["loss"] for r in full]
    print(f"trained {STEPS} steps: loss {losses[0]:.2f} -> {statistics.median(losses[-50:]):.2f}")

    # 3. Where it spiked. A shuffle window (64 samples: 8 steps) may have spread the burst
    # over two windows, so the steps explained reach MARGIN steps to each side of it.
    first, last = find_spike(losses)
    assert first >= 2 * MEDIAN_OF, f"the spike at step {first} came before the loss settled"
    lo, hi = first - MARGIN, last + MARGIN + 1
    back = lo // CKPT_EVERY * CKPT_EVERY  # the last checkpoint before them

    # 4. Which data: explain those steps, join the rows with their per-token losses under the
    # checkpoint's model (before the burst), rank the documents by loss.
    records = explain_jsonl(data, lo, hi, ckpt / f"ckpt-{back}.json")
    saved = torch.load(ckpt / f"ckpt-{back}.pt", weights_only=False)
    loader, model, opt = fresh()
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    loader.load_state_dict(saved["data"])
    ranked = rank_documents(records, model, loader)
    culprits, bad = find_culprits(ranked, records)
    assert culprits == {(str(corpus), line) for line in planted}, culprits  # all and only
    assert {line for _, _, line in ranked[:PLANTED]} == set(planted)  # they come out on top
    assert lo < bad[0] and bad[-1] < hi - 1, "the margin did not cover the burst"
    print(f"{len(culprits)} culprits (loss > 2x the median): the planted documents, in steps "
          f"{bad[0]}-{bad[-1]}")  # fmt: skip

    # 5. Roll back, train up to the culprits' first step, skip their steps, go on.
    skip_from, skip = bad[0], bad[-1] + 1 - bad[0]
    redo = train(loader, model, opt, back, skip_from)
    assert [r["loss"] for r in redo] == losses[back:skip_from]  # the same steps, bit for bit
    loader.skip_steps(skip)
    print(f"rolled back to step {back}, trained to {skip_from}, skipped {skip} steps "
          f"(data steps {skip_from}-{skip_from + skip - 1})")  # fmt: skip
    end = STEPS - skip  # training steps [skip_from, end) read data steps [bad[-1] + 1, STEPS)
    cont = train(loader, model, opt, skip_from, end)
    state = loader.state_dict()
    assert state["skips"] == [[skip_from, skip]], state["skips"]
    by_data_step = {r["step"]: r["batch"] for r in full}
    for r in redo + cont:
        assert r["data_step"] == (r["step"] + skip if r["step"] >= skip_from else r["step"])
        assert r["batch"] == by_data_step[r["data_step"]], r  # the uninterrupted run's batch
    after = max(r["loss"] for r in cont)
    print(f"continued to training step {end - 1} = data step {STEPS - 1}, every batch the "
          f"uninterrupted run's at its data step; highest loss since the skip {after:.2f} "
          f"(the spike's {max(losses[first : last + 1]):.2f})")  # fmt: skip
    assert after < SPIKE_RATIO * statistics.median(losses[back:first])

    # The continued run's state maps its training steps to data steps for explain too (here
    # through the Python API): none of its steps holds a culprit.
    steps = range(skip_from, end)
    rows = [r for e in explain_steps(str(data), steps, state=state)
            for r in explanation_records(e)]  # fmt: skip
    assert [r["data_step"] for r in rows[::BATCH]] == [loader.data_step(t) for t in steps]
    assert not any((p["file"], p["line"]) in culprits for r in rows for p in r["pieces"])
    print("OK")


if __name__ == "__main__":
    main()
