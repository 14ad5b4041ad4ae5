"""Hostile states against the fields that name the data and count the run: the dataset's
content identity (``config.dataset``), ``skips``, ``quarantined``, ``order_version`` and
``next_rows``; each edit tried with the state's seal (``check``) kept and removed.

Outcome: a ``StateMismatchError`` naming the edited key (clear error), or a state that
continues exactly as the uninterrupted run does: its next batches are the run's (recorded
once with ``batch_at`` of a loader that never saw the edit) and, for the global order, its
training steps map to the same data steps (``data_step``) as the uninterrupted run's, which
took the same history (5 batches, 2 steps skipped, 3 batches).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from faultlib.common import READ, Attempt, clean_dataset
from faultlib.cursors import landing
from wdstream import Loader, StateMismatchError, WdstreamError

_HEXES = ("digest", "keys", "set", "slices")


def _hex_edits(value: str) -> list[object]:
    flipped = value[:-1] + ("0" if value[-1] != "0" else "1")
    return [flipped, value[:-1], value.upper() if value.upper() != value else value + "A",
            value + "0", int(value[:8], 16), None, ""]  # fmt: skip


def _dataset_edits(ds: dict) -> list[tuple[str, Callable[[dict], None]]]:
    """(label, edit of the state's ``config.dataset``) pairs."""

    def put(key: str, value: object) -> Callable[[dict], None]:
        return lambda s: s["config"]["dataset"].__setitem__(key, value)

    def whole(value: object) -> Callable[[dict], None]:
        return lambda s: s["config"].__setitem__("dataset", copy.deepcopy(value))

    def drop(key: str) -> Callable[[dict], None]:
        return lambda s: s["config"]["dataset"].pop(key)

    n = ds["shards"]
    out = [(f"dataset = {v!r}", whole(v)) for v in (None, "", "0123456789abcdef", 5, [], {})]
    out += [(f"dataset.shards = {v!r}", put("shards", v))
            for v in (0, -1, n - 1, n + 1, 2**63, str(n), float(n), True, None)]  # fmt: skip
    out += [(f"dataset.{k} = {v!r:.24}", put(k, v)) for k in _HEXES for v in _hex_edits(ds[k])]
    out += [(f"dataset.{k} removed", drop(k)) for k in ("shards", *_HEXES)]
    out += [("dataset.x = 1 added", put("x", 1))]
    return out


def _counter_edits() -> list[tuple[str, Callable[[dict], None]]]:
    """(label, edit) pairs of ``skips``, ``quarantined``, ``order_version``, ``next_rows``."""

    def put(key: str, value: object) -> Callable[[dict], None]:
        return lambda s: s.__setitem__(key, copy.deepcopy(value))

    skips = [None, {}, "[[5, 2]]", [], [[5]], [[5, 2, 1]], [[5, 0]], [[5, -1]], [[5, 2.0]],
             [[5, True]], [[-1, 2]], [[4, 2]], [[6, 2]], [[5, 3]], [[5, 1]], [[8, 2]], [[9, 2]],
             [[5, 2], [5, 1]], [[5, 2], [3, 1]], [[2**63, 2]], [[5, 2**62]], [[1, 1], [5, 1]]]  # fmt: skip
    counts = [0, -1, 1.5, True, "3", None, 2**63, 10**30, 1, 4]
    versions = [0, 2, "1", None, True, 1.0, [1]]
    out = [(f"skips = {v!r}", put("skips", v)) for v in skips]
    out += [(f"quarantined = {v!r}", put("quarantined", v)) for v in counts]
    out += [(f"order_version = {v!r}", put("order_version", v)) for v in versions]
    out += [("order_version removed", lambda s: s.pop("order_version"))]
    out += [(f"next_rows = {v!r}", put("next_rows", v)) for v in ("", None, 5)]
    out += [("next_rows: a hex digit changed",
             lambda s: s.__setitem__("next_rows", s["next_rows"][:-1] + ("0" if s["next_rows"][-1] != "0" else "1"))),
            ("next_rows removed", lambda s: s.pop("next_rows"))]  # fmt: skip
    return out


def _key_of(label: str) -> str:
    """The state key an edit's error must name (``config.dataset``, ``skips``, ...) from
    its label (``ORDER: KEY ...``)."""
    head = label.split(": ", 1)[1].split(" ")[0].split(".")[0].rstrip(":")
    return "config.dataset" if head == "dataset" else head


def _outcome(make: Callable[[], Loader], bad: dict, label: str, run: list[np.ndarray],
             start: int, mapping: dict[int, int] | None) -> str:  # fmt: skip
    ld = make()
    try:
        ld.load_state_dict(json.loads(json.dumps(bad)))
        it = iter(ld)
        got = [next(it)["input_ids"].numpy() for _ in range(4)]
    except StateMismatchError as exc:
        key = _key_of(label)
        return (
            "clear error"
            if key in str(exc)
            else f"crash: {label}: the error names not {key}: {exc}"[:300]
        )
    except WdstreamError as exc:
        return f"crash: {label}: {type(exc).__name__}, not a StateMismatchError: {exc}"[:300]
    k = landing(got, run)
    if k is None:
        return f"silent wrong: {label} accepted, and the next batches are no run's"
    if mapping is not None:
        moved = {t: ld.data_step(t) for t in mapping if ld.data_step(t) != mapping[t]}
        if moved:
            t = min(moved)
            return (
                f"silent wrong: {label} accepted; training step {t} maps to data step "
                f"{moved[t]}, the uninterrupted run's to {mapping[t]}"
            )
    return "handled" if k == start else f"handled: {label} accepted, lands at step {k}"


def _state(root: str, order: str) -> tuple[Callable[[], Loader], dict, Loader]:
    """A loader factory, its state after 5 batches, 2 skipped steps (global order) and 3
    batches, with ``quarantined: 3`` (a count of rows masked) and its seal, and the loader."""
    opts = {**READ, "epochs": None, "order": order}

    def make() -> Loader:
        return Loader(root, **opts)

    ld = make()
    for n in (5, 3):
        it = iter(ld)
        for _ in range(n):
            next(it)
        it.close()
        if order == "global" and n == 5:
            ld.skip_steps(2)
    state = json.loads(json.dumps(ld.state_dict()))
    if order == "global":
        # As a run that masked 3 rows saves it: the count, and the check covering it.
        from wdstream.read.order.global_seal import SEAL_KEY, seal

        state["quarantined"] = 3
        state[SEAL_KEY] = seal(state)
    return make, state, ld


def hostile_states(work: Path, scale: float) -> Iterator[Attempt]:
    """See the module docstring: global order (every edit), streams order (dataset edits)."""
    root, _ = clean_dataset(work)
    for order in ("global", "streams"):
        make, state, ref = _state(root, order)
        if order == "global":
            clean = make()
            run = [clean.batch_at(k)["input_ids"].numpy() for k in range(40)]
            start, mapping = 10, {t: ref.data_step(t) for t in range(14)}
            edits = _dataset_edits(state["config"]["dataset"]) + _counter_edits()
        else:
            it = iter(make())
            run = [next(it)["input_ids"].numpy() for _ in range(40)]
            start, mapping = 8, None
            edits = _dataset_edits(state["config"]["dataset"])
        for label, edit in edits:
            for sealed in (True, False):
                bad = copy.deepcopy(state)
                edit(bad)
                if not sealed:
                    bad.pop("check", None)
                tag = f"{order}: {label}{'' if sealed else ' (unsealed)'}"

                def attempt(bad: dict = bad, tag: str = tag, make: Callable = make, run: list = run,
                            start: int = start, mapping: dict | None = mapping) -> str:  # fmt: skip
                    return _outcome(make, bad, tag, run, start, mapping)

                yield attempt
