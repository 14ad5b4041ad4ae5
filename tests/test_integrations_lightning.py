"""Lightning integration: ``examples/lightning_datamodule.py`` stopped at a checkpoint and
resumed with ``fit(ckpt_path=...)`` trains on exactly the batches of a run never stopped, and
those are the loader's own batches in order (a plain loop is the oracle): nothing replayed or
skipped, across the loader's epoch boundary, with gradient accumulation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

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
from wdstream.integrations.lightning import LoaderDataModule

ACCUM, STEPS, STOP_AT = 2, 7, 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, corpus_docs: list[str]) -> Path:
    return pack_tiny(tmp_path_factory.mktemp("lightning"), corpus_docs)


def _run(data: Path, ckpt: Path, steps: int, *extra: str) -> list[dict[str, Any]]:
    argv = [str(data), "--ckpt-dir", str(ckpt), "--steps", str(steps), "--seq-len", str(SEQ),
            "--batch-size", str(BATCH), "--grad-accum", str(ACCUM), *extra]  # fmt: skip
    return list(load_example("lightning_datamodule").main(argv))


@pytest.mark.timeout(120)
def test_lightning_resume_sees_the_same_batches(packed: Path, tmp_path: Path) -> None:
    full = _run(packed, tmp_path / "full", STEPS, "--save-steps", str(STEPS))
    first = _run(packed, tmp_path / "split", STOP_AT, "--save-steps", str(STOP_AT))
    # The checkpoint holds the loader's state after the batches of STOP_AT steps.
    ckpt = torch.load(tmp_path / "split" / "last.ckpt", weights_only=True)
    assert ckpt["LoaderDataModule"] == {"loader": state_after(packed, STOP_AT * ACCUM)}
    second = _run(packed, tmp_path / "split", STEPS, "--save-steps", str(STOP_AT), "--resume")

    n = STEPS * ACCUM
    assert n > EPOCH_BATCHES  # the run crosses the loader's epoch boundary
    assert [r["targets_sha256"] for r in full] == oracle(packed, n)
    assert len({r["targets_sha256"] for r in full}) == n  # the hashes tell batches apart
    assert [r["step"] for r in full] == [s for s in range(1, STEPS + 1) for _ in range(ACCUM)]
    # Stopped after STOP_AT steps and resumed: the rest, from the next batch, same losses.
    assert first == full[: STOP_AT * ACCUM]
    assert second == full[STOP_AT * ACCUM :]


class _Prefetching(LoaderDataModule):
    """The loader without a length, so Lightning's fetcher draws a batch ahead."""

    def train_dataloader(self) -> Any:
        batches = super().train_dataloader()
        return (b for b in batches)


@pytest.mark.timeout(60)
def test_a_batch_drawn_ahead_is_not_counted_as_trained(packed: Path, tmp_path: Path) -> None:
    """Lightning fetches one batch ahead of training when the loader has no length: the
    checkpoint still holds the state after the last batch trained, not the last drawn."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    example = load_example("lightning_datamodule")
    model = example.TinyLM(1000)  # more than the 446 ids of the tiny BPE
    saves = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, callbacks=[saves],
                        logger=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    dm = _Prefetching(lambda: tiny_loader(packed))
    trainer.fit(model, datamodule=dm)
    assert dm.loader.state_dict() == state_after(packed, 4)  # drawn: one more than trained
    ckpt = torch.load(tmp_path / "epoch=0-step=3.ckpt", weights_only=True)
    assert ckpt["_Prefetching"] == {"loader": state_after(packed, 3)}


@pytest.mark.timeout(60)
def test_resuming_without_datamodule_state_is_refused(packed: Path, tmp_path: Path) -> None:
    _run(packed, tmp_path, 1, "--save-steps", "1")
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=True)
    del ckpt["LoaderDataModule"]
    torch.save(ckpt, tmp_path / "last.ckpt")
    with pytest.raises(RuntimeError, match="holds no LoaderDataModule state"):
        _run(packed, tmp_path, 2, "--save-steps", "1", "--resume")


def test_per_rank_state_on_several_ranks_is_refused(packed: Path) -> None:
    from wdstream import Loader

    dm = LoaderDataModule(lambda: Loader(str(packed), seq_len=SEQ, batch_size=BATCH,
                                         num_workers=0, order="streams", rank=0, world_size=2))  # fmt: skip
    dm.setup("fit")
    with pytest.raises(ValueError, match="per rank"):
        dm.state_dict()
