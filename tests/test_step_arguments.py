"""Steps entering the reader from outside (issue 23, "Trust at the edges"): ``batch_at`` of
one dataset and of a mixture, ``global_batch_at``, ``explain_mixture``, schedule steps, and
the spec files a mixture is read from.

One rule everywhere (:func:`wdstream.read.order.step_check.check_step`): a step is an integer (not
a bool, float or string) from the run's origin up to the last step whose rows are numbered
below 2**63; one dataset and a mixture accept and refuse the same steps the same way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import wdstream
from wdstream.read.mixture.spec import MAX_SPEC_BYTES
from wdstream.testing import write_synthetic_dataset

SEQ, B = 32, 2
LAST = (1 << 63) // B - 1  # the last step with B rows a step, one rank, origin 0


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("steps")
    write_synthetic_dataset(str(d / "a"), n_docs=30, sample_tokens=SEQ + 1, samples_per_shard=9)
    write_synthetic_dataset(str(d / "b"), n_docs=20, sample_tokens=SEQ + 1, samples_per_shard=9)
    return str(d / "a"), str(d / "b")


def _one(roots: tuple[str, str]) -> wdstream.Loader:
    return wdstream.Loader(roots[0], seq_len=SEQ, batch_size=B, order="global")


def _mix(roots: tuple[str, str], **kw: object) -> wdstream.Loader:
    weights = kw.pop("weights", {"a": 0.7, "b": 0.3})
    return wdstream.Loader({"a": roots[0], "b": roots[1]}, weights=weights, seq_len=SEQ,
                           batch_size=B, **kw)  # fmt: skip


BAD_TYPES = [1.5, True, False, "3", None, np.float64(2.0), [1]]
BAD_RANGE = [-1, -(2**63), LAST + 1, 2**62 + 1, 2**63 - 1, 2**63, 2**64, 10**30]


@pytest.mark.parametrize("step", BAD_TYPES, ids=repr)
def test_a_step_that_is_no_integer_is_a_type_error_for_one_dataset_and_a_mixture(
    roots: tuple[str, str], step: object
) -> None:
    errors = []
    for loader in (_one(roots), _mix(roots)):
        with pytest.raises(TypeError, match="step must be an integer") as info:
            loader.batch_at(step)  # type: ignore[arg-type]
        errors.append(str(info.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("step", BAD_RANGE)
def test_a_step_out_of_range_is_the_same_value_error_for_one_dataset_and_a_mixture(
    roots: tuple[str, str], step: int
) -> None:
    errors = []
    for loader in (_one(roots), _mix(roots)):
        with pytest.raises(ValueError, match=rf"step {step} is outside .*\[0, {LAST}\]") as info:
            loader.batch_at(step)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def _contiguous(batch: dict) -> bool:
    """The synthetic datasets hold consecutive token ids, so every row of a correctly read
    step is a run of consecutive integers (an independent check of the rows' contents)."""
    ids = batch["input_ids"].numpy()
    return bool((np.diff(ids, axis=1) == 1).all())


@pytest.mark.parametrize("step", [LAST, LAST - 1, 2**62 - 7, 2**40 + 3, np.int64(5)])
def test_large_steps_work_for_one_dataset_and_a_mixture(roots: tuple[str, str], step: int) -> None:
    one, mix = _one(roots).batch_at(step), _mix(roots).batch_at(step)
    assert _contiguous(one) and _contiguous(mix)
    assert mix["source"].tolist() in ([0, 0], [0, 1], [1, 0], [1, 1])
    # Steps are ints: a numpy integer names the same step as the int.
    assert np.array_equal(_one(roots).batch_at(int(step))["input_ids"], one["input_ids"])


def test_a_large_step_is_what_iteration_from_its_epoch_yields(roots: tuple[str, str]) -> None:
    """Oracle: iteration (the chunk path, not ``batch_at``'s) started at the huge epoch that
    holds the step: random access at 2**61-ish steps counts them exactly."""
    spe = len(_one(roots))
    epoch = 2**61 // spe
    ds = wdstream.TokenDataset(roots[0], SEQ, B, order="global", epochs=1)
    ds.set_epoch(epoch)
    walked = [b["input_ids"] for b, _ in zip(ds, range(3), strict=False)]
    for j, want in enumerate(walked):
        assert np.array_equal(_one(roots).batch_at(epoch * spe + j)["input_ids"], want)


def test_global_batch_at_and_explain_mixture_check_steps(roots: tuple[str, str]) -> None:
    for bad, err in [(True, TypeError), (1.5, TypeError), (-1, ValueError), (2**63, ValueError)]:
        with pytest.raises(err, match="step"):
            wdstream.global_batch_at(roots[0], bad, seq_len=SEQ, global_batch=B)  # type: ignore[arg-type]
    spec = {"a": roots[0], "b": roots[1]}
    mix = wdstream.read.mixture.spec.MixtureSpec(spec, {"a": 1, "b": 1})
    for bad, err in [(True, TypeError), (1.5, TypeError), (-1, ValueError), (2**63, ValueError)]:
        with pytest.raises(err, match="step"):
            wdstream.explain_mixture(mix, bad, batch_size=B, seq_len=SEQ)  # type: ignore[arg-type]
    assert len(wdstream.explain_mixture(mix, LAST, batch_size=B, seq_len=SEQ).rows) == B
    got = wdstream.global_batch_at(roots[0], LAST, seq_len=SEQ, global_batch=B)
    assert np.array_equal(got["input_ids"], _one(roots).batch_at(LAST)["input_ids"])


@pytest.mark.parametrize(
    ("step", "match"),
    [
        (2**70, r"schedule piece 1: step must be an integer in \[0, 2\*\*63\)"),
        (2**63, r"schedule piece 1: step must be an integer in \[0, 2\*\*63\)"),
        (LAST + 1, rf"schedule piece 1: step {LAST + 1} is outside"),
        (True, r"schedule piece 1: step must be an integer"),
        (1.0, r"schedule piece 1: step must be an integer"),
    ],
)
def test_a_schedule_step_no_run_reaches_is_refused_at_construction(
    roots: tuple[str, str], step: object, match: str
) -> None:
    pieces = [(0, {"a": 1, "b": 1}), (step, {"a": 1, "b": 0})]
    with pytest.raises(ValueError, match=match):
        _mix(roots, weights=pieces)


def test_the_last_reachable_schedule_step_is_accepted(roots: tuple[str, str]) -> None:
    loader = _mix(roots, weights=[(0, {"a": 1, "b": 1}), (LAST, {"a": 1, "b": 0})])
    assert loader.batch_at(LAST)["source"].tolist() == [0, 0]


def _spec_file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_deeply_nested_json_specs_are_refused(tmp_path: Path, depth: int) -> None:
    bare = _spec_file(tmp_path, "bare.json", "[" * depth + "]" * depth)
    inner = _spec_file(
        tmp_path, "inner.json",
        '{"sources": {"a": "a"}, "weights": {"a": ' + "[" * depth + "]" * depth + "}}",
    )  # fmt: skip
    for path in (bare, inner):
        with pytest.raises(ValueError, match="nested too deeply to be a mixture spec"):
            wdstream.Loader(path, seq_len=SEQ, batch_size=B)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
@pytest.mark.parametrize(
    "text",
    [
        "a = " + "[" * 100_000,
        "a = " + "[" * 5000 + "]" * 5000,
        "a = " + "{b = " * 5000 + "1" + "}" * 5000,
    ],  # fmt: skip
    ids=["open arrays", "arrays", "inline tables"],
)
def test_deeply_nested_toml_specs_are_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError, match="nested too deeply to be a mixture spec"):
        wdstream.Loader(_spec_file(tmp_path, "deep.toml", text), seq_len=SEQ, batch_size=B)


def test_a_spec_file_larger_than_any_spec_is_refused_before_parsing(tmp_path: Path) -> None:
    path = _spec_file(tmp_path, "big.json", " " * MAX_SPEC_BYTES + json.dumps({"sources": {}}))
    with pytest.raises(ValueError, match="too large for a mixture spec"):
        wdstream.Loader(path, seq_len=SEQ, batch_size=B)


def test_explain_of_one_dataset_checks_steps_as_a_mixture_does(
    tmp_path: Path, roots: tuple[str, str]
) -> None:
    """``explain`` of one packed dataset (with provenance) refuses the same steps as
    ``explain_mixture`` with the same message, and explains the last reachable step."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " + "x " * i}) + "\n"
                           for i in range(60)))  # fmt: skip
    root = tmp_path / "packed"
    wdstream.pack(str(src), str(root), seq_len=SEQ, workers=0, progress=False)
    mix = wdstream.read.mixture.spec.MixtureSpec({"a": str(root)}, {"a": 1})
    for bad, err in [(True, TypeError), (1.5, TypeError), (-1, ValueError), (2**63, ValueError)]:
        with pytest.raises(err, match="step") as one:
            wdstream.explain(str(root), bad, batch_size=B)  # type: ignore[arg-type]
        with pytest.raises(err, match="step") as mixed:
            wdstream.explain_mixture(mix, bad, batch_size=B, seq_len=SEQ)  # type: ignore[arg-type]
        assert str(one.value) == str(mixed.value)
    assert len(wdstream.explain(str(root), LAST, batch_size=B).rows) == B
