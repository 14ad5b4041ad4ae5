"""Which global steps ``explain`` is asked about, and under which order.

A :class:`StepQuery` holds the Loader options that ordered a run's rows, or a saved Loader
state to take them from; :func:`checked_steps` turns the steps a user names into the data
steps whose rows are explained. A step is a *training* step (batches handed out, as a loss
log counts them); after ``Loader.skip_steps`` the state records the skips and training step
``t`` reads data step ``t + sum(n for skips at or before t)``::

    state["skips"] == [[100, 50]]      # at training step 100, 50 data steps were skipped
    checked_steps([99, 100], origin, 8, position.data_step)  ->  [(99, 99), (100, 150)]

Without skips (or without a state) the two are the same number.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from wdstream.errors import StateMismatchError
from wdstream.read.order.global_order import GlobalOrder, OrderConfig, Origin
from wdstream.read.order.step_check import check_step
from wdstream.read.sources.packed import ShardSource

__all__ = ["StepQuery", "checked_steps", "order_and_position", "state_order_config"]


def state_order_config(state: Any) -> OrderConfig:
    """The order parameters a saved global-order (or mixture) Loader state was taken with."""
    try:
        c = state["config"]
        return OrderConfig(
            seq_len=int(c["seq_len"]), global_batch=int(c["global_batch"]),
            shuffle=bool(c["shuffle"]), seed=int(c["seed"]),
            shuffle_window=int(c["shuffle_window"]), shuffle_lanes=int(c["shuffle_lanes"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise StateMismatchError(f"not a global-order Loader state (config: {exc!r})") from exc


@dataclass(frozen=True)
class StepQuery:
    """Which global steps' rows :func:`~wdstream.read.provenance.explain` (and
    ``explain_mixture``) is asked about: the Loader options that ordered them, or a saved
    state to take them from (see :func:`~wdstream.read.provenance.explain` for each field)."""

    batch_size: int | None = None
    world_size: int = 1
    seq_len: int | None = None
    seed: int | None = None
    shuffle: bool = True
    shuffle_window: int = 1024
    shuffle_lanes: int = 8
    state: dict[str, Any] | None = None
    text: bool = False
    tokenizer: str | None = None  # the dataset's tokenizer, where index.json's is not found

    @classmethod
    def of(cls, options: dict[str, Any]) -> tuple[StepQuery, dict[str, Any]]:
        """The query among keyword ``options``, and the rest (store options)."""
        names = set(cls.__dataclass_fields__)
        mine = {k: v for k, v in options.items() if k in names}
        return cls(**mine), {k: v for k, v in options.items() if k not in names}

    def order_config(self, packed_seq_len: int | None) -> tuple[OrderConfig, int]:
        """The order's parameters and the rows per rank (B), from the state or the options
        (``seq_len`` defaults to ``packed_seq_len``).

        Raises:
            ValueError: options that disagree with the state, inconsistent sizes, or no
                ``seq_len`` or ``batch_size`` to go by.
            StateMismatchError: a state that is not a global-order or mixture state.
        """
        world_size, batch_size = self.world_size, self.batch_size
        if self.state is not None:
            cfg = state_order_config(self.state)
            given = {"seq_len": self.seq_len, "seed": self.seed}
            clash = [f"{k} {v} (state: {getattr(cfg, k)})" for k, v in given.items()
                     if v is not None and v != getattr(cfg, k)]  # fmt: skip
            if clash:
                raise ValueError(f"options disagree with the state: {', '.join(clash)}")
            if batch_size is None:
                batch_size = cfg.global_batch // world_size
            if world_size * batch_size != cfg.global_batch:
                raise ValueError(
                    f"world_size x batch_size = {world_size} x {batch_size} is not the state's "
                    f"global batch {cfg.global_batch}"
                )
        else:
            seq_len = self.seq_len if self.seq_len is not None else packed_seq_len
            if seq_len is None:
                raise ValueError(
                    "seq_len is needed: no one packed length to default to (a docs-mode "
                    "dataset, or sources packed at different lengths)"
                )
            if batch_size is None:
                raise ValueError("batch_size is needed (or a state to take the global batch from)")
            cfg = OrderConfig(seq_len, world_size * batch_size, self.shuffle, self.seed or 0,
                              self.shuffle_window, self.shuffle_lanes)  # fmt: skip
        if world_size < 1 or batch_size < 1:
            raise ValueError(
                f"world_size and batch_size must be >= 1, got {world_size}, {batch_size}"
            )
        return cfg, batch_size


def checked_steps(
    steps: Iterable[Any],
    origin: Origin,
    global_batch: int,
    data_step: Callable[[int], int] | None = None,
) -> Iterable[tuple[int, int]]:
    """``(training step, data step)`` of each of ``steps``, every data step checked with
    :func:`check_step` before any row is read (so a range fails whole, before output); a
    ``range`` is checked at its ends and mapped lazily.

    Args:
        steps: training steps, as the run counts them (from the state's origin).
        origin: where the run counts steps from.
        global_batch: rows per step.
        data_step: a saved state's mapping of training to data steps (its skips); None:
            the same number.

    Raises:
        TypeError: a step that is not an integer.
        ValueError: a data step the run never reaches; with skips, the message names the
            training step and the data step it maps to.
    """
    if isinstance(steps, range) and steps.step > 0 and steps.stop - steps.start > 2 * steps.step:
        # Data steps never decrease with training steps (skips only move them on), and the
        # check is a bound: the ends decide for the whole range, which is then mapped as it
        # is read (a range of millions of steps starts printing at once).
        checked_steps([steps[0], steps[-1]], origin, global_batch, data_step)
        return ((t, t if data_step is None else data_step(t)) for t in steps)
    out = []
    for t in steps:
        integral = isinstance(t, numbers.Integral) and not isinstance(t, bool)
        d = data_step(int(t)) if data_step is not None and integral else t
        try:
            d = check_step(d, origin.step, origin.row, global_batch)
        except ValueError as exc:
            if d == t:
                raise
            raise ValueError(
                f"training step {t} reads data step {d} under the state's skips: {exc}"
            ) from exc
        out.append((int(t), d))
    return out


def order_and_position(
    source: ShardSource, state: Any, cfg: OrderConfig
) -> tuple[GlobalOrder, Origin, Callable[[int], int] | None]:
    """The order of ``cfg``; with a saved state, the origin that run counts steps from and
    its mapping of training to data steps (its skips)."""
    if state is None:
        return GlobalOrder(source, cfg), Origin(), None
    from wdstream.read.order.global_sequence import GlobalReader  # torch: only for a state

    reader = GlobalReader(source, cfg, 0, cfg.global_batch, 1, False)
    position = reader.position_of(state)  # checks dataset, seed, ...
    return reader.order, position.origin, position.data_step
