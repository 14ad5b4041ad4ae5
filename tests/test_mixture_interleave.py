"""The mixture interleave and schedule: exact proportions for every prefix, O(1) lookups that
agree with counting, and the weight parsing rules."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from wdstream.read.mixture.interleave import MAX_PERIOD, Interleave, exact_weights
from wdstream.read.mixture.schedule import Schedule, SchedulePiece, parse_weights

# Weights as people write them: small integers, or decimals of up to 3 digits (some 0).
_weight = st.one_of(
    st.integers(0, 40),
    st.integers(0, 1000).map(lambda x: x / 1000),
    st.sampled_from([0.6, 0.3, 0.1, 0.25, 1 / 3, 2 / 3, 0.05]),
)
_weights = st.lists(_weight, min_size=1, max_size=6).filter(lambda w: sum(w) > 0)


def _names(k: int) -> list[str]:
    return [f"s{i}" for i in range(k)]


def _exact_or_skip(weights: list) -> tuple[int, ...]:
    """Integer weights; examples whose period is over the limit (an error, tested below)
    are skipped."""
    try:
        return exact_weights(weights, _names(len(weights)))
    except ValueError as exc:
        assert "repeat only every" in str(exc)
        assume(False)
        raise


def _prefix_counts(src: np.ndarray, k: int) -> np.ndarray:
    """counts[n, i] = rows of source i among the first n rows (n = 0 .. len)."""
    onehot = np.zeros((len(src) + 1, k), dtype=np.int64)
    onehot[np.arange(1, len(src) + 1), src] = 1
    return np.cumsum(onehot, axis=0)


def _written(w: float | int) -> Fraction:
    """What a person wrote: 0.6 is 3/5, 1 / 3 is 1/3 (the simplest fraction of the float)."""
    if isinstance(w, int):
        return Fraction(w)
    for den in range(1, 1001):
        if float(Fraction(round(w * den), den)) == w:
            return Fraction(round(w * den), den)
    return Fraction(repr(w))


def _exact_shares(weights: list[float | int]) -> list[Fraction]:
    f = [_written(w) for w in weights]
    return [x / sum(f) for x in f]


@settings(max_examples=200, deadline=None)
@given(_weights, st.integers(1, 5))
def test_every_prefix_is_within_one_row_of_its_share(weights: list, periods: int) -> None:
    w = _exact_or_skip(weights)
    shares = _exact_shares(weights)
    assert [Fraction(x, sum(w)) for x in w] == shares  # exactly the written proportions
    inter = Interleave(w)
    n = min(periods * inter.period + 7, 100_000)
    src, idx = inter.locate(np.arange(n, dtype=np.int64))
    counts = _prefix_counts(src, len(w))
    # |c_i(n) * P - W_i * n| < P  <=>  |c_i(n) - p_i n| < 1, in exact integers
    err = np.abs(counts * inter.period - np.arange(n + 1)[:, None] * np.asarray(w)[None, :])
    assert (err < inter.period).all()
    # A row's index in its source is the count of that source's rows before it.
    assert (idx == counts[np.arange(n), src]).all()
    for m in (0, 1, n // 3, n - 1, n):
        assert inter.counts(m).tolist() == counts[m].tolist()
    for i, x in enumerate(w):
        if x:
            rows = np.flatnonzero(src == i)
            for t in (0, len(rows) // 2, len(rows) - 1):
                assert inter.row_of(i, t) == rows[t]
        else:
            assert inter.row_of(i, 0) is None and not (src == i).any()


def test_worked_example_of_the_docstring() -> None:
    inter = Interleave(exact_weights([0.6, 0.3, 0.1], ["web", "code", "math"]))
    assert inter.period == 10
    assert inter.source.tolist() == [0, 1, 0, 0, 1, 0, 2, 0, 1, 0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 400), _weights.filter(lambda w: len(w) >= 1)), max_size=4),
    _weights,
    st.integers(1, 64),
)
def test_schedule_is_exact_from_every_boundary(
    later: list[tuple[int, list]], first: list, g: int
) -> None:
    k = len(first)
    pieces_raw: list = [(0, dict(zip(_names(k), first, strict=True)))]
    step = 0
    for gap, w in later:
        step += gap
        w = (w * k)[:k]
        if sum(w) == 0:
            continue
        _exact_or_skip(w)
        pieces_raw.append((step, dict(zip(_names(k), w, strict=True))))
    _exact_or_skip(first)
    parsed = parse_weights(pieces_raw, _names(k))
    sched = Schedule([SchedulePiece(s, s * g, w) for s, w in parsed])
    end = sched.starts[-1] + 3 * sched.parts[-1].period + 5
    src, idx = sched.locate(np.arange(end, dtype=np.int64))
    counts = _prefix_counts(src, k)
    for j, (start, part) in enumerate(zip(sched.starts, sched.parts, strict=True)):
        stop = sched.starts[j + 1] if j + 1 < len(sched.starts) else end
        since = counts[start : stop + 1] - counts[start]
        n = np.arange(stop - start + 1)[:, None]
        err = np.abs(since * part.period - n * np.asarray(part.weights)[None, :])
        assert (err < part.period).all(), f"piece {j}"
    assert (idx == counts[np.arange(end), src]).all()  # one counter per source across pieces
    for m in (0, end // 2, end):
        assert sched.counts(m).tolist() == counts[m].tolist()
    for i in range(k):
        rows = np.flatnonzero(src == i)
        for t in rows[:: max(1, len(rows) // 5)]:
            assert sched.row_of(i, int(idx[t])) == t


def test_weights_are_the_written_decimals() -> None:
    assert exact_weights([0.6, 0.3, 0.1], _names(3)) == (6, 3, 1)
    assert exact_weights([2, 1], _names(2)) == (2, 1)
    assert exact_weights([0.7, 0.2], _names(2)) == (7, 2)
    assert exact_weights([1, 0], _names(2)) == (1, 0)
    assert exact_weights([1 / 3, 2 / 3], _names(2)) == (1, 2)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"a": -0.1, "b": 1}, "weight of source 'a' must be >= 0, got -0.1"),
        ({"a": 0, "b": 0.0}, "must sum to a positive total"),
        ({"a": float("nan"), "b": 1}, "must be finite"),
        ({"a": "0.5", "b": 1}, "must be a number"),
        ({"a": True, "b": 1}, "must be a number"),
        ({"a": 1, "c": 1}, "unknown source 'c'; the sources are a, b"),
        ({"a": 1}, "no weight for source 'b' (give 0 to leave it out there)"),
        ({"a": 0.123457, "b": 0.2}, "repeat only every"),
        ([(5, {"a": 1, "b": 1})], "must start at step 0"),
        ([(0, {"a": 1, "b": 1}), (0, {"a": 1, "b": 2})], "steps must increase"),
        ([(0, {"a": 1, "b": 1}), (-3, {"a": 1, "b": 2})], "step must be an integer in"),
        ([(0, {"a": 1, "b": 1}), (9, {"a": -1, "b": 2})], "piece 1 (step 9): weight of"),
        ([], "non-empty list"),
        (None, "a mixture needs weights"),
        ("a=1", "non-empty list"),
    ],
)
def test_bad_weights_say_what_and_where(weights: object, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_weights(weights, ["a", "b"])
    assert message in str(err.value)


def test_spec_style_pieces_parse_like_tuples() -> None:
    tuples = parse_weights([(0, {"a": 1, "b": 3}), (10, {"a": 0.5, "b": 0.5})], ["a", "b"])
    dicts = parse_weights(
        [{"step": 0, "weights": {"a": 1, "b": 3}}, {"step": 10, "weights": {"a": 0.5, "b": 0.5}}],
        ["a", "b"],
    )
    assert tuples == dicts == [(0, (1, 3)), (10, (1, 1))]


def test_period_limit_is_what_the_error_says() -> None:
    assert sum(exact_weights([1, MAX_PERIOD - 1], _names(2))) == MAX_PERIOD
    with pytest.raises(ValueError, match="repeat only every"):
        exact_weights([1, MAX_PERIOD], _names(2))
