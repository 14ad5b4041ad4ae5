"""Mixtures: hostile steps for batch_at and schedules, hostile spec files."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from faultlib.common import Attempt
from wdstream import Loader, WdstreamError
from wdstream.testing import write_synthetic_dataset


def _mixture_roots(work: Path) -> tuple[str, str]:
    a, b = work / "mix-a", work / "mix-b"
    if not a.exists():
        write_synthetic_dataset(str(a), n_docs=30, sample_tokens=33, samples_per_shard=9)
        write_synthetic_dataset(str(b), n_docs=20, sample_tokens=33, samples_per_shard=9, seed=1)
    return str(a), str(b)


STEPS: list[object] = [
    -1, 0, 7, 2**40, 2**62 - 1, 2**62, 2**63 - 1, 2**63, -(2**63), 2**64, 10**30, 1.5, True,
    False, "3", None, float("nan"), float("inf"), np.int64(9), np.float64(2.0), [1],
]  # fmt: skip


def _step_outcome(call: Callable[[], dict]) -> tuple[str, object]:
    """``("refused", message)`` for the documented TypeError/ValueError naming the step,
    ``("rows", batch)`` for a batch, or a crash outcome."""
    try:
        return "rows", call()
    except (TypeError, ValueError) as exc:
        if "step" in str(exc):
            return "refused", f"{type(exc).__name__}: {exc}"
        return f"crash: {type(exc).__name__}: {exc}"[:200], None
    except Exception as exc:  # noqa: BLE001 - an OverflowError, IndexError, ... is the finding
        return f"crash: {type(exc).__name__}: {exc}"[:200], None


def mixture_steps(work: Path, scale: float) -> Iterator[Attempt]:
    """``batch_at`` of a mixture and of one dataset at hostile steps: both refuse the same
    step with the same clear error, or both give rows of the data (synthetic tokens are
    consecutive, so a read row is a run of consecutive ids); then schedule steps."""
    a, b = _mixture_roots(work)
    opts = dict(seq_len=32, batch_size=2, num_workers=0)
    for step in STEPS:

        def attempt(step: object = step) -> str:
            one = _step_outcome(lambda: Loader(a, order="global", **opts).batch_at(step))
            mix = _step_outcome(
                lambda: Loader({"a": a, "b": b}, weights={"a": 0.7, "b": 0.3}, **opts).batch_at(
                    step
                )
            )
            for kind, _ in (one, mix):
                if kind.startswith("crash"):
                    return kind
            if one[0] != mix[0]:
                return f"silent wrong: one dataset {one[0]}, mixture {mix[0]} at step {step!r}"
            if one[0] == "refused":
                return "clear error" if one[1] == mix[1] else "silent wrong: different errors"
            rows = [x["input_ids"].numpy() for x in (one[1], mix[1])]  # type: ignore[index]
            ok = all((np.diff(r, axis=1) == 1).all() for r in rows)
            return "handled" if ok else "silent wrong: rows that are no rows of the data"

        yield attempt
    for step in (2**70, 2**63, 2**62, True, 1.5, -5, "9"):

        def schedule(step: object = step) -> str:
            weights = [(0, {"a": 1, "b": 1}), (step, {"a": 1, "b": 0})]
            try:
                ld = Loader({"a": a, "b": b}, weights=weights, **opts)
            except ValueError as exc:
                return "clear error" if "schedule piece 1" in str(exc) else f"crash: {exc}"
            kind, _ = _step_outcome(lambda: next(iter(ld)))
            return "silent wrong: an unreachable piece accepted" if kind == "rows" else kind

        yield schedule


def _spec_texts(a: str, b: str) -> dict[str, str]:
    src = {"a": a, "b": b}
    return {
        "deep.json": "[" * 100_000,
        "deep-weights.json": json.dumps({"sources": src})[:-1] + ', "weights": {"a": '
        + "[" * 50_000 + "]" * 50_000 + "}}",
        "deep.toml": "a = " + "[" * 100_000,
        "deep-arrays.toml": "a = " + "[" * 5000 + "]" * 5000,
        "deep-tables.toml": "a = " + "{b = " * 5000 + "1" + "}" * 5000,
        "huge.json": " " * (2 << 20) + json.dumps({"sources": src, "weights": {"a": 1, "b": 1}}),
        "step-2-70.json": json.dumps({"sources": src, "schedule": [
            {"step": 0, "weights": {"a": 1, "b": 1}}, {"step": 2**70, "weights": {"a": 1, "b": 0}}]}),
        "step-true.json": json.dumps({"sources": src, "schedule": [
            {"step": 0, "weights": {"a": 1, "b": 1}}, {"step": True, "weights": {"a": 1, "b": 0}}]}),
        "step-float.json": json.dumps({"sources": src, "schedule": [
            {"step": 0, "weights": {"a": 1, "b": 1}}, {"step": 1.5, "weights": {"a": 1, "b": 0}}]}),
        "nan-weight.json": json.dumps({"sources": src, "weights": {"a": float("nan"), "b": 1}}),
        "not-a-table.toml": "sources = 3",
        "no-sources.json": "{}",
    }  # fmt: skip


def spec_files(work: Path, scale: float) -> Iterator[Attempt]:
    """Hostile mixture spec files: deep nesting (JSON, TOML), too large, unreachable or
    non-integer schedule steps, NaN weights, wrong shapes; each must be a ValueError naming
    the file or the piece (clear error), never a RecursionError or a first-batch failure."""
    a, b = _mixture_roots(work)
    d = work / "specs"
    d.mkdir(exist_ok=True)
    for name, text in _spec_texts(a, b).items():
        (d / name).write_text(text)

        def attempt(path: str = str(d / name)) -> str:
            try:
                ld = Loader(path, seq_len=32, batch_size=2, num_workers=0)
                next(iter(ld))
            except (ValueError, TypeError) as exc:
                said = str(exc)
                clear = path in said or "schedule piece" in said or "weight" in said
                return "clear error" if clear else f"crash: {type(exc).__name__}: {said}"[:200]
            except WdstreamError:
                return "clear error"
            return "silent wrong: a hostile spec file was read"

        yield attempt
