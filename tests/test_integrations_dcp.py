"""``torch.distributed.checkpoint`` integration: ``examples/dcp_loop.py`` stopped at a DCP
checkpoint and resumed into fresh objects trains on exactly the batches of a run never
stopped (a plain loader loop is the oracle), and the loader's part of the checkpoint is a
tensor of JSON bytes, nothing pickled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

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

# torch.distributed.checkpoint and the integration are imported by the tests that use them
# (~0.8 CPU-s), not at collection, which every xdist worker does for every file.
STEPS, STOP_AT = 14, 6


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, corpus_docs: list[str]) -> Path:
    return pack_tiny(tmp_path_factory.mktemp("dcp"), corpus_docs)


def _run(data: Path, ckpt: Path, steps: int, *extra: str) -> list[dict[str, Any]]:
    argv = [str(data), "--ckpt-dir", str(ckpt), "--steps", str(steps), "--seq-len", str(SEQ),
            "--batch-size", str(BATCH), *extra]  # fmt: skip
    return list(load_example("dcp_loop").main(argv))


@pytest.mark.timeout(120)
def test_dcp_loop_resume_sees_the_same_batches(packed: Path, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    full = _run(packed, tmp_path / "full", STEPS, "--save-steps", str(STEPS))
    first = _run(packed, tmp_path / "split", STOP_AT, "--save-steps", str(STOP_AT))
    second = _run(packed, tmp_path / "split", STEPS, "--save-steps", str(STOP_AT), "--resume")

    assert STEPS > EPOCH_BATCHES  # the run crosses the loader's epoch boundary
    assert [r["targets_sha256"] for r in full] == oracle(packed, STEPS)
    assert len({r["targets_sha256"] for r in full}) == STEPS
    assert [r["step"] for r in full] == list(range(1, STEPS + 1))
    # Resumed into fresh objects: the rest of the run, same batches, same losses.
    assert first == full[:STOP_AT]
    assert second == full[STOP_AT:]

    # The loader's part is one uint8 tensor; its bytes are the JSON state, space-padded.
    ckpt = tmp_path / "split" / f"step-{STOP_AT}"
    meta = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    assert isinstance(meta["data.json"], TensorStorageMetadata)
    assert meta["data.json"].properties.dtype == torch.uint8
    target = {"json": torch.zeros(meta["data.json"].size, dtype=torch.uint8)}
    dcp.load({"data": target}, checkpoint_id=str(ckpt))
    assert json.loads(target["json"].numpy().tobytes()) == state_after(packed, STOP_AT)


def test_round_trip_in_one_process(packed: Path, tmp_path: Path) -> None:
    """dcp.save / dcp.load of the loader alone: a fresh loader continues where one stopped."""
    import torch.distributed.checkpoint as dcp

    from wdstream.integrations.dcp import LoaderState

    loader = tiny_loader(packed)
    it = iter(loader)
    for _ in range(3):
        next(it)
    dcp.save({"data": LoaderState(loader)}, checkpoint_id=str(tmp_path))
    want = [next(it)["labels"] for _ in range(2)]
    fresh = tiny_loader(packed)
    dcp.load({"data": LoaderState(fresh)}, checkpoint_id=str(tmp_path))
    got = iter(fresh)
    for labels in want:
        assert torch.equal(next(got)["labels"], labels)


def test_state_too_large_for_capacity_is_refused(packed: Path) -> None:
    from wdstream.integrations.dcp import LoaderState

    size = len(json.dumps(tiny_loader(packed).state_dict(), separators=(",", ":")))
    with pytest.raises(ValueError, match=f"{size} bytes of JSON, more than capacity=100"):
        LoaderState(tiny_loader(packed), capacity=100).state_dict()


def test_per_rank_state_is_kept_per_rank(packed: Path) -> None:
    from wdstream.integrations.dcp import LoaderState

    streams = wdstream.Loader(str(packed), seq_len=SEQ, batch_size=BATCH, num_workers=0,
                              order="streams", rank=1, world_size=2)  # fmt: skip
    assert list(LoaderState(streams).state_dict()) == ["json_rank1"]
    assert list(LoaderState(tiny_loader(packed)).state_dict()) == ["json"]


def test_bytes_that_are_not_json_are_refused(packed: Path) -> None:
    from wdstream.integrations.dcp import LoaderState

    with pytest.raises(ValueError, match="LoaderState json: not a JSON loader state"):
        LoaderState(tiny_loader(packed)).load_state_dict(
            {"json": torch.full((8,), 0xFF, dtype=torch.uint8)}
        )
