"""Hugging Face ``Trainer`` with a :class:`~wdstream.Loader`: the loader's state in every
checkpoint folder, restored on ``train(resume_from_checkpoint=...)`` without replaying batches.

::

    loader = wdstream.Loader("data/", seq_len=2048, batch_size=8)
    trainer = WdstreamTrainer(model=model, args=TrainingArguments("out/", max_steps=1000,
                              save_steps=100), loader=loader)
    trainer.train()                              # out/checkpoint-100/wdstream_loader_state.json
    trainer.train(resume_from_checkpoint=True)   # after a restart: the next batch, exactly

How it differs from a plain ``Trainer``:

- ``get_train_dataloader`` returns the loader's batches as they are (the loader batches,
  shuffles and splits across ranks itself): no ``DataLoader``, sampler, collator or
  ``accelerator.prepare`` around it, so nothing re-batches or re-shards them.
- The ``Trainer`` resumes data by replaying: it fast-forwards the dataloader past the batches
  of the steps already done (``skip_first_batches``), reading them all again. Here
  ``args.ignore_data_skip`` is set, so it skips nothing, and the loader starts from the saved
  state instead (an O(1) seek).
- The state saved is the one after the last batch that went through ``training_step``
  (:class:`~wdstream.integrations.base.TrackedBatches`), as JSON, never pickled.
- ``args.max_steps`` is required: the loader has no length for the ``Trainer`` (its epochs
  are its own, ``Loader(epochs=...)``), so a run is counted in optimizer steps.
- ``shift_labels=True`` (default): the loader's ``labels`` are already the next tokens, while
  a transformers causal LM shifts ``labels`` once more. Each batch then carries them as
  ``shift_labels`` (which transformers' causal-LM loss uses as given, every position counted
  once) and ``labels`` in the model's own convention (the same targets, one position later).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import torch

from wdstream.integrations.base import (
    Batch,
    TrackedBatches,
    parse_state,
    per_rank_state,
    require,
)

if TYPE_CHECKING:
    from wdstream.read.torch.loader import Loader

_transformers = require("transformers", "wdstream.integrations.hf", "transformers>=4.45")
_trainer_utils = require(
    "transformers.trainer_utils", "wdstream.integrations.hf", "transformers>=4.45"
)

__all__ = [
    "LOADER_STATE_FILE",
    "WdstreamTrainer",
    "causal_lm_batch",
    "load_loader_state",
    "save_loader_state",
]

LOADER_STATE_FILE = "wdstream_loader_state.json"


def _state_file(checkpoint: str, rank: int | None) -> str:
    """The state file in ``checkpoint``: one for all ranks (``rank`` None), or one rank's."""
    name = (
        LOADER_STATE_FILE
        if rank is None
        else LOADER_STATE_FILE.replace(".json", f".rank{rank}.json")
    )
    return os.path.join(checkpoint, name)


def save_loader_state(state: dict[str, Any], checkpoint: str, rank: int) -> str | None:
    """Write ``state`` into the checkpoint folder as JSON (atomically: a temporary file renamed).

    A state that is the same on every rank (the global order) is written once, by rank 0, to
    ``wdstream_loader_state.json``; a per-rank state (``order="streams"``) by every rank to
    ``wdstream_loader_state.rank{R}.json``.

    Returns:
        The file written, or None (a rank other than 0 with a shared state).
    """
    shared = not per_rank_state(state)
    if shared and rank != 0:
        return None
    path = _state_file(checkpoint, None if shared else rank)
    os.makedirs(checkpoint, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.replace(tmp, path)
    return path


def load_loader_state(checkpoint: str, rank: int) -> dict[str, Any]:
    """The loader state saved in ``checkpoint`` for ``rank``: its own file, else the shared one.

    Raises:
        FileNotFoundError: neither file exists (the checkpoint was not saved by a
            ``WdstreamTrainer``, or the run stopped between the ``Trainer``'s save and ours:
            resume from the checkpoint before it).
        StateMismatchError: (a ValueError) the file is not a JSON object of finite values
            (not UTF-8, not JSON, null, a number, NaN, nested too deep), naming it.
    """
    for path in (_state_file(checkpoint, rank), _state_file(checkpoint, None)):
        if os.path.exists(path):
            with open(path, "rb") as f:
                return parse_state(f.read(), path)
    raise FileNotFoundError(
        f"{checkpoint}: no {LOADER_STATE_FILE} (nor one for rank {rank}): this checkpoint holds "
        "no wdstream loader state; resume from a checkpoint a WdstreamTrainer saved"
    )


def causal_lm_batch(batch: Batch) -> Batch:
    """The loader's batch for a transformers causal LM: ``shift_labels`` the loader's targets,
    ``labels`` the same targets one position later (``-100`` first), as such a model expects."""
    labels = batch["labels"]
    hf_labels = torch.full_like(labels, -100)
    hf_labels[:, 1:] = labels[:, :-1]
    return {**batch, "labels": hf_labels, "shift_labels": labels}


class _SaveLoaderState(_transformers.TrainerCallback):  # type: ignore[name-defined]
    """Writes the tracked loader state into each checkpoint folder the Trainer has just saved."""

    def __init__(self, batches: TrackedBatches) -> None:
        self.batches = batches

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = f"{_trainer_utils.PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        save_loader_state(self.batches.state_dict(), os.path.join(args.output_dir, folder),
                          self.batches.loader.rank)  # fmt: skip


class WdstreamTrainer(_transformers.Trainer):  # type: ignore[name-defined]
    """A ``transformers.Trainer`` that trains on a :class:`~wdstream.Loader` and resumes it exactly.

    Args:
        *args: as for ``Trainer`` (no ``train_dataset``: the loader replaces it).
        loader: the training batches.
        shift_labels: pass the loader's targets as ``shift_labels`` for a transformers causal
            LM (module docstring); False: batches exactly as the loader yields them, for a
            model whose ``labels`` are the targets of the same positions.
        **kwargs: as for ``Trainer``.

    Raises:
        ValueError: ``args.max_steps`` is not set, or a ``train_dataset`` is given.
    """

    def __init__(
        self, *args: Any, loader: Loader, shift_labels: bool = True, **kwargs: Any
    ) -> None:
        if kwargs.get("train_dataset") is not None:
            raise ValueError(
                "WdstreamTrainer: pass loader=, not train_dataset= (the loader replaces it)"
            )
        super().__init__(*args, **kwargs)
        if self.args.max_steps <= 0:
            raise ValueError(
                "WdstreamTrainer: set TrainingArguments(max_steps=N): the loader's batches are "
                f"counted in optimizer steps, not Trainer epochs (got max_steps={self.args.max_steps})"
            )
        # The Trainer would replay the batches of the steps already done; the loader seeks.
        self.args.ignore_data_skip = True
        self.batches = TrackedBatches(loader, causal_lm_batch if shift_labels else None)
        self.add_callback(_SaveLoaderState(self.batches))

    @property
    def loader(self) -> Loader:
        return self.batches.loader

    def get_train_dataloader(self) -> Any:
        """The loader's batches, not wrapped in a ``DataLoader`` (see the module docstring)."""
        return self.batches

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        self.batches.mark_trained()  # this batch counts as trained in the next checkpoint
        return super().training_step(model, inputs, *args, **kwargs)

    def train(
        self, resume_from_checkpoint: str | os.PathLike[str] | bool | None = None, **kwargs: Any
    ) -> Any:
        """``Trainer.train``; resuming, the loader first continues from the checkpoint's state.

        Raises:
            FileNotFoundError: the checkpoint has no loader state (:func:`load_loader_state`).
            wdstream.StateMismatchError: the state belongs to another dataset or configuration.
        """
        checkpoint: str | None = None
        if resume_from_checkpoint is True:
            checkpoint = _trainer_utils.get_last_checkpoint(self.args.output_dir)
            if checkpoint is None:
                raise ValueError(
                    f"No valid checkpoint found in output directory ({self.args.output_dir})"
                )
        elif resume_from_checkpoint:  # a path (False and None: no resume)
            checkpoint = os.fspath(resume_from_checkpoint)
        if checkpoint is not None:
            self.batches.load_state_dict(load_loader_state(checkpoint, self.loader.rank))
        return super().train(resume_from_checkpoint=checkpoint, **kwargs)
