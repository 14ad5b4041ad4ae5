"""Mixtures through ``Loader``: exact proportions for any batch geometry, each source's epoch
exactly once, the same batches for any worker count, ``batch_at``, resume at and around
schedule boundaries, annealing on resume, elastic resume, stop rules and ``progress``.

Sources are synthetic datasets whose token t is the integer t, so a row's tokens say which
samples it came from. ``code`` is small (upsampled), ``books`` is packed at seq_len 32 and
read at 16 (rows straddle its samples).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from wdstream import Loader, StateMismatchError
from wdstream.testing import restored_after, write_synthetic_dataset

SEQ = 16
OPTS: dict[str, Any] = dict(seq_len=SEQ, shuffle_window=12, shuffle_lanes=2, seed=5)
W = {"web": 0.5, "code": 0.3, "books": 0.2}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mix")
    write_synthetic_dataset(str(root / "web"), n_docs=50, sample_tokens=17, samples_per_shard=9)
    write_synthetic_dataset(
        str(root / "code"), n_docs=6, sample_tokens=17, samples_per_shard=5, seed=1
    )
    write_synthetic_dataset(
        str(root / "books"), n_docs=40, sample_tokens=33, samples_per_shard=6, seed=2
    )
    return {name: str(root / name) for name in ("web", "code", "books")}


def _rows(batch: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).numpy()


def _take(loader: Loader, n: int) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(loader, n))


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.keys() == y.keys(), i
        for k in x:
            assert torch.equal(x[k], y[k]), (i, k)


def _within_one(src: np.ndarray, weights: dict[str, float], start: int = 0) -> None:
    """Every prefix of ``src[start:]`` holds each source within 1 row of its share."""
    total = sum(weights.values())
    p = np.array([w / total for w in weights.values()])
    part = src[start:]
    onehot = np.zeros((len(part), len(p)))
    onehot[np.arange(len(part)), part] = 1
    counts = np.cumsum(onehot, axis=0)
    n = np.arange(1, len(part) + 1)[:, None]
    assert (np.abs(counts - n * p[None, :]) < 1 - 1e-9).all()


@settings(max_examples=12)
@given(
    st.lists(st.integers(0, 9), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
    st.sampled_from([(1, 6), (2, 3), (3, 2), (6, 1), (1, 5), (5, 1)]),
    st.integers(2, 9),
)
def test_proportions_and_rows_are_the_same_for_any_geometry(
    sources: dict[str, str], weights: list[int], geometry: tuple[int, int], steps: int
) -> None:
    world, b = geometry
    # One schedule piece from step 0: a weight of 0 is legal there (static weights refuse it).
    w = [(0, dict(zip(sources, weights, strict=True)))]
    reference = _take(
        Loader(sources, batch_size=world * b, num_workers=0, weights=w, **OPTS), steps
    )
    ranks = [
        _take(
            Loader(
                sources,
                batch_size=b,
                rank=r,
                world_size=world,
                num_workers=0,
                weights=w,
                chunk_batches=2,
                **OPTS,
            ),
            steps,
        )  # fmt: skip
        for r in range(world)
    ]
    for s in range(steps):
        glued = {k: torch.cat([ranks[r][s][k] for r in range(world)]) for k in reference[s]}
        _same([glued], [reference[s]])
    _within_one(torch.cat([x["source"] for x in reference]).numpy(), w[0][1])


def test_each_source_epoch_is_read_exactly_once(sources: dict[str, str]) -> None:
    loader = Loader(sources, batch_size=8, num_workers=0, weights=W, stop="all_exhausted", **OPTS)
    n = len(loader)
    batches = list(loader)
    assert len(batches) == n
    rows = np.concatenate([_rows(x) for x in batches])
    src = torch.cat([x["source"] for x in batches]).numpy()
    _within_one(src, W)
    progress = loader.progress()
    for i, name in enumerate(loader.sources):
        mine = rows[src == i]
        per_epoch = progress[name]["rows_per_epoch"]
        assert progress[name]["rows"] == len(mine)
        assert len(mine) >= per_epoch  # all_exhausted: every source finished an epoch
        tokens = json.loads((Path(sources[name]) / "index.json").read_text())["shards"]
        total = sum(s["tokens"] for s in tokens)
        for e in range(len(mine) // per_epoch):
            epoch = mine[e * per_epoch : (e + 1) * per_epoch].reshape(-1)
            assert len(np.unique(epoch)) == epoch.size  # no token twice in an epoch
            # all but less than one row plus the short last sample are read
            assert total - epoch.size < (SEQ + 1) + 33
        if len(mine) >= 2 * per_epoch:  # an upsampled source reshuffles its next epoch
            assert not np.array_equal(mine[:per_epoch], mine[per_epoch : 2 * per_epoch])


def test_first_exhausted_stops_before_a_new_epoch_and_the_next_iteration_goes_on(
    sources: dict[str, str],
) -> None:
    opts = dict(batch_size=8, weights=W, stop="first_exhausted", **OPTS)
    loader = Loader(sources, num_workers=0, **opts)
    first = len(loader)
    one = list(loader)
    assert len(one) == first
    progress = loader.progress()
    # nobody read a row of a second epoch, and one source (the small one) is less than one
    # step's rows from the end of its first ...
    assert all(p["rows"] <= p["rows_per_epoch"] for p in progress.values())
    assert progress["code"]["rows_per_epoch"] - progress["code"]["rows"] < 8
    two = list(loader)  # ... and the next iteration continues from there
    assert len(two) > 0 and loader.progress()["code"]["epoch"] == 1
    forever = _take(Loader(sources, num_workers=0, **{**opts, "stop": None}), len(one) + len(two))
    _same(one + two, forever)
    with pytest.raises(TypeError, match="runs forever"):
        len(Loader(sources, num_workers=0, **{**opts, "stop": None}))


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_give_the_same_batches_and_resume_mid_chunk(
    sources: dict[str, str], workers: int
) -> None:
    opts = dict(batch_size=4, weights=W, chunk_batches=3, **OPTS)
    reference = _take(Loader(sources, num_workers=0, **opts), 14)
    loader = Loader(sources, num_workers=workers, **opts)
    got = []
    for batch in loader:
        got.append(batch)
        if len(got) == 7:  # inside a chunk of 3
            state = json.loads(json.dumps(loader.state_dict()))
            break
    resumed = Loader(sources, num_workers=workers, **opts)
    resumed.load_state_dict(state)
    _same(got + _take(resumed, 7), reference)


SCHEDULE = [
    (0, {"web": 0.6, "code": 0.2, "books": 0.2}),
    (9, {"web": 0.1, "code": 0.0, "books": 0.9}),
]


@pytest.mark.parametrize("saved_at", [7, 8, 9, 10])
def test_resume_around_a_schedule_boundary(sources: dict[str, str], saved_at: int) -> None:
    opts = dict(batch_size=5, weights=SCHEDULE, chunk_batches=4, **OPTS)
    reference = _take(Loader(sources, num_workers=0, **opts), 16)
    src = torch.cat([x["source"] for x in reference]).numpy()
    _within_one(src[: 9 * 5], SCHEDULE[0][1])
    _within_one(src, SCHEDULE[1][1], start=9 * 5)  # exact again from the boundary on
    loader = Loader(sources, num_workers=0, **opts)
    _take(loader, saved_at)
    state = json.loads(json.dumps(loader.state_dict()))
    assert [p[0] for p in state["schedule"]] == [0, 9][: 1 + (saved_at > 9)]
    resumed = Loader(sources, num_workers=2, **opts)
    resumed.load_state_dict(state)
    _same(_take(resumed, 16 - saved_at), reference[saved_at:])
    for k in (0, 8, 9, 15):
        _same([resumed.batch_at(k)], [reference[k]])


def test_anneal_on_resume_changes_only_the_future(sources: dict[str, str]) -> None:
    opts = dict(batch_size=6, num_workers=0, **OPTS)
    loader = Loader(sources, weights=W, **opts)
    before = _take(loader, 5)
    state = loader.state_dict()
    anneal = {"web": 0.0, "code": 0.25, "books": 0.75}
    for at in (5, 7):  # from the saved step on, or later
        resumed = Loader(sources, weights=[(0, W), (at, anneal)], **opts)
        resumed.load_state_dict(state)
        after = _take(resumed, 6)
        src = torch.cat([x["source"] for x in before + after]).numpy()
        _within_one(src[: at * 6], W)
        _within_one(src, anneal, start=at * 6)
        _same([resumed.batch_at(k) for k in range(5)], before)
        again = resumed.state_dict()
        assert again["schedule"] == [[0, 0, [5, 3, 2]], [at, at * 6, [0, 1, 3]]]
    with pytest.raises(StateMismatchError, match=r"^schedule: the weights before the saved step 5"):
        Loader(sources, weights=[(0, W), (4, anneal)], **opts).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="^schedule"):
        Loader(sources, weights=[(0, anneal)], **opts).load_state_dict(state)


def test_elastic_resume_keeps_the_row_sequence(sources: dict[str, str]) -> None:
    opts = dict(weights=W, num_workers=0, **OPTS)
    reference = _take(Loader(sources, batch_size=8, **opts), 12)
    loader = Loader(sources, batch_size=8, **opts)
    _take(loader, 5)
    state = loader.state_dict()
    halves = []
    for r in range(2):  # the same global batch on 2 ranks: the same steps
        rank = Loader(sources, batch_size=4, rank=r, world_size=2, **opts)
        rank.load_state_dict(state)
        halves.append(_take(rank, 7))
    glued = [{k: torch.cat([halves[0][s][k], halves[1][s][k]]) for k in halves[0][s]}
             for s in range(7)]  # fmt: skip
    _same(glued, reference[5:])
    small = Loader(sources, batch_size=3, **opts)  # another global batch: the same rows
    small.load_state_dict(state)
    rows = np.concatenate([_rows(x) for x in _take(small, 10)])
    want = np.concatenate([_rows(x) for x in reference[5:]])
    np.testing.assert_array_equal(rows, want[: len(rows)])
    assert small.state_dict()["origin"] == {"step": 5, "row": 40}
    _same(
        [small.batch_at(9)], [{k: v for k, v in _take(_resumed(sources, state, 3), 5)[4].items()}]
    )


def _resumed(sources: dict[str, str], state: dict[str, Any], b: int) -> Loader:
    loader = Loader(sources, batch_size=b, weights=W, num_workers=0, **OPTS)
    loader.load_state_dict(state)
    return loader


def test_progress_counts_what_was_handed_out(sources: dict[str, str]) -> None:
    loader = Loader(sources, batch_size=4, weights=W, num_workers=2, chunk_batches=3, **OPTS)
    got = _take(loader, 10)
    src = torch.cat([x["source"] for x in got]).numpy()
    progress = loader.progress()
    assert [p["rows"] for p in progress.values()] == np.bincount(src, minlength=3).tolist()
    assert [p["tokens"] for p in progress.values()] == [p["rows"] * SEQ for p in progress.values()]
    assert [p["weight"] for p in progress.values()] == [0.5, 0.3, 0.2]
    assert loader.sources == ["web", "code", "books"]


def test_states_of_other_mixtures_are_refused_by_name(sources: dict[str, str]) -> None:
    loader = Loader(sources, batch_size=4, weights=W, num_workers=0, **OPTS)
    _take(loader, 3)
    state = loader.state_dict()
    swapped = {k: sources[k] for k in ("code", "web", "books")}
    cases = [
        (dict(source=swapped, weights=W), r"^config.sources: .*source 0 is 'web' in the state"),
        (dict(seed=6), r"^config: .*seed: saved 5, now 6"),
        (dict(stop="first_exhausted"), r"^config: .*stop: saved None"),
        (dict(source=sources["web"], weights=None), r"^order: the state is of a mixture"),
    ]
    for change, message in cases:
        opts = {"source": sources, "batch_size": 4, "weights": W, "num_workers": 0, **OPTS,
                **change}  # fmt: skip
        with pytest.raises(StateMismatchError, match=message):
            Loader(**opts).load_state_dict(state)
    one = Loader(sources["web"], batch_size=4, num_workers=0, **OPTS)
    with pytest.raises(StateMismatchError, match="^order: the state is of one dataset"):
        loader.load_state_dict(one.state_dict())
    for key, value, message in [
        ("schedule", [[0, 0, [10, 6, 4]]], r"schedule\[0\]\[2\]: weights in lowest terms"),
        ("schedule", [[0, 0, [5, 3]]], r"schedule\[0\]\[2\]: 3 weights expected"),
        ("schedule", [], "schedule: the pieces before step 3 are missing"),
        ("step", -1, "step: must be in"),
        ("extra", 1, "extra: unknown key"),
    ]:
        bad = {**json.loads(json.dumps(state)), key: value}
        with pytest.raises(StateMismatchError, match=message):
            loader.load_state_dict(bad)


def test_document_boundaries_in_a_mixture(sources: dict[str, str]) -> None:
    opts = dict(batch_size=4, weights=W, chunk_batches=3, return_doc_boundaries=True, **OPTS)
    loader = Loader(sources, num_workers=0, **opts)
    got = _take(loader, 8)
    _same(got, _take(Loader(sources, num_workers=2, **opts), 8))
    _same([loader.batch_at(k) for k in range(8)], got)
    for batch in got:
        ids, pos = batch["input_ids"], batch["position_ids"]
        assert (pos[:, 0] == 0).all()
        jump = ids[:, 1:] != ids[:, :-1] + 1  # another sample (or source) starts there
        assert (pos[:, 1:][jump] == 0).all()
        assert batch["cu_seqlens"][-1] == ids.numel()


@pytest.mark.parametrize("stop", [0, 3, 7])
def test_mixture_dataset_under_stateful_dataloader_with_workers(
    sources: dict[str, str], stop: int
) -> None:
    # torchdata saves each worker's own share of the mixture state; each resumes exactly.
    from torchdata.stateful_dataloader import StatefulDataLoader

    from wdstream import TokenDataset

    def make() -> StatefulDataLoader:
        ds = TokenDataset(sources, 16, 4, weights=SCHEDULE, stop="first_exhausted",
                          shuffle_window=12, shuffle_lanes=2, seed=5)  # fmt: skip
        return StatefulDataLoader(ds, batch_size=None, num_workers=2)

    ref = list(make())
    assert len(ref) > 10 and all("source" in b for b in ref)
    _same(list(restored_after(make, stop)), ref[stop:])


def test_another_global_batch_mid_iteration_keeps_its_end(sources: dict[str, str]) -> None:
    opts = dict(weights=W, stop="first_exhausted", num_workers=0, **OPTS)
    whole = Loader(sources, batch_size=8, **opts)
    rest_rows = np.concatenate([_rows(x) for x in list(whole)[3:]])
    loader = Loader(sources, batch_size=8, **opts)
    _take(loader, 3)
    state = loader.state_dict()
    assert state["iter_stop"] is not None
    halved = Loader(sources, batch_size=4, **opts)
    halved.load_state_dict(state)
    assert len(halved) == 2 * (state["iter_stop"] - 3)
    got = np.concatenate([_rows(x) for x in halved])  # the rest of the iteration, no more
    np.testing.assert_array_equal(got, rest_rows)


def test_persistent_workers_take_a_loaded_schedule(sources: dict[str, str]) -> None:
    # The schedule travels with the position to running workers (not with their copy of
    # the reader), so a state loaded into a loader with live workers is read under it.
    anneal = [(0, W), (4, {"web": 0.0, "code": 0.5, "books": 0.5})]
    opts = dict(batch_size=4, chunk_batches=2, num_workers=2, persistent_workers=True, **OPTS)
    saver = Loader(sources, weights=anneal, **{**opts, "num_workers": 0})
    _take(saver, 6)
    state = saver.state_dict()
    loader = Loader(sources, weights=[(0, W), (6, {"web": 1, "code": 0, "books": 0})], **opts)
    _take(loader, 3)  # workers started under its own schedule
    with pytest.raises(StateMismatchError, match="^schedule"):
        loader.load_state_dict(state)  # its past (the piece at 4) differs from the state's
    loader = Loader(sources, weights=anneal, **opts)
    _take(loader, 3)
    loader.load_state_dict(state)
    want = Loader(sources, weights=anneal, **{**opts, "num_workers": 0})
    want.load_state_dict(state)
    _same(_take(loader, 6), _take(want, 6))
    fresh = Loader(sources, weights=[(0, W), (4, {"web": 0.0, "code": 0.5, "books": 0.5}),
                                     (8, {"web": 0, "code": 0, "books": 1})], **opts)  # fmt: skip
    _take(fresh, 2)
    fresh.load_state_dict(state)  # a new future piece at 8, loaded into live workers
    got = _take(fresh, 6)
    assert [int(s) for b in got[2:] for s in b["source"]] == [2] * 16
