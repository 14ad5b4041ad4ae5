"""Exact resume of Loader and TokenDataset, and the per-epoch split properties."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wdstream import Loader, TokenDataset
from wdstream.testing import assert_resumes_exactly, write_synthetic_dataset

KW = {"shuffle_window": 8, "shuffle_lanes": 3}


@pytest.fixture(scope="module")
def concat_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("concat"))
    write_synthetic_dataset(d, n_docs=60, sample_tokens=17, samples_per_shard=6)
    return d


@pytest.fixture(scope="module")
def docs_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("docs"))
    write_synthetic_dataset(d, n_docs=150, mode="docs", samples_per_shard=11)
    return d


def rows(batch: dict) -> np.ndarray:
    return np.concatenate([batch["input_ids"].numpy(), batch["labels"].numpy()[:, -1:]], axis=1)


def _batches(loader: Loader, steps: int | None = None) -> list[dict[str, np.ndarray]]:
    """Up to ``steps`` batches of one ``iter()`` of ``loader``, as numpy arrays."""
    out = []
    for b in loader:
        out.append({k: v.numpy().copy() for k, v in b.items()})
        if steps is not None and len(out) == steps:
            break
    return out


def _same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> bool:
    return len(got) == len(want) and all(
        g.keys() == w.keys() and all(np.array_equal(g[k], w[k]) for k in w)
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize("epochs", [None, 2])
@pytest.mark.parametrize("streams,chunk", [(1, 1), (3, 2)])
def test_loader_resumes_at_every_step(concat_root: str, epochs, streams: int, chunk: int) -> None:
    def make(epochs: int | None = epochs) -> Loader:
        return Loader(concat_root, seq_len=30, batch_size=4, num_workers=0, epochs=epochs,
                      streams=streams, chunk_batches=chunk, seed=5, **KW)  # fmt: skip

    # The uninterrupted run, epoch by epoch: a one-epoch loader walks the next epoch on
    # each iter(). Two epochs of the same length n, in different orders.
    one = make(1)
    n = len(one)
    per_epoch = [_batches(one) for _ in range(3)]
    assert [len(e) for e in per_epoch] == [n, n, n] and n > 5
    assert not _same(per_epoch[0], per_epoch[1])
    # epochs=2 yields exactly those 2n batches and stops; epochs=None runs on into epoch 2
    steps = 2 * n + 3 if epochs is None else None
    want = per_epoch[0] + per_epoch[1] + (per_epoch[2][:3] if epochs is None else [])
    ref = make()
    states, got = [], []
    it = iter(ref)
    for _ in range(2 * n + 10):
        states.append(json.loads(json.dumps(ref.state_dict())))
        b = next(it, None)
        if b is None or len(got) == steps:
            break
        got.append({k: v.numpy().copy() for k, v in b.items()})
    assert len(got) == len(want) and _same(got, want)
    # restoring the state taken before step i yields exactly batches i.. of that run: to the
    # end from step 0 and from epoch 2; from the rest of epoch 1, through the epoch boundary
    # and epoch 2's first 12 batches (its new order; a few chunks and windows of each stream)
    # only, which halves the batches compared (every one to the end: ~3 CPU-s a case).
    edges = {0, 1, n - 1, n, n + 1, 2 * n - 1, 2 * n}
    for i in sorted(edges | set(range(0, 2 * n, 5))):
        fresh = make()
        fresh.load_state_dict(states[i])
        stop = len(want) if i == 0 or i >= n else n + 12
        # to the end with epochs=2: read until the loader stops (it must stop there)
        rest = _batches(fresh, None if stop == len(want) and steps is None else stop - i)
        assert _same(rest, want[i:stop]), f"resume at step {i}: {len(rest)} of {stop - i}"


def test_second_resume_in_same_epoch(docs_root: str) -> None:
    opts = dict(seq_len=30, batch_size=2, num_workers=0, streams=2, chunk_batches=3, **KW)
    ref = Loader(docs_root, **opts)
    it = iter(ref)
    want = [rows(next(it)) for _ in range(40)]
    a = Loader(docs_root, **opts)
    ita = iter(a)
    [next(ita) for _ in range(7)]
    b = Loader(docs_root, **opts)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    itb = iter(b)
    [next(itb) for _ in range(6)]
    c = Loader(docs_root, **opts)
    c.load_state_dict(b.state_dict())
    itc = iter(c)
    got = [rows(next(itc)) for _ in range(27)]
    assert all(np.array_equal(x, y) for x, y in zip(got, want[13:], strict=True))


@pytest.mark.parametrize(
    "workers,streams,persistent,prefetch",
    [(1, 1, False, None), (2, 2, False, 1), (2, 4, True, 3), (3, 3, True, None)],
)
def test_resume_with_workers(concat_root: str, workers, streams, persistent, prefetch) -> None:
    opts = dict(seq_len=12, batch_size=2, epochs=2, streams=streams, chunk_batches=3, **KW)
    ref = [rows(b) for b in Loader(concat_root, num_workers=0, **opts)]
    loader = Loader(concat_root, num_workers=workers, persistent_workers=persistent,
                    prefetch_factor=prefetch, **opts)  # fmt: skip
    per_epoch = len(loader)
    first = [rows(b) for b in loader]
    assert len(first) == len(ref) and all(
        np.array_equal(a, b) for a, b in zip(first, ref, strict=True)
    )
    # iter() again continues with the next two epochs (same workers when persistent)
    nxt = [rows(b) for b in loader]
    assert len(nxt) == 2 * per_epoch or len(nxt) > 0
    for stop in [0, 1, per_epoch - 1, per_epoch, per_epoch + 4, len(ref) - 1]:
        src = Loader(concat_root, num_workers=workers, persistent_workers=persistent,
                     prefetch_factor=prefetch, **opts)  # fmt: skip
        it = iter(src)
        [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(src.state_dict()))
        # restore on a loader that already ran (persistent workers are re-pointed)
        src.load_state_dict(state)
        rest = [rows(b) for b in src]
        assert len(rest) == len(ref) - stop, stop
        assert all(np.array_equal(a, b) for a, b in zip(rest, ref[stop:], strict=True)), stop
        fresh = Loader(concat_root, num_workers=0, **opts)
        fresh.load_state_dict(state)
        assert all(np.array_equal(rows(a), b) for a, b in zip(fresh, ref[stop:], strict=True))


def test_loader_and_dataset_share_one_state(concat_root: str) -> None:
    """The loader's state is the dataset's format: a mid-chunk loader state resumes a
    TokenDataset of the same configuration exactly, and reads back unchanged."""
    opts = dict(streams=2, chunk_batches=3, epochs=1, seed=5, **KW)
    loader = Loader(concat_root, seq_len=30, batch_size=4, num_workers=0, **opts)
    it = iter(loader)
    for _ in range(7):  # stream 0 has done 4 batches: one into its second chunk of 3
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["streams"][0]["batches"] == 4 and state["chunk_left"] == 2
    want = [rows(b) for b in it]
    ds = TokenDataset(concat_root, 30, 4, **opts)
    ds.load_state_dict(state)
    assert ds.state_dict() == state
    got = [rows(b) for b in ds]
    assert len(got) == len(want) > 0
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_dataset_resumes_exactly(docs_root: str) -> None:
    def make() -> TokenDataset:
        return TokenDataset(docs_root, 25, 2, streams=3, epochs=2, seed=9,
                            return_doc_boundaries=True, **KW)  # fmt: skip

    # 837 items, 414 an epoch. Resumed at every 9th item of epoch 1, each compared through
    # epoch 2's first windows (60 items: its reshuffled order and each stream's first
    # refills); three of them through the end of epoch 2 too. (Every one through the end,
    # as before, compared 2x the items for the same resume points.)
    assert_resumes_exactly(make, steps=474, check_at=range(0, 400, 9))
    assert len(assert_resumes_exactly(make, check_at=[0, 207, 396])) == 837


@given(
    world=st.integers(1, 4),
    streams=st.integers(1, 3),
    batch=st.integers(1, 4),
    seq_len=st.sampled_from([16, 9, 23]),
    seed=st.integers(0, 3),
    stop=st.integers(0, 60),
    docs=st.booleans(),
)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_split_properties(
    concat_root, docs_root, world, streams, batch, seq_len, seed, stop, docs
) -> None:
    root = docs_root if docs else concat_root
    opts = dict(seq_len=seq_len, batch_size=batch, num_workers=0, epochs=1, streams=streams,
                seed=seed, world_size=world, chunk_batches=2, **KW)  # fmt: skip
    per_rank = []
    for r in range(world):
        try:
            loader = Loader(root, rank=r, **opts)
            n = len(loader)
        except ValueError:
            return  # dataset too small for this geometry
        batches = [rows(b) for b in loader]
        assert len(batches) == n
        per_rank.append(batches)
    counts = {len(b) for b in per_rank}
    assert len(counts) == 1  # equal batch counts per rank: no DDP hang
    toks = np.concatenate([b.ravel() for bs in per_rank for b in bs])
    assert len(np.unique(toks)) == len(toks)  # nothing twice within an epoch
    total = json.load(open(f"{root}/index.json"))
    n_tok = sum(s["tokens"] for s in total["shards"])
    biggest = 300 if docs else 17  # largest sample
    S = world * streams
    assert (
        n_tok - len(toks) <= S * (batch * (seq_len + 1) + 2 * biggest) + S * biggest + S * biggest
    )
    # exact resume for rank 0 at a hypothesis-chosen step
    ref = per_rank[0]
    stop = min(stop, len(ref))
    loader = Loader(root, rank=0, **opts)
    it = iter(loader)
    [next(it) for _ in range(stop)]
    again = Loader(root, rank=0, **opts)
    again.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    rest = [rows(b) for b in again]
    assert len(rest) == len(ref) - stop
    assert all(np.array_equal(a, b) for a, b in zip(rest, ref[stop:], strict=True))
