"""The examples run as written: train, stop, restart from the checkpoint, continue, and the
restarted run sees exactly the batches (and, on CPU with one thread, computes exactly the
losses and weights) of a run that was never stopped.

Each training is a process of its own, forked from :mod:`tests.script_server`'s server that
imported what the example imports (torch, ``torch._dynamo`` as its AdamW does, wdstream):
~3 s of CPU a training less than a fresh ``python``, six trainings here. 20 steps over a
dataset of 8 batches an epoch: the stop (step 11) is inside the second epoch, and the resumed
run crosses into the third."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import wdstream
from tests.script_server import run_python

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STEPS, STOP_AT = 20, 11
# What the example imports, with the Loader's modules (``wdstream.Loader`` is its first call)
# and ``torch._dynamo`` (its AdamW imports it): see tests/script_server.py.
PRELOAD = ("torch", "wdstream", "wdstream.read.sources.shards", "wdstream.storage",
           "wdstream.read.torch.loader", "torch._dynamo")  # fmt: skip


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, corpus_docs: list[str]) -> Path:
    """The first 40 corpus documents packed with ``--seq-len 64`` (real cl100k tokens)."""
    root = tmp_path_factory.mktemp("examples")
    corpus = root / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus_docs[:40]))
    wdstream.pack([str(corpus)], str(root / "data"), seq_len=64, shard_size="64KB", workers=0,
                  progress=False)  # fmt: skip
    return root / "data"


def _train(data: Path, ckpt: Path, record: Path, steps: int, workers: int) -> str:
    """Run the example as a user would (a process of its own, CPU only); return its stdout."""
    args = [
        str(EXAMPLES / "train_tiny_lm.py"), str(data), "--steps", str(steps),
        "--seq-len", "64", "--ckpt", str(ckpt), "--record", str(record),
        "--workers", str(workers), "--log-every", "5",
    ]  # fmt: skip
    env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = run_python(*args, preload=PRELOAD, env=env, timeout=240)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _record(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())


@pytest.mark.timeout(480)  # three trainings; CI runs another test beside it
@pytest.mark.parametrize("workers", [0, 2])
def test_train_tiny_lm_resume_sees_the_same_batches(
    packed: Path, tmp_path: Path, workers: int
) -> None:
    full_ckpt, split_ckpt = tmp_path / "full.pt", tmp_path / "split.pt"
    out = _train(packed, full_ckpt, tmp_path / "full.json", STEPS, workers)
    assert f"saved {full_ckpt} at step {STEPS}" in out and "resumed" not in out
    first = _train(packed, split_ckpt, tmp_path / "first.json", STOP_AT, workers)
    assert f"saved {split_ckpt} at step {STOP_AT}" in first
    second = _train(packed, split_ckpt, tmp_path / "second.json", STEPS, workers)
    assert f"resumed at step {STOP_AT}" in second
    assert f"saved {split_ckpt} at step {STEPS}" in second

    full = _record(tmp_path / "full.json")
    before, after = _record(tmp_path / "first.json"), _record(tmp_path / "second.json")
    assert [r["step"] for r in full] == list(range(1, STEPS + 1))
    assert [r["step"] for r in after] == list(range(STOP_AT + 1, STEPS + 1))
    hashes = [r["batch_sha256"] for r in full]
    assert len(set(hashes)) == STEPS  # the fingerprints tell batches apart
    # The same batch at every step, before the stop and after the resume.
    assert [r["batch_sha256"] for r in before] == hashes[:STOP_AT]
    assert [r["batch_sha256"] for r in after] == hashes[STOP_AT:]
    # Deterministic on CPU with one thread: the same losses, bit for bit ...
    assert [r["loss"] for r in before + after] == [r["loss"] for r in full]
    # ... and the same weights, optimizer state and data cursor at the end.
    a = torch.load(full_ckpt, weights_only=False)
    b = torch.load(split_ckpt, weights_only=False)
    assert a["step"] == b["step"] == STEPS and a["data"] == b["data"]
    assert a["model"].keys() == b["model"].keys()
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for k, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, b["optimizer"]["state"][k][name]), (k, name)
    # It trains: the loss falls well below where it started (ln 4096 = 8.3).
    losses = [r["loss"] for r in full]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0, losses
