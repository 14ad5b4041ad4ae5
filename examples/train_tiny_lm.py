"""Train a tiny language model from a packed dataset, checkpointing data position with the model.

Reads top to bottom like nanoGPT's train.py, reduced to what matters for the data side:

    wdstream pack corpus.jsonl --output data/ --seq-len 256
    python examples/train_tiny_lm.py data/ --steps 200 --ckpt ckpt.pt      # run, save at the end
    python examples/train_tiny_lm.py data/ --steps 400 --ckpt ckpt.pt      # resumes at step 200

The loader's ``state_dict()`` is saved next to the model's. On restart the loader continues
with exactly the batch the uninterrupted run would have seen next; restoring costs one
seek, not a replay of the epoch. ``--record steps.json`` writes the sha256 of every step's
batch and its loss, so two runs can be compared step by step: ``tests/test_examples.py``
checks that a run stopped and resumed from its checkpoint sees the same batches, losses and
final weights as an uninterrupted one.

Cost. The output layer dominates: with cl100k's 100k-token vocabulary one [8 x 256] batch
makes 200M logits; on a shared 2-core CPU that was ~9 s per step (200 steps: ~30 min; ~18
min on a quieter machine). So on CPU the model works by default on a hashed vocabulary
(``--vocab-buckets 4096``: token id t is bucket ``t % 4096``, for inputs and targets alike)
and one intra-op thread (``--threads 1``: ops this small gain little from threads, and on a
shared machine the threads' spin-waiting doubled the time). It still trains on the real
packed tokens; its loss, over 4096 classes, starts at ln 4096 = 8.3 and falls.
Measured with the defaults on a shared 2-core CPU (load average 3-5 from other jobs), a
dataset packed from 120 stdlib sources with ``--seq-len 256``: 200 steps in 60-76 s wall
over two runs (about 6 s of it start-up, 40-44 s CPU), loss 8.3 -> 5.7-5.9;
``--vocab-buckets 2048``: 36 s. On CUDA the full vocabulary (``--vocab-buckets 0``) and all
threads are the defaults. With one thread the CPU run is deterministic: a resumed run
reproduces the uninterrupted run's losses and weights bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from typing import Any

import torch
from torch import nn

import wdstream
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store


class TinyLM(nn.Module):
    """An embedding, one GRU layer and a projection: enough to see the loss fall."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.mix(self.embed(input_ids))
        return self.head(hidden)


def batch_sha256(batch: dict[str, torch.Tensor]) -> str:
    """A fingerprint of the batch's tokens (ids as stored, before any hashing)."""
    digest = hashlib.sha256()
    for key in ("input_ids", "labels"):
        digest.update(batch[key].to(torch.int64).numpy().astype("<i8").tobytes())
    return digest.hexdigest()


def parse_args() -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="packed dataset: folder, s3:// or http(s):// URL")
    parser.add_argument("--steps", type=int, default=200, help="train until this global step")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--ckpt", default="ckpt.pt")
    parser.add_argument("--seed", type=int, default=0, help="model init and data order")
    parser.add_argument(
        "--vocab-buckets",
        type=int,
        default=0 if cuda else 4096,
        help="hash token ids into this many buckets (0: the full vocabulary; "
        "default 4096 on CPU, 0 on CUDA)",
    )
    parser.add_argument("--width", type=int, default=256 if cuda else 64)
    parser.add_argument(
        "--threads", type=int, default=0 if cuda else 1, help="torch CPU threads (0: torch's)"
    )
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--record", help="write each step's batch sha256 and loss to this JSON")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    loader = wdstream.Loader(
        args.data,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        num_workers=args.workers,
    )
    n_vocab = int(read_index(open_store(args.data)).tokenizer["n_vocab"])
    vocab = args.vocab_buckets or n_vocab
    model = TinyLM(vocab, args.width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    if os.path.exists(args.ckpt):
        ckpt = torch.load(args.ckpt, weights_only=False)
        if ckpt["vocab"] != vocab:
            raise SystemExit(f"{args.ckpt} was trained with vocab {ckpt['vocab']}, not {vocab}")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["data"])
        step = ckpt["step"]
        print(f"resumed at step {step}")

    record: list[dict[str, Any]] = []
    batches = iter(loader)
    while step < args.steps:
        # Draw only the batches that are trained on: the loader's state is then exactly the
        # position after the last trained batch (a `for ... break` would draw one too many).
        batch = next(batches)
        input_ids = batch["input_ids"].to(device) % vocab
        labels = batch["labels"].to(device) % vocab
        logits = model(input_ids)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        record.append({"step": step, "batch_sha256": batch_sha256(batch), "loss": loss.item()})
        if step % args.log_every == 0 or step == 1:
            print(f"step {step:5d}  loss {loss.item():.3f}", flush=True)

    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data": loader.state_dict(),
        "step": step,
        "vocab": vocab,
    }
    torch.save(state, args.ckpt + ".tmp")
    os.replace(args.ckpt + ".tmp", args.ckpt)  # a crash while saving keeps the old checkpoint
    print(f"saved {args.ckpt} at step {step}")
    if args.record:
        with open(args.record, "w") as f:
            json.dump(record, f, indent=0)


if __name__ == "__main__":
    main()
