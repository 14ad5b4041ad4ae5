"""The examples run as written: train, stop, restart from the checkpoint, continue."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import wdstream

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_train_tiny_lm_checkpoints_and_resumes(
    tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]
) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", corpus_docs[:40])
    data = tmp_path / "data"
    wdstream.pack(
        [str(corpus)],
        str(data),
        seq_len=64,
        shard_size="64KB",
        workers=1,
        pool="threads",
        progress=False,
    )
    ckpt = tmp_path / "ck.pt"

    def train(steps: int) -> str:
        cmd = [
            sys.executable,
            str(EXAMPLES / "train_tiny_lm.py"),
            str(data),
            "--steps",
            str(steps),
            "--seq-len",
            "64",
            "--ckpt",
            str(ckpt),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
        return done.stdout

    first = train(5)
    assert f"saved {ckpt} at step 5" in first
    second = train(10)
    assert "resumed at step 5" in second and f"saved {ckpt} at step 10" in second
