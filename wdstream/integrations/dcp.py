"""``torch.distributed.checkpoint`` (DCP) with a :class:`~wdstream.Loader`: a ``Stateful``
whose state is the loader's JSON as a ``uint8`` tensor, which DCP stores like any tensor
(DCP would pickle a ``str`` or ``dict`` leaf; a tensor it writes as raw bytes).

::

    state = {"app": AppState(model, optimizer), "data": LoaderState(loader)}
    dcp.save(state, checkpoint_id="ckpt/step-1000")
    ...                                  # after a restart, the same objects made afresh:
    dcp.load(state, checkpoint_id="ckpt/step-1000")   # the loader continues with the next batch

DCP loads *into* the tensors the ``Stateful`` hands it, so their size must be known before the
checkpoint is read: the JSON is padded with spaces (valid JSON whitespace) to ``capacity``
bytes, the same at save and load (the default, 64 KiB, is 16 times the state of 64 per-rank
streams; a state larger than it is refused at save, naming its size).

A state that is the same on every rank (the global order, the default) is stored once, under
``json``: DCP keeps one copy of a tensor every rank saves under the same name. A per-rank
state (``order="streams"``, raw text) is stored per rank, under ``json_rank{R}``, and loads
only on the same world size (the loader refuses another).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import torch

from wdstream.integrations.base import parse_state, per_rank_state, require

if TYPE_CHECKING:
    from wdstream.read.torch.loader import Loader

_stateful = require(
    "torch.distributed.checkpoint.stateful", "wdstream.integrations.dcp", "torch>=2.1"
)

__all__ = ["DEFAULT_CAPACITY", "LoaderState"]

DEFAULT_CAPACITY = 64 * 1024
_PAD = ord(" ")


class LoaderState(_stateful.Stateful):  # type: ignore[name-defined]
    """A ``torch.distributed.checkpoint`` ``Stateful`` holding a loader's state as JSON bytes.

    Args:
        loader: the loader whose position is saved and restored.
        capacity: bytes of the tensor holding the JSON (the same at save and load).

    Raises:
        ValueError: ``capacity`` < 2.
    """

    def __init__(self, loader: Loader, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be >= 2 bytes, got {capacity}")
        self.loader = loader
        self.capacity = capacity

    def _key(self, state: dict[str, Any]) -> str:
        return f"json_rank{self.loader.rank}" if per_rank_state(state) else "json"

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{"json": uint8 tensor [capacity]}``: the loader state's JSON, space-padded.

        Raises:
            ValueError: the JSON is longer than ``capacity``.
        """
        state = self.loader.state_dict()
        data = json.dumps(state, separators=(",", ":")).encode()
        if len(data) > self.capacity:
            raise ValueError(
                f"LoaderState: the loader state is {len(data)} bytes of JSON, more than "
                f"capacity={self.capacity}; pass a larger capacity (the same when loading)"
            )
        buffer = torch.full((self.capacity,), _PAD, dtype=torch.uint8)
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return {self._key(state): buffer}

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Continue after the batch at which the saved state was taken.

        Raises:
            ValueError: no single state in ``state_dict``.
            wdstream.StateMismatchError: (a ValueError) its bytes are not a JSON object of
                finite values nested at most 32 deep (``parse_state``), naming the key.
            wdstream.StateMismatchError: a state of another dataset or configuration.
        """
        if len(state_dict) != 1:
            raise ValueError(
                f"LoaderState: expected one loader state, got keys {sorted(state_dict)}"
            )
        ((key, tensor),) = state_dict.items()
        raw = tensor.to("cpu", torch.uint8).numpy().tobytes()
        self.loader.load_state_dict(parse_state(raw, f"LoaderState {key}"))
