"""A plain training loop checkpointed with ``torch.distributed.checkpoint`` (DCP), the way
torchtitan-style trainers save ``Stateful`` objects, with the loader among them.

    wdstream pack corpus.jsonl --output data/ --seq-len 64
    python examples/dcp_loop.py data/ --ckpt-dir ckpts/ --steps 40 --save-steps 20
    python examples/dcp_loop.py data/ --ckpt-dir ckpts/ --steps 80 --resume   # from step 40

Each checkpoint is a DCP folder ``CKPT_DIR/step-K`` holding the model and optimizer
(``AppState``) and the loader (``wdstream.integrations.dcp.LoaderState``: its JSON state as a
uint8 tensor, so nothing of it is pickled). ``--resume`` loads the latest one into freshly made
objects and goes on with the next batch, exactly; the loader seeks, it does not replay.
Run under ``torchrun`` the same code saves and loads from every rank (``dcp.save`` needs the
process group; on one process it runs without one).

``--record steps.json`` writes each step's batch fingerprint (sha256 of the targets) and loss:
``tests/test_integrations_dcp.py`` checks a stopped and resumed run against one never stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

import wdstream
from wdstream.integrations.dcp import LoaderState
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store


class TinyLM(nn.Module):
    """An embedding, one GRU layer and a projection: enough to see the loss fall."""

    def __init__(self, vocab: int, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.mix(self.embed(input_ids))
        return self.head(hidden)


class AppState(Stateful):
    """Model and optimizer as DCP's own tutorial wraps them (``get_state_dict`` handles FSDP too)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int = 0) -> None:
        self.model, self.optimizer, self.step = model, optimizer, step

    def state_dict(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim, "step": torch.tensor(self.step)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])  # fmt: skip
        self.step = int(state_dict["step"])


def latest_checkpoint(ckpt_dir: str) -> str | None:
    """``CKPT_DIR/step-K`` with the largest K that DCP finished writing (its ``.metadata``)."""
    done = []
    for name in os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []:
        match = re.fullmatch(r"step-(\d+)", name)
        if match and os.path.exists(os.path.join(ckpt_dir, name, ".metadata")):
            done.append(int(match.group(1)))
    return os.path.join(ckpt_dir, f"step-{max(done)}") if done else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="packed dataset: folder, s3:// or http(s):// URL")
    parser.add_argument("--ckpt-dir", default="ckpts", help="DCP checkpoints go to CKPT_DIR/step-K")
    parser.add_argument("--steps", type=int, default=40, help="train until this step")
    parser.add_argument("--save-steps", type=int, default=20, help="checkpoint every N steps")
    parser.add_argument("--resume", action="store_true", help="resume from the latest checkpoint")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4, help="loader batch (per rank)")
    parser.add_argument("--workers", type=int, default=0, help="loader worker processes")
    parser.add_argument("--seed", type=int, default=0, help="model init and data order")
    parser.add_argument("--record", help="write each step's batch sha256 and loss here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Train (or resume) as the arguments say; return each step's batch fingerprint and loss."""
    args = parse_args(argv)
    torch.set_num_threads(1)  # tiny ops: threads only add spin-waiting on a shared CPU
    torch.manual_seed(args.seed)
    vocab = int(read_index(open_store(args.data)).tokenizer["n_vocab"])
    model = TinyLM(vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = wdstream.Loader(args.data, seq_len=args.seq_len, batch_size=args.batch_size,
                             seed=args.seed, num_workers=args.workers, epochs=None)  # fmt: skip
    app = AppState(model, optimizer)
    state = {"app": app, "data": LoaderState(loader)}
    if args.resume and (ckpt := latest_checkpoint(args.ckpt_dir)) is not None:
        dcp.load(state, checkpoint_id=ckpt)  # in place: the model, optimizer and loader
        print(f"resumed from {ckpt} at step {app.step}")

    record: list[dict[str, Any]] = []
    batches = iter(loader)
    while app.step < args.steps:
        # Draw only batches that are trained on: the loader's state is then the position
        # after the last trained batch (a `for ... break` would draw one too many).
        batch = next(batches)
        logits = model(batch["input_ids"])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), batch["labels"].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        app.step += 1
        targets = batch["labels"].to(torch.int64).numpy().astype("<i8")
        record.append({"step": app.step, "targets_sha256": hashlib.sha256(targets.tobytes()).hexdigest(),
                       "loss": loss.item()})  # fmt: skip
        if app.step % args.save_steps == 0:
            path = os.path.join(args.ckpt_dir, f"step-{app.step}")
            dcp.save(state, checkpoint_id=path)
            print(f"saved {path}")
    if args.record:
        with open(args.record, "w") as f:
            json.dump(record, f, indent=0)
    return record


if __name__ == "__main__":
    main()
