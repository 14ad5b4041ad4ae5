"""A mixture's resume state: its format and the checks that refuse a broken or foreign one.

::

    {"version": 1, "order": "mixture",
     "config": {"sources": [["web", {<dataset>}], ["code", {<dataset>}]], "seed": 0,
                "seq_len": 2048, "shuffle": true, "shuffle_window": 1024,
                "shuffle_lanes": 8, "global_batch": 64, "stop": null},
     "step": 41210, "origin": {"step": 0, "row": 0},
     "schedule": [[0, 0, [3, 2]], [30000, 1920000, [1, 4]]],
     "iter_stop": null, "worker": null, "order_version": [1, 1], "next_rows": "<16 hex>",
     "check": "<48 hex>"}

``schedule`` holds the pieces begun before ``step``: ``[step, first row, integer weights]``
(weights are exact: ``[3, 2]`` is 3/5 and 2/5). Nothing depends on the rank, world size or
workers; ``global_batch`` may differ when loaded (the run continues from the same row).
``skips`` (``[[training step, n], ...]``, only once steps were skipped) maps training steps
to data steps (``Loader.skip_steps``); ``quarantined`` (only once rows were masked,
``on_corrupt="mask"``) counts the rows the saving rank masked. ``order_version`` (the interleave's and the sources' order versions) and ``next_rows`` (the
pieces of each source's next row) are checked by the reader (:mod:`~wdstream.read.order.identity`);
states saved before they existed lack them and load unchecked. ``check`` (``seal.py``) tags
every placing field, ``skips`` and ``quarantined``; a state without it (saved before issue
33, or with its check removed) is refused.
Every refusal is a :class:`StateMismatchError` naming the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wdstream.errors import StateMismatchError
from wdstream.read.mixture.interleave import exact_weights
from wdstream.read.mixture.schedule import SchedulePiece
from wdstream.read.mixture.seal import check_mixture_seal, refuse_unsealed_mixture
from wdstream.read.order.global_order import Origin
from wdstream.read.order.identity import IDENTITY_KEYS
from wdstream.read.order.state_fields import SEAL_KEY, dict_field, int_field, mismatch, same_value
from wdstream.read.order.steps import GlobalPosition, parse_skips
from wdstream.read.sources.base import Source

__all__ = ["MIXTURE_STATE_VERSION", "MixturePosition", "SavedMixture", "parse_mixture_state"]


@dataclass
class MixturePosition(GlobalPosition):
    """A global position plus the schedule pieces it is read under (the pieces travel with
    the position, so workers and resumed runs use the schedule the state holds)."""

    pieces: tuple[SchedulePiece, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(),
                "pieces": [[p.step, p.row, list(p.weights)] for p in self.pieces]}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MixturePosition:
        worker = tuple(d["worker"]) if d["worker"] is not None else None
        pieces = tuple(SchedulePiece(s, r, tuple(w)) for s, r, w in d["pieces"])
        return cls(d["step"], Origin(*d["origin"]), d["iter_stop"], worker, pieces=pieces,
                   first_made=d["first_made"])  # fmt: skip


MIXTURE_STATE_VERSION = 1
_KEYS = ("version", "order", "config", "step", "origin", "schedule", "iter_stop", "worker")


@dataclass(frozen=True)
class SavedMixture:
    """What a checked mixture state says."""

    step: int
    origin: Origin
    pieces: tuple[SchedulePiece, ...]
    iter_stop: int | None
    worker: tuple[int, int] | None
    global_batch: int
    skips: tuple[tuple[int, int], ...]
    quarantined: int  # rows masked so far (0 when the state has no "quarantined")


def _config(saved: Any, mine: dict[str, Any], sources: Sequence[Source]) -> int:
    """Compare the config (all but ``global_batch``); return the saved global batch."""
    saved = dict_field("config", saved, list(mine))
    names = [name for name, _ in mine["sources"]]
    wrong = _source_diff(saved["sources"], names)
    if wrong:
        raise StateMismatchError(f"config.sources: the state belongs to other sources: {wrong}")
    for j, (name, source) in enumerate(zip(names, sources, strict=True)):
        at = f"config.sources[{j}][1] (source {name!r})"
        source.identity.check(at, saved["sources"][j][1], source.where)
    diff = [k for k in mine if k not in ("sources", "global_batch")
            and not same_value(saved[k], mine[k])]  # fmt: skip
    if diff:
        what = ", ".join(f"{k}: saved {saved[k]!r}, now {mine[k]!r}" for k in diff)
        raise StateMismatchError(f"config: state does not belong to this mixture ({what})")
    return int_field("config.global_batch", saved["global_batch"], lo=1)


def _source_diff(saved: Any, names: list[str]) -> str:
    """How the saved ``[name, dataset]`` list differs from ``names`` in its names; "" if not."""
    if not isinstance(saved, list):
        return "the saved value is not a list"
    for j, name in enumerate(names):
        if j >= len(saved) or not isinstance(saved[j], list) or len(saved[j]) != 2:
            return f"source {j} ({name!r}) is not in the state"
        if saved[j][0] != name:
            return f"source {j} is {saved[j][0]!r} in the state, {name!r} now"
    if len(saved) != len(names):
        return f"the state has {len(saved)} sources, this loader {len(names)}"
    return ""


def _pieces(value: Any, k: int, step: int) -> tuple[SchedulePiece, ...]:
    if not isinstance(value, list):
        raise mismatch("schedule", value, "a list of [step, row, weights] expected")
    out: list[SchedulePiece] = []
    for j, p in enumerate(value):
        at = f"schedule[{j}]"
        if not isinstance(p, list) or len(p) != 3 or not isinstance(p[2], list):
            raise mismatch(at, p, "[step, row, [integer weights]] expected")
        s = int_field(f"{at}[0]", p[0], hi=max(step, 1))
        r = int_field(f"{at}[1]", p[1])
        if len(p[2]) != k:
            raise mismatch(f"{at}[2]", p[2], f"{k} weights expected (one per source)")
        w = tuple(int_field(f"{at}[2][{i}]", x) for i, x in enumerate(p[2]))
        try:
            exact = exact_weights(w, [str(i) for i in range(k)])
        except ValueError as exc:
            raise mismatch(f"{at}[2]", p[2], str(exc)) from None
        if exact != w:
            raise mismatch(f"{at}[2]", p[2], f"weights in lowest terms expected ({list(exact)})")
        if (not out and (s, r) != (0, 0)) or (out and (s <= out[-1].step or r <= out[-1].row)):
            raise mismatch(at, p, "pieces start at step 0, row 0 and increase")
        out.append(SchedulePiece(s, r, w))
    if step > 0 and not out:
        raise mismatch("schedule", value, f"the pieces before step {step} are missing")
    return tuple(out)


def parse_mixture_state(
    state: Any, config: dict[str, Any], sources: Sequence[Source]
) -> SavedMixture:
    """Check ``state`` against a mixture reader's ``config`` and its ``sources`` (whose data
    each saved ``[name, dataset]`` must name, by content: ``sources/identity.py``).

    Raises:
        StateMismatchError: naming the key for a state of another kind, other sources or
            settings, or with a malformed or inconsistent field.
    """
    if isinstance(state, dict) and state.get("order") in ("global", None):
        raise StateMismatchError(
            "order: the state is of one dataset (order "
            f"{state.get('order', 'streams')!r}); this loader reads a mixture: resume it "
            "with the Loader of that dataset"
        )
    named = isinstance(state, dict) and any(k in state for k in IDENTITY_KEYS)
    skipped = isinstance(state, dict) and "skips" in state
    counted = isinstance(state, dict) and "quarantined" in state
    sealed = isinstance(state, dict) and SEAL_KEY in state
    extra = (*(IDENTITY_KEYS if named else ()), *(("skips",) if skipped else ()),
             *(("quarantined",) if counted else ()), *((SEAL_KEY,) if sealed else ()))  # fmt: skip
    state = dict_field("", state, (*_KEYS, *extra))
    if not same_value(state["version"], MIXTURE_STATE_VERSION) or state["order"] != "mixture":
        raise mismatch("version", state["version"], "a mixture state (version 1) expected")
    k = len(sources)
    g = _config(state["config"], config, sources)
    raw = dict_field("origin", state["origin"], ("step", "row"))
    origin = Origin(int_field("origin.step", raw["step"]), 0, int_field("origin.row", raw["row"]))
    step = int_field("step", state["step"], lo=origin.step)
    pieces = _pieces(state["schedule"], k, step)
    for j, p in enumerate(pieces):
        if p.step >= origin.step and p.row != origin.row + (p.step - origin.step) * g:
            raise mismatch(f"schedule[{j}][1]", p.row,
                           f"step {p.step} begins at row "
                           f"{origin.row + (p.step - origin.step) * g}")  # fmt: skip
    if pieces and origin.step > 0 and pieces[0].row > origin.row:
        raise mismatch("origin.row", origin.row, "before the first piece")
    stop = state["iter_stop"]
    if stop is not None:
        stop = int_field("iter_stop", stop, lo=step)
    if (stop is None) != (config["stop"] is None) and stop is not None:
        raise mismatch("iter_stop", stop, "a mixture without a stop rule has no iteration end")
    worker = state["worker"]
    if worker is not None:
        if not isinstance(worker, list) or len(worker) != 2:
            raise mismatch("worker", worker, "None or [worker id, num_workers] expected")
        n = int_field("worker[1]", worker[1], lo=1, hi=1 << 16)
        worker = (int_field("worker[0]", worker[0], hi=n), n)
    skips = parse_skips(state["skips"], step) if skipped else ()
    masked = int_field("quarantined", state["quarantined"], lo=1) if counted else 0
    if sealed:
        check_mixture_seal(state)
    else:
        refuse_unsealed_mixture(state)
    return SavedMixture(step, origin, pieces, stop, worker, g, skips, masked)
