"""Skipped steps (issue 25, item 2): ``Loader.skip_steps(n)`` makes the next batch data step
``k + n``; the state records the skip so training steps map to data steps across save,
restore, another world size and another global batch. Oracle: the uninterrupted run."""

from __future__ import annotations

import itertools
import json
import tempfile
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wdstream import Loader, StateMismatchError
from wdstream.testing import write_synthetic_dataset

OPTS: dict[str, Any] = dict(seq_len=32, order="global", seed=3)
MIX: dict[str, Any] = dict(seq_len=16, shuffle_window=12, shuffle_lanes=2, seed=5,
                           weights={"a": 0.5, "b": 0.5})  # fmt: skip


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], list[np.ndarray]]:
    root = tmp_path_factory.mktemp("skip")
    write_synthetic_dataset(str(root / "a"), n_docs=30, sample_tokens=33, samples_per_shard=9)
    write_synthetic_dataset(
        str(root / "b"), n_docs=20, sample_tokens=17, samples_per_shard=5, seed=1
    )
    data = {"a": str(root / "a"), "b": str(root / "b")}
    run = _ids(Loader(data["a"], batch_size=4, num_workers=0, **OPTS), 60)
    return data, run


def _ids(loader: Loader, n: int) -> list[np.ndarray]:
    return [b["input_ids"].numpy().copy() for b in itertools.islice(loader, n)]


def _make(data: dict[str, str], workers: int = 0, batch_size: int = 4, **kw: Any) -> Loader:
    return Loader(data["a"], batch_size=batch_size, num_workers=workers, **{**OPTS, **kw})


def _roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


@pytest.mark.parametrize("workers", [0, 2])
def test_skips_land_on_the_uninterrupted_runs_data_steps(setup: tuple, workers: int) -> None:
    data, run = setup
    per_epoch = len(_make(data))
    # at the start, mid-epoch, from the last step of epoch 0 into epoch 1, twice in a row
    plan = [(0, 3), (2, 1), (per_epoch - 7, 5), (0, 2)]
    loader, t, expected = _make(data, workers), 0, []
    got: list[np.ndarray] = []
    for take, n in plan:
        got += _ids(loader, take)
        expected += [loader.data_step(t + j) for j in range(take)]
        t += take
        loader.skip_steps(n)
    got += _ids(loader, 4)
    expected += [loader.data_step(t + j) for j in range(4)]
    assert expected[0] == 3 and expected[-1] == t + 4 - 1 + 11
    for g, k in zip(got, expected, strict=True):
        assert np.array_equal(g, run[k])
        assert np.array_equal(g, loader.batch_at(k)["input_ids"].numpy())


@pytest.mark.parametrize("workers", [0, 2])
def test_save_and_restore_around_a_skip(setup: tuple, workers: int) -> None:
    data, run = setup
    loader = _make(data, workers)
    _ids(loader, 5)
    before = _roundtrip(loader.state_dict())
    loader.skip_steps(7)
    after = _roundtrip(loader.state_dict())
    assert after["skips"] == [[5, 7]] and "skips" not in before
    # restore after the skip; restore before it and skip again: both continue at step 12
    a = _make(data, workers)
    a.load_state_dict(after)
    b = _make(data, workers)
    b.load_state_dict(before)
    b.skip_steps(7)
    assert _roundtrip(b.state_dict()) == after
    for x in (a, b):
        got = _ids(x, 6)
        assert all(np.array_equal(g, run[12 + j]) for j, g in enumerate(got))
        assert [x.data_step(t) for t in (4, 5, 10)] == [4, 12, 17]
        state = _roundtrip(x.state_dict())
        assert state["step"] == 18 and state["skips"] == [[5, 7]]


def test_resume_on_another_world_size_and_global_batch(setup: tuple) -> None:
    data, run = setup
    loader = _make(data)
    _ids(loader, 3)
    loader.skip_steps(4)
    _ids(loader, 2)
    state = _roundtrip(loader.state_dict())  # training step 5 = data step 9
    ranks = [_make(data, batch_size=2, rank=r, world_size=2) for r in range(2)]
    for r in ranks:
        r.load_state_dict(state)
        assert r.data_step(5) == 9
    got = [np.concatenate(x) for x in zip(*(_ids(r, 3) for r in ranks), strict=True)]
    assert all(np.array_equal(g, run[9 + j]) for j, g in enumerate(got))
    wide = _make(data, batch_size=8)  # another global batch: the origin rebase
    wide.load_state_dict(state)
    wide.skip_steps(1)
    assert wide.data_step(5) == 10 and wide.data_step(4) == 8
    rows = _ids(wide, 1)[0]
    assert np.array_equal(rows, wide.batch_at(10)["input_ids"].numpy())
    assert _roundtrip(wide.state_dict())["skips"] == [[3, 4], [5, 1]]


def test_mixture_skips(setup: tuple) -> None:
    data, _ = setup

    def make() -> Loader:
        return Loader({"a": data["a"], "b": data["b"]}, batch_size=4, num_workers=0, **MIX)

    run = [b["input_ids"].numpy().copy() for b in itertools.islice(make(), 12)]
    loader = make()
    _ids(loader, 2)
    loader.skip_steps(3)
    state = _roundtrip(loader.state_dict())
    again = make()
    again.load_state_dict(state)
    for x in (loader, again):
        got = _ids(x, 4)
        assert all(np.array_equal(g, run[5 + j]) for j, g in enumerate(got))
        assert x.data_step(2) == 5


def test_refusals(setup: tuple) -> None:
    data, _ = setup
    loader = _make(data)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="n must be >= 1"):
            loader.skip_steps(bad)
    with pytest.raises(TypeError, match="must be an int"):
        loader.skip_steps(1.0)  # type: ignore[arg-type]
    streams = Loader(data["a"], batch_size=4, num_workers=0, seq_len=32, order="streams")
    with pytest.raises(TypeError, match="skip_steps needs order='global'"):
        streams.skip_steps(1)
    with pytest.raises(TypeError, match="data_step needs order='global'"):
        streams.data_step(0)
    _ids(loader, 2)
    loader.skip_steps(2)
    state = _roundtrip(loader.state_dict())
    for skips, field in (([[3, 2]], "skips"), ([[2, 0]], r"skips\[0\]\[1\]"), (7, "skips")):
        with pytest.raises(StateMismatchError, match=field):
            _make(data).load_state_dict({**state, "skips": skips})


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 9)), min_size=1, max_size=4))
def test_any_skips_match_the_uninterrupted_run(setup: tuple, plan: list[tuple[int, int]]) -> None:
    data, run = setup
    loader, t = _make(data), 0
    for take, n in plan:
        state = _roundtrip(loader.state_dict())
        loader = _make(data)
        loader.load_state_dict(state)
        for j, g in enumerate(_ids(loader, take)):
            assert np.array_equal(g, run[loader.data_step(t + j)])
        t += take
        loader.skip_steps(n)
    assert loader.data_step(t) == t + sum(n for _, n in plan)
    assert np.array_equal(_ids(loader, 1)[0], run[loader.data_step(t)])


def test_skip_under_a_live_iterator_is_refused(setup: tuple) -> None:
    """An iterator already running would go on from the old position while the state said
    the steps were skipped: refused until it is finished or closed."""
    data, run = setup
    loader = _make(data)
    it = iter(loader)
    first = next(it)["input_ids"].numpy().copy()
    with pytest.raises(RuntimeError, match="still running"):
        loader.skip_steps(2)
    it.close()
    loader.skip_steps(2)
    assert np.array_equal(first, run[0])
    assert np.array_equal(next(iter(loader))["input_ids"].numpy(), run[3])
    assert loader.data_step(1) == 3


@settings(max_examples=12, deadline=None)
@given(
    shape=st.tuples(st.integers(8, 40), st.sampled_from([9, 17, 33]), st.integers(1, 7)),
    world_size=st.sampled_from([1, 2, 3]),
    plan=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 12), st.booleans()), min_size=1, max_size=4
    ),
)
def test_any_shape_world_size_and_skips_match_the_uninterrupted_run(
    shape: tuple[int, int, int], world_size: int, plan: list[tuple[int, int, bool]]
) -> None:
    """Over dataset shapes, world sizes (one global batch of 6 rows) and skips, with a
    save/restore before each skip when drawn: every rank's rows of training step t are
    rows of the uninterrupted one-rank run's data step, epoch ends included (the
    datasets hold 1-10 steps an epoch)."""
    n_docs, sample_tokens, per_shard = shape
    with tempfile.TemporaryDirectory() as root:
        write_synthetic_dataset(root, n_docs=n_docs, sample_tokens=sample_tokens,
                                samples_per_shard=per_shard, seed=n_docs)  # fmt: skip
        opts = dict(seq_len=sample_tokens - 1, order="global", seed=7, num_workers=0)
        one = Loader(root, batch_size=6, **opts)
        total = sum(n for _, n, _ in plan) + sum(t for t, _, _ in plan) + 1
        run = _ids(one, total)

        def make(rank: int) -> Loader:
            return Loader(root, batch_size=6 // world_size, rank=rank, world_size=world_size,
                          **opts)  # fmt: skip

        ranks, t = [make(r) for r in range(world_size)], 0
        for take, n, restore in plan:
            if restore:  # every rank loads rank 0's state, as after a restart
                state = _roundtrip(ranks[0].state_dict())
                ranks = [make(r) for r in range(world_size)]
                for r in ranks:
                    r.load_state_dict(state)
            for j, rows in enumerate(zip(*(_ids(r, take) for r in ranks), strict=True)):
                assert np.array_equal(np.concatenate(rows), run[ranks[0].data_step(t + j)])
            t += take
            for r in ranks:
                r.skip_steps(n)
        assert ranks[0].data_step(t) == t + sum(n for _, n, _ in plan)
        last = np.concatenate([_ids(r, 1)[0] for r in ranks])
        assert np.array_equal(last, run[ranks[0].data_step(t)])


def test_skips_are_sealed(setup: tuple) -> None:
    """An edit of a state's well-formed ``skips`` would silently remap training steps to
    other data steps (the fault suite found 14 such states accepted): the state's check
    covers them, a state with skips but no check is refused, and so is one whose check was
    cut back to the form before skips were sealed (the six placing fields only): under it an
    edited ``skips`` would load and move ``data_step`` (issue 33 item 7)."""
    from wdstream.read.order.global_seal import SEALED, seal

    data, run = setup
    loader = _make(data)
    _ids(loader, 5)
    loader.skip_steps(2)
    _ids(loader, 3)
    state = _roundtrip(loader.state_dict())
    assert state["skips"] == [[5, 2]]
    for edit in ([], [[4, 2]], [[5, 3]], [[5, 1]], [[1, 1], [5, 1]]):
        with pytest.raises(StateMismatchError, match="skips: .*the field was edited"):
            _make(data).load_state_dict({**state, "skips": edit})
    unsealed = {k: v for k, v in state.items() if k != "check"}
    with pytest.raises(StateMismatchError, match="check: .*missing"):
        _make(data).load_state_dict(unsealed)
    for skips in ([[5, 2]], [[5, 3]], [[4, 2]]):  # the older form, the skips kept or edited
        earlier = {**state, "skips": skips, "check": seal(state, SEALED)}
        with pytest.raises(StateMismatchError, match="skips: is not covered by the state's check"):
            _make(data).load_state_dict(earlier)
    again = _make(data)
    again.load_state_dict(state)
    assert again.data_step(8) == 10
    assert np.array_equal(_ids(again, 1)[0], run[10])
