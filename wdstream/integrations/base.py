"""What every trainer integration shares: the framework's import, and the loader state after
the last batch that was *trained on*, which is not always the last batch drawn.

Trainers draw batches ahead of training them: Lightning's fetcher keeps one batch in hand when
the loader has no length, HF ``Trainer`` fetches a whole gradient-accumulation group before the
first forward. ``Loader.state_dict()`` is the position after the last batch *handed out*, so a
checkpoint taken from it would skip the batches drawn but not yet trained. :class:`TrackedBatches`
keeps the state after each drawn batch in a queue; the trainer's per-batch hook calls
:meth:`TrackedBatches.mark_trained` as a batch goes to the model, and
:meth:`TrackedBatches.state_dict` is the state to checkpoint::

    drawn:    b5  b6  b7          (queue: state after b5, after b6, after b7)
    trained:  b5                  mark_trained() -> state_dict() == state after b5
    saved:    state after b5      resume: b6, b7, ... exactly, nothing skipped or replayed
"""

from __future__ import annotations

import importlib
import json
from collections import deque
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from wdstream.errors import StateMismatchError

if TYPE_CHECKING:
    from wdstream.read.torch.loader import Loader

__all__ = ["MAX_STATE_DEPTH", "TrackedBatches", "parse_state", "per_rank_state", "require"]

Batch = dict[str, Any]
MAX_STATE_DEPTH = 32  # a loader state nests a few levels (config, streams, skips)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON value (a loader state holds finite numbers)")


def parse_state(raw: bytes, where: str) -> dict[str, Any]:
    """The loader state in ``raw``, a checkpoint's JSON bytes named ``where`` (a file, a
    DCP key): a JSON object of finite values nested at most :data:`MAX_STATE_DEPTH` deep.
    Whether it fits the loader is the loader's to check (``load_state_dict``).

    Raises:
        StateMismatchError: (a ValueError) not UTF-8, not JSON, NaN or Infinity, nested too
            deep, or not an object; naming ``where``.
    """

    def refuse(why: str, line: int | None = None) -> StateMismatchError:
        at = f"{where}:{line}" if line is not None else where
        return StateMismatchError(f"{at}: not a JSON loader state: {why}")

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise refuse(f"not UTF-8 text (byte {e.start})") from None
    if _depth(text) > MAX_STATE_DEPTH:  # before json, which would recurse into it
        raise refuse(f"JSON nested more than {MAX_STATE_DEPTH} levels deep")
    try:
        state = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:  # JSONDecodeError, NaN / Infinity
        if isinstance(e, json.JSONDecodeError):
            raise refuse(e.msg, e.lineno) from None
        raise refuse(str(e)) from None
    if not isinstance(state, dict):
        raise refuse(f"a JSON {type(state).__name__}, not an object")
    return state


def _depth(text: str) -> int:
    """The deepest nesting of brackets in JSON ``text`` (strings skipped), counted without
    recursion: a bound checked before ``json.loads``, whose recursion a 60 KB run of ``[``
    exhausts."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def require(module: str, integration: str, install: str) -> ModuleType:
    """Import ``module`` for ``integration``, or raise one clear line saying what to install.

    Raises:
        ImportError: ``module`` is not installed (``from None``: no second traceback).
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"{integration} needs {module.split('.')[0]}, which is not installed: "
            f"pip install '{install}'"
        ) from None


def per_rank_state(state: dict[str, Any]) -> bool:
    """Whether a loader state belongs to one rank (per-rank streams and raw text: their config
    names the rank) rather than being the same on every rank (the global order, mixtures,
    ``max_tokens`` batches), so a checkpoint must keep one state per rank."""
    config = state.get("config")
    return isinstance(config, dict) and "rank" in config


class TrackedBatches:
    """The loader's batches, with the state after each one kept until it is trained on.

    Its ``state_dict`` is the state after the last batch trained, never one taken while the
    trainer had drawn ahead; so Lightning, which saves and restores a train loader that has
    ``state_dict``/``load_state_dict`` on its own, saves the same state (restoring it twice does
    no harm) and does not warn that the loader cannot resume mid-epoch.

    Args:
        loader: the :class:`~wdstream.Loader` to iterate.
        transform: applied to each batch as it is handed to the trainer (after its state is
            taken), e.g. renaming keys for a model.
    """

    def __init__(self, loader: Loader, transform: Callable[[Batch], Batch] | None = None) -> None:
        self.loader = loader
        self.transform = transform
        self._drawn: deque[dict[str, Any]] = deque()  # states after drawn, untrained batches
        self._trained: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[Batch]:
        if self._drawn:
            # The last iterator drew batches that were never trained on: the loader's position
            # is past them, so go back to the last trained batch and draw them again.
            assert self._trained is not None
            self.loader.load_state_dict(self._trained)
            self._drawn.clear()
        self._trained = self.loader.state_dict()
        for batch in self.loader:
            self._drawn.append(self.loader.state_dict())
            yield batch if self.transform is None else self.transform(batch)

    @property
    def waiting(self) -> int:
        """Batches drawn and not yet marked trained."""
        return len(self._drawn)

    def mark_trained(self) -> None:
        """The oldest drawn batch not yet marked goes to the model now.

        Raises:
            RuntimeError: no batch is waiting (a hook called once too often).
        """
        if not self._drawn:
            raise RuntimeError(
                "mark_trained: no batch was drawn from the loader since the last one"
            )
        self._trained = self._drawn.popleft()

    def state_dict(self) -> dict[str, Any]:
        """The loader state after the last batch marked trained (before any: the loader's)."""
        return self.loader.state_dict() if self._trained is None else self._trained

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the batch at which ``state`` was taken (``Loader.load_state_dict``)."""
        self.loader.load_state_dict(state)
        self._drawn.clear()
        self._trained = state
