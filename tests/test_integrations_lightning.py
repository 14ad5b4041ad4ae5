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

# Lightning is imported by the tests that use it (~3 CPU-s), not at collection, which every
# xdist worker does for every file.
ACCUM, STEPS = 2, 7


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, corpus_docs: list[str]) -> Path:
    return pack_tiny(tmp_path_factory.mktemp("lightning"), corpus_docs)


def _run(data: Path, ckpt: Path, steps: int, *extra: str) -> list[dict[str, Any]]:
    argv = [str(data), "--ckpt-dir", str(ckpt), "--steps", str(steps), "--seq-len", str(SEQ),
            "--batch-size", str(BATCH), "--grad-accum", str(ACCUM), *extra]  # fmt: skip
    return list(load_example("lightning_datamodule").main(argv))


@pytest.fixture(scope="module")
def full(packed: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The run never stopped: every batch it trained on, with its step and loss."""
    return _run(packed, tmp_path_factory.mktemp("full"), STEPS, "--save-steps", str(STEPS))


def _lightning_steps(steps: int) -> list[int]:
    """The step of each batch: Lightning steps the optimizer after every ``ACCUM`` batches and
    at the end of each epoch of the loader (its length), also after fewer."""
    out: list[int] = []
    while True:
        for start in range(0, EPOCH_BATCHES, ACCUM):
            out += [len(set(out)) + 1] * min(ACCUM, EPOCH_BATCHES - start)
            if len(set(out)) == steps:
                return out


def test_lightning_trains_on_the_loader_batches_in_order(packed: Path, full: list) -> None:
    steps = _lightning_steps(STEPS)
    assert len(steps) > EPOCH_BATCHES  # the run crosses the loader's epoch boundary
    assert [r["step"] for r in full] == steps
    assert [r["targets_sha256"] for r in full] == oracle(packed, len(steps))
    assert len({r["targets_sha256"] for r in full}) == len(steps)  # the hashes tell them apart


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop_at", [3, 5])  # mid-epoch; at the epoch's end (a short step)
def test_lightning_resume_sees_the_same_batches(
    packed: Path, full: list, tmp_path: Path, stop_at: int
) -> None:
    first = _run(packed, tmp_path, stop_at, "--save-steps", str(stop_at))
    # The checkpoint holds the loader's state after the batches of stop_at steps.
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert ckpt["LoaderDataModule"] == {"loader": state_after(packed, len(first))}
    second = _run(packed, tmp_path, STEPS, "--save-steps", str(stop_at), "--resume")
    # Stopped and resumed: the rest, from the next batch, nothing replayed; same losses.
    assert len(first) == _lightning_steps(STEPS).index(stop_at + 1)
    assert first + second == full


@pytest.mark.timeout(60)
def test_epoch_based_resume_at_an_epoch_end(packed: Path, tmp_path: Path) -> None:
    """Trained by epochs (no max_steps) and resumed at an epoch's end, Lightning restores no
    loader itself (it counts such a run as not restarting): the DataModule's state does it."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from wdstream.integrations.lightning import LoaderDataModule

    example = load_example("lightning_datamodule")
    seen: list[str] = []
    for epochs in (1, 2):
        model = example.TinyLM(1000)  # more than the 446 ids of the tiny BPE
        trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                            callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True)],
                            enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        dm = LoaderDataModule(lambda: tiny_loader(packed))
        trainer.fit(model, datamodule=dm, ckpt_path=tmp_path / "last.ckpt" if epochs > 1 else None)
        seen += [r["targets_sha256"] for r in model.record]
    assert seen == oracle(packed, 2 * EPOCH_BATCHES)


@pytest.mark.timeout(60)
def test_a_batch_drawn_ahead_is_not_counted_as_trained(packed: Path, tmp_path: Path) -> None:
    """Lightning fetches one batch ahead of training when the loader has no length: the
    checkpoint still holds the state after the last batch trained, not the last drawn."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from wdstream.integrations.lightning import LoaderDataModule

    class _Prefetching(LoaderDataModule):
        """The loader without a length, so Lightning's fetcher draws a batch ahead."""

        def train_dataloader(self) -> Any:
            batches = super().train_dataloader()
            return (b for b in batches)

    example = load_example("lightning_datamodule")
    model = example.TinyLM(1000)  # more than the 446 ids of the tiny BPE
    saves = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, callbacks=[saves],
                        logger=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    dm = _Prefetching(lambda: tiny_loader(packed))
    trainer.fit(model, datamodule=dm)
    assert dm.loader.state_dict() == state_after(packed, 4)  # drawn: one more than trained
    ckpt = torch.load(tmp_path / "epoch=0-step=3.ckpt", weights_only=True)
    assert ckpt[_Prefetching.__qualname__] == {"loader": state_after(packed, 3)}  # its key


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
    from wdstream.integrations.lightning import LoaderDataModule

    dm = LoaderDataModule(lambda: Loader(str(packed), seq_len=SEQ, batch_size=BATCH,
                                         num_workers=0, order="streams", rank=0, world_size=2))  # fmt: skip
    dm.setup("fit")
    with pytest.raises(ValueError, match="per rank"):
        dm.state_dict()
