"""Hostile saved states: one field of a packed or raw-text cursor replaced or moved; an
accepted state must continue the uninterrupted run."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from faultlib.common import READ, Attempt, clean_dataset, corpus_lines
from wdstream import Loader, TokenDataset, WdstreamError

# ---------------------------------------------------------------- hostile cursors


def _mutations(rng: np.random.Generator) -> object:
    choices: list[object] = [
        -1, 0, 1, 2, 3, 10**9, 2**70, -(2**70), 1.5, float("inf"), float("nan"), True, None,
        "0", "", [], {}, [0, 1], {"epoch": 0},
    ]  # fmt: skip
    return choices[int(rng.integers(len(choices)))]


def _paths(obj: object, prefix: tuple = ()) -> Iterator[tuple]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _mutated(state: dict, rng: np.random.Generator) -> dict:
    """``state`` with one field (at any depth) replaced by a hostile value; the edit is
    named under the key ``_edit`` (taken out before loading)."""
    paths = list(_paths(state))
    path = paths[int(rng.integers(len(paths)))]
    bad = copy.deepcopy(state)
    target = bad
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _mutations(rng)
    bad["_edit"] = f"{'.'.join(map(str, path))} = {str(target[path[-1]])[:40]}"
    return bad


def _run_batches(make: Callable[[], Loader], n: int) -> list[np.ndarray]:
    """The first ``n`` batches' ``input_ids`` of an uninterrupted run."""
    it = iter(make())
    return [next(it)["input_ids"].numpy().copy() for _ in range(n)]


def landing(got: list[np.ndarray], run: list[np.ndarray]) -> int | None:
    """The step of the uninterrupted ``run`` from which ``got`` follows it exactly, or None."""
    for k in range(len(run) - len(got) + 1):
        if all(np.array_equal(g, run[k + j]) for j, g in enumerate(got)):
            return k
    return None


def resumed_outcome(
    make: Callable[[], Loader],
    bad: dict,
    run: list[np.ndarray],
    far: Callable[[dict], list[np.ndarray]] | None = None,
) -> str:
    """Load ``bad`` into a fresh loader: refused (clear error), or its next batches must be
    the uninterrupted run's from some step (handled, saying which), else silent wrong.

    ``run`` is the uninterrupted run recorded once, never anything computed from ``bad``.
    ``far(said)`` gives the uninterrupted run's 4 batches at the position an accepted state
    says it is at, when that lies past the recording, from a reader that never saw ``bad``
    (random access for the global order, iteration from the epoch's start for streams).
    """
    bad = dict(bad)
    edit = bad.pop("_edit", "")
    ld = make()
    try:
        ld.load_state_dict(json.loads(json.dumps(bad)))
        said = ld.state_dict()
        it = iter(ld)
        got = [next(it)["input_ids"].numpy() for _ in range(4)]
    except WdstreamError as exc:
        return "clear error" if str(exc) else "crash"
    k = landing(got, run)
    if k is not None:
        return f"handled: lands at step {k} of the uninterrupted run"
    want = far(said) if far is not None else None
    if want is not None and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)):
        return "handled: lands past the recording, where the uninterrupted run is"
    return f"silent wrong: {edit or 'an edit'} accepted, and the next batches are no run's"


def _cursor_attempts(root: str, order: str, n: int, seed: int) -> Iterator[Attempt]:
    """A state taken after 5 batches, one field replaced by a hostile JSON value.

    Oracle: the uninterrupted run, 4 epochs recorded once; an accepted state must continue
    it from some step (past the recording: see :func:`resumed_outcome`).
    """
    opts = {**READ, "epochs": None, "order": order}

    def make() -> Loader:
        return Loader(root, **opts)

    loader = make()
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    per_epoch = len(loader)
    run = _run_batches(make, 4 * per_epoch + 10)
    clean = make()

    def far(said: dict) -> list[np.ndarray]:
        if order == "global":
            return [clean.batch_at(said["step"] + j)["input_ids"].numpy() for j in range(4)]
        c = said["streams"][0]  # one stream: the run's batch c["batches"] of epoch c["epoch"]
        ds = TokenDataset(root, READ["seq_len"], READ["batch_size"], order="streams",
                          shuffle=True, seed=READ["seed"], epochs=1)  # fmt: skip
        ds.set_epoch(c["epoch"])
        rows = [b["input_ids"].numpy() for b, _ in zip(ds, range(c["batches"] + 4), strict=False)]
        return rows[c["batches"] :]

    rng = np.random.default_rng(seed)
    for _ in range(n):
        bad = _mutated(state, rng)

        def attempt(bad: dict = bad) -> str:
            return resumed_outcome(make, bad, run, far)

        yield attempt


def cursors(work: Path, scale: float) -> Iterator[Attempt]:
    root, _ = clean_dataset(work)
    n = max(1, int(100 * scale))
    yield from _cursor_attempts(root, "global", n, 11)
    yield from _cursor_attempts(root, "streams", n, 12)


# ---------------------------------------------------------------- trust at the edges (issue 23)


def _text_parts(work: Path) -> str:
    """Four JSONL files of raw text (the issue's ``parts/p*.jsonl``)."""
    d = work / "parts"
    if not d.exists():
        d.mkdir()
        lines = corpus_lines(240)
        for i in range(4):
            (d / f"p{i}.jsonl").write_text("\n".join(lines[i * 60 : (i + 1) * 60]) + "\n")
    return str(d)


def text_cursors(work: Path, scale: float) -> Iterator[Attempt]:
    """Every field of both raw-text cursors moved by -2, -1, +1, +2, then hostile values."""
    parts = _text_parts(work)

    def make() -> Loader:
        return Loader(f"{parts}/p*.jsonl", tokenizer="cl100k_base", seq_len=32, batch_size=4,
                      streams=2, shuffle_window=8, num_workers=0, seed=0)  # fmt: skip

    loader = make()
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    run = _run_batches(make, 60)
    edits: list[dict] = []
    for t in range(2):
        for key in state["streams"][t]:
            if key == "check":
                continue
            for delta in (-2, -1, 1, 2):
                bad = copy.deepcopy(state)
                bad["streams"][t][key] += delta
                bad["_edit"] = f"streams.{t}.{key} {delta:+d}"
                edits.append(bad)
    rng = np.random.default_rng(13)
    edits += [_mutated(state, rng) for _ in range(max(1, int(40 * scale)))]
    for bad in edits:

        def attempt(bad: dict = bad) -> str:
            return resumed_outcome(make, bad, run)

        yield attempt
