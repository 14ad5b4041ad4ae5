"""The global batch sequence (``order="global"``): same rows per step for any world size and
worker count, exactly once per epoch, ``batch_at`` equal to iteration, elastic resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdstream import Loader, StateMismatchError
from wdstream.testing import restored_after, write_synthetic_dataset

WIN = {"shuffle_window": 10, "shuffle_lanes": 3}


@pytest.fixture(scope="module")
def concat_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("concat"))
    write_synthetic_dataset(d, n_docs=80, sample_tokens=17, samples_per_shard=7)
    return d


@pytest.fixture(scope="module")
def docs_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("docs"))
    write_synthetic_dataset(d, n_docs=120, mode="docs", samples_per_shard=9)
    return d


def rows(batch: dict) -> np.ndarray:
    return np.concatenate([batch["input_ids"].numpy(), batch["labels"].numpy()[:, -1:]], axis=1)


def loader(root: str, world: int = 1, rank: int = 0, g: int = 6, **kw: object) -> Loader:
    opts = dict(seq_len=16, batch_size=g // world, rank=rank, world_size=world, num_workers=0,
                order="global", seed=7, **WIN)  # fmt: skip
    return Loader(root, **{**opts, **kw})  # type: ignore[arg-type]


def run(ld: Loader, steps: int) -> list[np.ndarray]:
    it = iter(ld)
    return [rows(next(it)) for _ in range(steps)]


@pytest.mark.parametrize("world,workers", [(2, 0), (3, 2), (6, 1)])
def test_every_step_has_the_same_rows_for_any_world_size(
    concat_root: str, world: int, workers: int
) -> None:
    ref = run(loader(concat_root, epochs=2, chunk_batches=3), 2 * len(loader(concat_root)))
    parts = [
        [
            rows(b)
            for b in loader(concat_root, world, r, epochs=2, num_workers=workers, chunk_batches=2)
        ]  # fmt: skip
        for r in range(world)
    ]
    assert all(len(p) == len(ref) for p in parts)  # equal batches per rank, no DDP hang
    for k, want in enumerate(ref):
        assert np.array_equal(np.concatenate([p[k] for p in parts]), want), f"step {k}"


def test_each_epoch_reads_every_sample_at_most_once(concat_root: str) -> None:
    # seq_len 16 = the packed one: a row is one packed sample (17 consecutive integers).
    ld = loader(concat_root, epochs=1)
    got = np.concatenate(run(ld, len(ld)))
    assert (got[:, 0] % 17 == 0).all() and (np.diff(got, axis=1) == 1).all()
    starts = got[:, 0].tolist()
    assert len(starts) == len(set(starts))  # no sample twice
    total = ld.dataset.sequence.order.rows_per_epoch  # type: ignore[union-attr]
    assert total - len(starts) < 6  # fewer than one global batch left out
    second = np.concatenate(run(loader(concat_root, epochs=2), 2 * len(ld))[len(ld) :])
    assert sorted(second[:, 0].tolist()) != starts  # a new shuffle ...
    assert set(second[:, 0].tolist()) <= set(range(0, 17 * total, 17))  # ... of the same rows


@pytest.mark.parametrize("fixture", ["concat_root", "docs_root"])
def test_batch_at_equals_iteration(request: pytest.FixtureRequest, fixture: str) -> None:
    root = request.getfixturevalue(fixture)
    ld = loader(root, world=2, rank=1, seq_len=24, return_doc_boundaries=True)
    n = len(ld)
    it = iter(loader(root, world=2, rank=1, seq_len=24, return_doc_boundaries=True))
    seen = [next(it) for _ in range(2 * n + 1)]
    for k in sorted({0, 1, n - 1, n, n + 1, 2 * n - 1, 2 * n, n // 2}):
        got = ld.batch_at(k)
        for key, want in seen[k].items():
            assert torch_equal(got[key], want), (k, key)


def torch_equal(a: object, b: object) -> bool:
    import torch

    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    return a.shape == b.shape and bool((a == b).all())


def test_state_from_two_ranks_resumes_on_one_and_on_three(concat_root: str) -> None:
    full = run(loader(concat_root), 40)
    saver = loader(concat_root, world=2, rank=0)
    run(saver, 13)
    state = json.loads(json.dumps(saver.state_dict()))  # rank 0's state, through JSON
    for world in (1, 3):
        parts = []
        for r in range(world):
            ld = loader(concat_root, world, r, num_workers=2 if r == 0 else 0)
            ld.load_state_dict(state)
            parts.append(run(ld, 40 - 13))
        for j in range(40 - 13):
            assert np.array_equal(np.concatenate([p[j] for p in parts]), full[13 + j])


def test_another_global_batch_finishes_the_epoch_exactly_once(concat_root: str) -> None:
    ld = loader(concat_root, g=6)
    n = len(ld)
    first = np.concatenate(run(ld, 5))
    state = ld.state_dict()
    bigger = loader(concat_root, world=2, g=8, rank=0)
    other = loader(concat_root, world=2, g=8, rank=1)
    bigger.load_state_dict(state)
    other.load_state_dict(state)
    assert len(bigger) == len(loader(concat_root, g=8))
    rest = []
    it0, it1 = iter(bigger), iter(other)
    rows_left = ld.dataset.sequence.order.rows_per_epoch - 5 * 6  # type: ignore[union-attr]
    for _ in range(rows_left // 8):
        rest.append(np.concatenate([rows(next(it0)), rows(next(it1))]))
    epoch = np.concatenate([first, *rest])
    starts = epoch[:, 0].tolist()
    assert len(starts) == len(set(starts))  # nothing repeated
    whole = np.concatenate(run(loader(concat_root, g=6, epochs=1), n))
    # The rows of the epoch after the switch are the same rows the old size would have read.
    order = ld.dataset.sequence.order  # type: ignore[union-attr]
    all_rows = np.zeros((order.rows_per_epoch, 17), dtype=np.int32)
    order.fill(0, 0, all_rows, None)
    assert np.array_equal(epoch, all_rows[: len(epoch)])
    assert np.array_equal(whole, all_rows[: len(whole)])
    nxt = rows(next(it0))  # the next step starts epoch 1 at its first row
    assert np.array_equal(
        nxt, rows(loader(concat_root, world=2, g=8).batch_at(len(loader(concat_root, g=8))))
    )


def test_states_of_another_dataset_or_seed_are_refused(concat_root: str, docs_root: str) -> None:
    ld = loader(concat_root)
    run(ld, 3)
    state = ld.state_dict()
    with pytest.raises(StateMismatchError, match=r"config.dataset: .*mode.*seed: saved 7, now 8"):
        loader(docs_root, seed=8).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"seq_len: saved 16, now 20"):
        loader(concat_root, seq_len=20).load_state_dict(state)
    v1 = Loader(concat_root, seq_len=16, batch_size=6, num_workers=0, order="streams", **WIN)
    with pytest.raises(StateMismatchError, match="version-1 state holds per-rank stream"):
        ld.load_state_dict(v1.state_dict())
    for field, value in [("step", -1), ("step", True), ("origin", {"step": 0}), ("iter_stop", "x")]:
        bad = {**state, field: value}
        with pytest.raises(StateMismatchError, match=field):
            ld.load_state_dict(bad)


def test_raw_text_says_global_order_needs_a_packed_dataset(tmp_path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    with pytest.raises(ValueError, match=r"order='global' .* needs a packed dataset"):
        Loader(str(tmp_path / "a.jsonl"), tokenizer="cl100k_base", order="global", seq_len=4,
               batch_size=1)  # fmt: skip


@settings(max_examples=25)
@given(
    n_docs=st.integers(20, 90),
    per_shard=st.integers(1, 12),
    world=st.sampled_from([1, 2, 4]),
    per_rank=st.integers(1, 3),
    seq_len=st.sampled_from([8, 16, 21]),
    stop=st.integers(0, 30),
    chunk=st.integers(1, 4),
)
def test_property_invariance_resume_and_batch_at(
    tmp_path_factory: pytest.TempPathFactory,
    n_docs: int,
    per_shard: int,
    world: int,
    per_rank: int,
    seq_len: int,
    stop: int,
    chunk: int,
) -> None:
    root = str(tmp_path_factory.mktemp("h"))
    write_synthetic_dataset(root, n_docs=n_docs, sample_tokens=17, samples_per_shard=per_shard)
    g = world * per_rank
    kw = dict(seq_len=seq_len, chunk_batches=chunk, g=g)
    try:
        steps = stop + 6
        ref = run(loader(root, **kw), steps)
    except ValueError as exc:  # too small for one global batch: a clear refusal
        assert "dataset too small" in str(exc)
        return
    saver = loader(root, world, world - 1, **kw)
    run(saver, stop)
    state = saver.state_dict()
    for r in range(world):
        ld = loader(root, world, r, **kw)
        ld.load_state_dict(state)
        got = run(ld, 6)
        for j in range(6):
            want = ref[stop + j][r * per_rank : (r + 1) * per_rank]
            assert np.array_equal(got[j], want)
            assert np.array_equal(rows(ld.batch_at(stop + j)), want)


def test_batch_at_counts_steps_from_a_loaded_origin(concat_root: str) -> None:
    # After a global-batch change the loaded state's origin decides which rows step k holds;
    # batch_at must use it before iteration starts (it once used the fresh reader's origin).
    ld = loader(concat_root, g=6)
    run(ld, 5)
    state = ld.state_dict()
    other = loader(concat_root, world=2, g=8, rank=1)
    other.load_state_dict(state)
    assert other.state_dict()["origin"]["step"] == 5
    at = [rows(other.batch_at(5 + j)) for j in range(4)]
    assert all(np.array_equal(a, b) for a, b in zip(at, run(other, 4), strict=True))


def test_global_batch_at_is_every_rank_side_by_side(concat_root: str) -> None:
    import wdstream

    for k in (0, 7, 60):
        whole = wdstream.global_batch_at(concat_root, k, seq_len=16, global_batch=6, seed=7, **WIN)
        parts = [rows(loader(concat_root, 3, r).batch_at(k)) for r in range(3)]
        got = np.concatenate([whole["input_ids"].numpy(), whole["labels"].numpy()[:, -1:]], 1)
        assert np.array_equal(got, np.concatenate(parts))
    # With a state saved after a change of global batch, steps are counted as that run does.
    ld = loader(concat_root, g=6)
    run(ld, 5)
    moved = loader(concat_root, g=4)
    moved.load_state_dict(ld.state_dict())
    state = moved.state_dict()
    whole = wdstream.global_batch_at(concat_root, 9, seq_len=16, global_batch=4, seed=7,
                                     state=state, **WIN)  # fmt: skip
    assert np.array_equal(whole["input_ids"].numpy(), moved.batch_at(9)["input_ids"].numpy())


@pytest.mark.parametrize("stop", [0, 1, 4, 9])
def test_dataset_under_stateful_dataloader_with_workers(concat_root: str, stop: int) -> None:
    # torchdata saves each worker's own state; a worker's share resumes its own next chunk.
    from torchdata.stateful_dataloader import StatefulDataLoader

    from wdstream import TokenDataset

    def make() -> StatefulDataLoader:
        ds = TokenDataset(concat_root, 16, 6, seed=7, epochs=1, chunk_batches=1, **WIN)
        return StatefulDataLoader(ds, batch_size=None, num_workers=2)

    ref = [rows(b) for b in make()]
    assert len(ref) == len(loader(concat_root))
    rest = [rows(b) for b in restored_after(make, stop)]
    assert len(rest) == len(ref) - stop
    assert all(np.array_equal(a, b) for a, b in zip(rest, ref[stop:], strict=True))
