"""Lightning with a :class:`~wdstream.Loader`: a ``LightningDataModule`` whose
``state_dict``/``load_state_dict`` carry the loader's state, so ``trainer.fit(ckpt_path=...)``
continues the data exactly where the checkpoint was taken, without replaying batches.

::

    dm = LoaderDataModule(lambda: wdstream.Loader("data/", seq_len=2048, batch_size=8))
    trainer = L.Trainer(max_steps=1000, callbacks=[ModelCheckpoint(every_n_train_steps=100)])
    trainer.fit(model, datamodule=dm)                       # checkpoints hold dm's state
    trainer.fit(model, datamodule=dm, ckpt_path="last")     # after a restart: the next batch

- The loader is made in ``setup("fit")`` (``make_loader``), after Lightning has started the
  process group, so it takes its rank and world size from ``torch.distributed``.
- ``train_dataloader`` returns the loader's batches as they are (no sampler is added: the loader
  splits across ranks itself), with its length, one epoch of the loader.
- Lightning draws a batch ahead when a loader has no length; the state saved is the one after
  the last batch handed to ``training_step`` (marked in ``on_before_batch_transfer``, a hook this
  class overrides: one in the ``LightningModule`` as well is not called).
- Lightning saves one checkpoint, rank 0's. The global order's state (the default) is the same
  on every rank; a per-rank state (``order="streams"``) on several ranks is refused at save.
- Resuming from a checkpoint with no state of this DataModule is refused (it would start the
  data over).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from wdstream.integrations.base import Batch, TrackedBatches, per_rank_state, require

if TYPE_CHECKING:
    from wdstream.read.torch.loader import Loader

_pl = require("lightning.pytorch", "wdstream.integrations.lightning", "lightning>=2.2")

__all__ = ["LoaderDataModule"]

_STATE_KEY = "loader"


class _EpochBatches(TrackedBatches):
    """The tracked batches with the loader's length: a Lightning epoch is one of the loader's."""

    def __len__(self) -> int:
        return len(self.loader)  # a TypeError where it has no count: Lightning runs on by steps


class LoaderDataModule(_pl.LightningDataModule):  # type: ignore[name-defined]
    """A ``LightningDataModule`` serving a :class:`~wdstream.Loader`, its state in every checkpoint.

    Args:
        make_loader: makes the loader, called once in ``setup("fit")``.
    """

    def __init__(self, make_loader: Callable[[], Loader]) -> None:
        super().__init__()
        self.make_loader = make_loader
        self._batches: TrackedBatches | None = None
        self._loaded: dict[str, Any] | None = None  # a state loaded before setup made the loader
        self._restored = False

    @property
    def loader(self) -> Loader:
        """The loader (after ``setup("fit")``)."""
        return self._tracked().loader

    def _tracked(self) -> TrackedBatches:
        if self._batches is None:
            raise RuntimeError(
                "LoaderDataModule: the loader is made in setup('fit'); call it first"
            )
        return self._batches

    def setup(self, stage: str) -> None:
        if stage == "fit" and self._batches is None:
            self._batches = _EpochBatches(self.make_loader())
            if self._loaded is not None:
                self._batches.load_state_dict(self._loaded)
                self._loaded = None

    def train_dataloader(self) -> TrackedBatches:
        """The loader's batches, from the restored state when resuming.

        Raises:
            RuntimeError: ``fit`` resumes from a checkpoint that holds no state of this module.
        """
        ckpt = None if self.trainer is None else self.trainer.ckpt_path
        if ckpt and not self._restored:
            raise RuntimeError(
                f"{ckpt}: the checkpoint holds no {type(self).__qualname__} state, so the data "
                "would start over; resume from a checkpoint saved with this DataModule"
            )
        return self._tracked()

    def on_before_batch_transfer(self, batch: Batch, dataloader_idx: int) -> Batch:
        # The last hook before training_step that sees the batch: from here it counts as trained.
        if self.trainer is not None and self.trainer.training and self._tracked().waiting:
            self._tracked().mark_trained()
        return batch

    def state_dict(self) -> dict[str, Any]:
        """``{"loader": state}``: the loader state after the last batch sent to training.

        Raises:
            ValueError: a per-rank state on several ranks (Lightning keeps rank 0's only).
        """
        if self._batches is None:
            return {} if self._loaded is None else {_STATE_KEY: self._loaded}
        state = self._batches.state_dict()
        if per_rank_state(state) and self._batches.loader.world_size > 1:
            raise ValueError(
                "LoaderDataModule: this loader's state is per rank (order='streams' or raw text) "
                "and Lightning saves rank 0's only; use the global order (the default)"
            )
        return {_STATE_KEY: state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue after the batch at which the checkpoint was taken.

        Raises:
            KeyError: ``state_dict`` has no ``"loader"``.
            wdstream.StateMismatchError: a state of another dataset or configuration.
        """
        if _STATE_KEY not in state_dict:
            raise KeyError(
                f"LoaderDataModule.load_state_dict: no {_STATE_KEY!r} key in {sorted(state_dict)}"
            )
        self._restored = True
        if self._batches is None:
            self._loaded = state_dict[_STATE_KEY]
        else:
            self._batches.load_state_dict(state_dict[_STATE_KEY])
