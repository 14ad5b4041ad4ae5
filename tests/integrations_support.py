"""What the trainer-integration tests share: a tiny packed dataset (a 446-token BPE trained
here, so the models' output layers stay small), the examples loaded as
modules (run in this process: a fresh interpreter would pay the frameworks' imports each
time), and the oracle, the loader's own batches read with no trainer."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import torch

import wdstream
from tests.tokenizer_files import build_hf_bpe

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SEQ, BATCH = 32, 2
EPOCH_BATCHES = 9  # of the dataset below, with SEQ and BATCH: odd, so that an epoch ends
# inside a gradient-accumulation group


def pack_tiny(root: Path, docs: list[str]) -> Path:
    """8 documents packed with ``seq_len`` 32 by a byte-level BPE trained on 40 (446 ids): 9
    batches of 2 an epoch, so a run of a few steps crosses into the second epoch."""
    tokenizer = build_hf_bpe(root / "tokenizer", docs[:40])
    corpus = root / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:8]))
    wdstream.pack([str(corpus)], str(root / "data"), seq_len=SEQ, tokenizer=str(tokenizer),
                  shard_size="32KB", workers=0, progress=False)  # fmt: skip
    assert len(tiny_loader(root / "data")) == EPOCH_BATCHES
    return root / "data"


def load_example(name: str) -> ModuleType:
    """``examples/NAME.py`` as a module (its ``main(argv)`` runs it as the command line would)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_loader(data: Path) -> wdstream.Loader:
    """The loader every example makes with these arguments (endless: the trainer stops it)."""
    return wdstream.Loader(str(data), seq_len=SEQ, batch_size=BATCH, seed=0, num_workers=0,
                           epochs=None)  # fmt: skip


def targets_sha256(labels: torch.Tensor) -> str:
    """The examples' fingerprint of a batch: sha256 of its targets as little-endian int64."""
    return hashlib.sha256(labels.to(torch.int64).numpy().astype("<i8").tobytes()).hexdigest()


def oracle(data: Path, n: int) -> list[str]:
    """The fingerprints of the loader's first ``n`` batches, read in a plain loop."""
    it = iter(tiny_loader(data))
    return [targets_sha256(next(it)["labels"]) for _ in range(n)]


def state_after(data: Path, n: int) -> dict:
    """The loader's state after ``n`` batches of a plain loop."""
    loader = tiny_loader(data)
    it = iter(loader)
    for _ in range(n):
        next(it)
    return loader.state_dict()
