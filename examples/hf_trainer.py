"""Train a tiny GPT-2 with the Hugging Face ``Trainer`` on a packed dataset, and resume it exactly.

    wdstream pack corpus.jsonl --output data/ --seq-len 64 --holdout 0.01
    python examples/hf_trainer.py data/ --output-dir out/ --steps 40 --save-steps 20 \
        --eval data/holdout/
    python examples/hf_trainer.py data/ --output-dir out/ --steps 80 --resume   # from step 40

``WdstreamTrainer`` (``wdstream/integrations/hf.py``) is a ``transformers.Trainer`` whose
training batches come from a ``wdstream.Loader``. Every checkpoint folder gets
``wdstream_loader_state.json`` beside the Trainer's own files; ``--resume`` continues from the
last checkpoint, and the loader from that state: the Trainer does not replay (fast-forward
through) the batches of the steps already done. The model is built here from a tiny
``GPT2Config`` (one layer, width 32; no download), its vocabulary the dataset's tokenizer's.

``--eval data/holdout/`` evaluates the model after training on the held-out dataset that
``pack --holdout`` wrote beside the training one (documents chosen by content hash, never in
``data/``): one pass, in order (``Loader(..., epochs=1, shuffle=False)``), the mean loss per
target token; the last batch short of ``--batch-size`` rows is left out, as every batch of a
``Loader`` is full.

``--record steps.json`` writes, for every batch the model saw, its training step and the
sha256 of its targets, and the loss of every optimizer step: ``tests/test_integrations_hf.py``
checks that a run stopped and resumed sees the same batches as one that was never stopped.
With ``--grad-accum 2`` a step is two loader batches: the Trainer counts optimizer steps, and
checkpoints fall between them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

import wdstream
from wdstream.integrations.hf import WdstreamTrainer
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="packed dataset: folder, s3:// or http(s):// URL")
    parser.add_argument("--output-dir", default="out", help="the Trainer's checkpoints")
    parser.add_argument("--steps", type=int, default=40, help="train until this optimizer step")
    parser.add_argument("--save-steps", type=int, default=20, help="checkpoint every N steps")
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4, help="loader batch (per rank)")
    parser.add_argument("--grad-accum", type=int, default=1, help="loader batches per step")
    parser.add_argument("--workers", type=int, default=0, help="loader worker processes")
    parser.add_argument("--seed", type=int, default=0, help="model init and data order")
    parser.add_argument("--record", help="write each batch's sha256 and each step's loss here")
    parser.add_argument("--eval", help="held-out dataset to evaluate on after training")
    return parser.parse_args(argv)


def tiny_gpt2(n_vocab: int, seq_len: int) -> GPT2LMHeadModel:
    """One transformer layer of width 32, dropout off (so a resumed run can match bit for bit)."""
    config = GPT2Config(
        vocab_size=n_vocab, n_positions=seq_len, n_layer=1, n_embd=32, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


class Recorder(TrainerCallback):
    """Collects what the model saw: each batch's targets (hashed) and each step's loss."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.batches: list[dict[str, Any]] = []
        self.losses: list[dict[str, Any]] = []
        self.step = 0
        model.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if module.training:
            targets = kwargs["shift_labels"].to(torch.int64).cpu().numpy().astype("<i8")
            sha = hashlib.sha256(targets.tobytes()).hexdigest()
            self.batches.append({"step": self.step + 1, "targets_sha256": sha})

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step  # the checkpoint's step, when resuming

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.losses.append({"step": state.global_step, "loss": float(logs["loss"])})


def evaluate(model: torch.nn.Module, data: str, seq_len: int, batch_size: int) -> dict[str, float]:
    """One ordered pass over the held-out dataset ``data``: the mean loss per target token
    (``-100`` targets, such as best-fit padding, not counted) and how many were counted."""
    loader = wdstream.Loader(data, seq_len=seq_len, batch_size=batch_size, epochs=1,
                             shuffle=False, num_workers=0)  # fmt: skip
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in loader:
            logits = model(input_ids=batch["input_ids"]).logits
            targets = batch["labels"].to(torch.int64)  # the next token of each position
            total += float(torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100,
                reduction="sum",
            ))  # fmt: skip
            count += int((targets != -100).sum())
    model.train()
    return {"eval_loss": total / max(count, 1), "eval_tokens": count}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train (or resume) as the arguments say; return what was recorded."""
    args = parse_args(argv)
    torch.set_num_threads(1)  # tiny ops: threads only add spin-waiting on a shared CPU
    torch.manual_seed(args.seed)
    n_vocab = int(read_index(open_store(args.data)).tokenizer["n_vocab"])
    model = tiny_gpt2(n_vocab, args.seq_len)
    loader = wdstream.Loader(args.data, seq_len=args.seq_len, batch_size=args.batch_size,
                             seed=args.seed, num_workers=args.workers, epochs=None)  # fmt: skip
    training = TrainingArguments(
        args.output_dir, max_steps=args.steps, save_steps=args.save_steps,
        gradient_accumulation_steps=args.grad_accum, learning_rate=3e-3,
        lr_scheduler_type="constant", logging_steps=1, seed=args.seed, use_cpu=True,
        report_to=[], disable_tqdm=True,
    )  # fmt: skip
    trainer = WdstreamTrainer(model=model, args=training, loader=loader)
    recorder = Recorder(model)
    trainer.add_callback(recorder)
    result = trainer.train(resume_from_checkpoint=True if args.resume else None)
    print(f"trained to step {result.global_step}, loss {result.training_loss:.3f}")
    record: dict[str, Any] = {"batches": recorder.batches, "losses": recorder.losses}
    if args.eval:
        record |= evaluate(model, args.eval, args.seq_len, args.batch_size)
        print(f"eval loss {record['eval_loss']:.3f} over {record['eval_tokens']:,} tokens")
    if args.record:
        with open(args.record, "w") as f:
            json.dump(record, f, indent=0)
    return record


if __name__ == "__main__":
    main()
