"""Train a tiny language model with Lightning on a packed dataset, and resume it exactly.

    wdstream pack corpus.jsonl --output data/ --seq-len 64
    python examples/lightning_datamodule.py data/ --ckpt-dir ckpts/ --steps 40 --save-steps 20
    python examples/lightning_datamodule.py data/ --ckpt-dir ckpts/ --steps 80 --resume

``LoaderDataModule`` (``wdstream/integrations/lightning.py``) serves a ``wdstream.Loader``; its
``state_dict`` is the loader's state, which Lightning stores in every checkpoint under the
DataModule's class name and gives back on ``trainer.fit(..., ckpt_path=...)``: the run
continues with the next batch, exactly, without replaying any. ``--resume`` resumes from
``CKPT_DIR/last.ckpt``.

The model (an embedding, one GRU layer, a projection, width 32) trains on the loader's
``input_ids``/``labels`` as they come: ``labels`` are already the next tokens, with -100
where no loss is taken. ``--record steps.json`` writes, for every batch trained on, its step
and the sha256 of its targets, and its loss: ``tests/test_integrations_lightning.py`` checks
that a run stopped and resumed sees the same batches and losses as one never stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

import wdstream
from wdstream.integrations.lightning import LoaderDataModule
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store


class TinyLM(L.LightningModule):
    """An embedding, one GRU layer and a projection; records what it trains on."""

    def __init__(self, vocab: int, width: int = 32, lr: float = 3e-3) -> None:
        super().__init__()
        self.vocab, self.lr = vocab, lr
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)
        self.record: list[dict[str, Any]] = []

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.mix(self.embed(input_ids))
        return self.head(hidden)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self(batch["input_ids"])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, self.vocab), batch["labels"].reshape(-1)
        )
        targets = batch["labels"].to(torch.int64).cpu().numpy().astype("<i8")
        self.record.append({
            "step": self.trainer.global_step + 1,  # the optimizer step this batch counts toward
            "targets_sha256": hashlib.sha256(targets.tobytes()).hexdigest(),
            "loss": loss.item(),
        })  # fmt: skip
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="packed dataset: folder, s3:// or http(s):// URL")
    parser.add_argument("--ckpt-dir", default="ckpts", help="where checkpoints go")
    parser.add_argument("--steps", type=int, default=40, help="train until this optimizer step")
    parser.add_argument("--save-steps", type=int, default=20, help="checkpoint every N steps")
    parser.add_argument("--resume", action="store_true", help="resume from CKPT_DIR/last.ckpt")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4, help="loader batch (per rank)")
    parser.add_argument("--grad-accum", type=int, default=1, help="loader batches per step")
    parser.add_argument("--workers", type=int, default=0, help="loader worker processes")
    parser.add_argument("--seed", type=int, default=0, help="model init and data order")
    parser.add_argument("--record", help="write each trained batch's sha256 and loss here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Train (or resume) as the arguments say; return what the model trained on."""
    args = parse_args(argv)
    torch.set_num_threads(1)  # tiny ops: threads only add spin-waiting on a shared CPU
    L.seed_everything(args.seed, verbose=False)
    n_vocab = int(read_index(open_store(args.data)).tokenizer["n_vocab"])
    model = TinyLM(n_vocab)

    def make_loader() -> wdstream.Loader:
        # Made in setup("fit"), once Lightning has set up the ranks. Endless (epochs=None):
        # max_steps ends the run; a Lightning epoch is one epoch of the loader, len(loader).
        return wdstream.Loader(args.data, seq_len=args.seq_len, batch_size=args.batch_size,
                               seed=args.seed, num_workers=args.workers, epochs=None)  # fmt: skip

    checkpoints = ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.save_steps,
                                  save_top_k=-1, save_last=True)  # fmt: skip
    trainer = L.Trainer(
        max_steps=args.steps, accumulate_grad_batches=args.grad_accum, accelerator="cpu",
        devices=1, callbacks=[checkpoints], logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    ckpt = os.path.join(args.ckpt_dir, "last.ckpt") if args.resume else None
    trainer.fit(model, datamodule=LoaderDataModule(make_loader), ckpt_path=ckpt)
    print(f"trained to step {trainer.global_step}, {len(model.record)} batches in this run")
    if args.record:
        with open(args.record, "w") as f:
            json.dump(model.record, f, indent=0)
    return model.record


if __name__ == "__main__":
    main()
