"""HF ``Trainer`` integration: ``examples/hf_trainer.py`` stopped at a checkpoint and resumed
sees exactly the batches of a run never stopped, and those are the loader's own batches in
order (a plain ``Loader`` loop is the oracle): nothing replayed, skipped or re-batched, across
the loader's epoch boundary, with gradient accumulation."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import wdstream
from tests.integrations_support import (
    BATCH,
    EPOCH_BATCHES,
    SEQ,
    load_example,
    oracle,
    pack_tiny,
    state_after,
    tiny_loader,
)

ACCUM, STEPS, STOP_AT = 2, 7, 3


@pytest.fixture(scope="module")
def hf() -> ModuleType:
    """``wdstream.integrations.hf``, imported by this file's tests rather than at collection,
    which every xdist worker does for every file (transformers and accelerate: ~3.7 CPU-s)."""
    import wdstream.integrations.hf

    return wdstream.integrations.hf


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, corpus_docs: list[str]) -> Path:
    return pack_tiny(tmp_path_factory.mktemp("hf"), corpus_docs)


def _run(data: Path, out: Path, steps: int, *extra: str) -> dict[str, Any]:
    argv = [str(data), "--output-dir", str(out), "--steps", str(steps), "--seq-len", str(SEQ),
            "--batch-size", str(BATCH), "--grad-accum", str(ACCUM), *extra]  # fmt: skip
    return dict(load_example("hf_trainer").main(argv))


@pytest.mark.timeout(120)
def test_hf_trainer_resume_sees_the_same_batches(
    hf: ModuleType, packed: Path, tmp_path: Path
) -> None:
    full = _run(packed, tmp_path / "full", STEPS, "--save-steps", str(STEPS))
    first = _run(packed, tmp_path / "split", STOP_AT, "--save-steps", str(STOP_AT))
    second = _run(packed, tmp_path / "split", STEPS, "--save-steps", str(STOP_AT), "--resume")

    n = STEPS * ACCUM
    assert n > EPOCH_BATCHES  # the run crosses the loader's epoch boundary
    seen = [b["targets_sha256"] for b in full["batches"]]
    assert seen == oracle(packed, n)  # the Trainer neither shuffled, re-batched nor sharded them
    assert len(set(seen)) == n  # the hashes tell batches apart
    assert [b["step"] for b in full["batches"]] == [s for s in range(1, STEPS + 1) for _ in "ab"]

    # Stopped at step STOP_AT and resumed: the rest, from the next batch, nothing replayed.
    assert first["batches"] == full["batches"][: STOP_AT * ACCUM]
    assert second["batches"] == full["batches"][STOP_AT * ACCUM :]
    # Same data, optimizer and RNG state: the same losses (CPU, one thread, no dropout).
    assert first["losses"] + second["losses"] == full["losses"]
    assert [r["step"] for r in full["losses"]] == list(range(1, STEPS + 1))

    # The checkpoint holds the loader's JSON state after the batches of STOP_AT steps.
    saved = (tmp_path / "split" / f"checkpoint-{STOP_AT}" / hf.LOADER_STATE_FILE).read_text()
    assert json.loads(saved) == state_after(packed, STOP_AT * ACCUM)


@pytest.mark.timeout(60)
def test_a_checkpoint_without_loader_state_is_refused(
    hf: ModuleType, packed: Path, tmp_path: Path
) -> None:
    _run(packed, tmp_path / "out", 1, "--save-steps", "1")
    (tmp_path / "out" / "checkpoint-1" / hf.LOADER_STATE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=f"checkpoint-1: no {hf.LOADER_STATE_FILE}"):
        _run(packed, tmp_path / "out", 2, "--save-steps", "1", "--resume")


def test_max_steps_is_required(hf: ModuleType, packed: Path, tmp_path: Path) -> None:
    from transformers import TrainingArguments

    model = load_example("hf_trainer").tiny_gpt2(100, SEQ)
    args = TrainingArguments(str(tmp_path), num_train_epochs=1, use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match="max_steps=N"):
        hf.WdstreamTrainer(model=model, args=args, loader=tiny_loader(packed))


def test_per_rank_states_get_a_file_per_rank(hf: ModuleType, packed: Path, tmp_path: Path) -> None:
    """A per-rank state (``order="streams"``) is saved by each rank to its own file; the global
    order's, the same on every rank, once by rank 0, and every rank of any world size reads it."""
    ckpt = str(tmp_path / "checkpoint-7")
    streams = wdstream.Loader(str(packed), seq_len=SEQ, batch_size=BATCH, num_workers=0,
                              order="streams", rank=1, world_size=2)  # fmt: skip
    state = streams.state_dict()
    assert hf.save_loader_state(state, ckpt, rank=1) == f"{ckpt}/wdstream_loader_state.rank1.json"
    assert hf.load_loader_state(ckpt, rank=1) == state
    with pytest.raises(FileNotFoundError, match="nor one for rank 0"):
        hf.load_loader_state(ckpt, rank=0)

    shared = tiny_loader(packed).state_dict()
    assert hf.save_loader_state(shared, ckpt, rank=3) is None
    assert hf.save_loader_state(shared, ckpt, rank=0) == f"{ckpt}/{hf.LOADER_STATE_FILE}"
    assert hf.load_loader_state(ckpt, rank=5) == shared
    (tmp_path / "checkpoint-7" / hf.LOADER_STATE_FILE).write_text('{"step": ')
    with pytest.raises(ValueError, match=f"{hf.LOADER_STATE_FILE}:1: not a JSON loader state"):
        hf.load_loader_state(ckpt, rank=5)
