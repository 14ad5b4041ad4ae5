"""Train a tiny language model from a packed dataset, checkpointing data position with the model.

Reads top to bottom like nanoGPT's train.py, reduced to what matters for the data side:

    wdstream pack corpus.jsonl --output data/ --seq-len 256
    python examples/train_tiny_lm.py data/ --steps 200 --ckpt ckpt.pt      # run, save at the end
    python examples/train_tiny_lm.py data/ --steps 400 --ckpt ckpt.pt      # resumes at step 200

The loader's ``state_dict()`` is saved next to the model's. On restart the loader continues
with exactly the batch the uninterrupted run would have seen next; restoring costs one
seek, not a replay of the epoch.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

import wdstream
from wdstream.read.shards import read_index
from wdstream.storage import open_store


class TinyLM(nn.Module):
    """An embedding, one GRU layer and a projection: enough to see the loss fall."""

    def __init__(self, vocab: int, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.mix(self.embed(input_ids))
        return self.head(hidden)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--ckpt", default="ckpt.pt")
    args = parser.parse_args()

    loader = wdstream.Loader(
        args.data,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        shuffle=True,
        seed=0,
        num_workers=args.workers,
    )
    vocab = int(read_index(open_store(args.data)).tokenizer["n_vocab"])
    model = TinyLM(vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = 0
    if os.path.exists(args.ckpt):
        ckpt = torch.load(args.ckpt, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["data"])
        step = ckpt["step"]
        print(f"resumed at step {step}")

    for batch in loader:
        if step >= args.steps:
            break
        logits = model(batch["input_ids"])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), batch["labels"].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if step % 20 == 0:
            print(f"step {step:5d}  loss {loss.item():.3f}")

    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "data": loader.state_dict(),
            "step": step,
        },
        args.ckpt,
    )
    print(f"saved {args.ckpt} at step {step}")


if __name__ == "__main__":
    main()
