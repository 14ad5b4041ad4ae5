"""Length-bucketed token-budget batches (``wdstream.read.batches.buckets``) over a docs-mode pack."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import wdstream
from tests.conftest import pack_docs_corpus
from wdstream.errors import StateMismatchError
from wdstream.read.batches.buckets import BucketedBatches, bucket_plan
from wdstream.read.batches.rows import IGNORE_INDEX
from wdstream.testing import assert_resumes_exactly


@given(
    st.lists(st.integers(0, 50), min_size=0, max_size=200),
    st.integers(50, 400),
    st.integers(0, 3),
    st.integers(1, 64),
)
def test_plan_holds_every_sample_once_within_budget(
    rows: list[int], budget: int, epoch: int, pool: int
) -> None:
    plan = bucket_plan(np.array(rows, dtype=np.int64), budget, seed=7, epoch=epoch, pool=pool)
    again = bucket_plan(np.array(rows, dtype=np.int64), budget, seed=7, epoch=epoch, pool=pool)
    assert [x.tolist() for x in plan] == [x.tolist() for x in again]  # deterministic
    got = np.concatenate(plan) if plan else np.zeros(0, np.int64)
    assert sorted(got.tolist()) == [i for i, n in enumerate(rows) if n > 0]
    for b in plan:
        assert len(b) >= 1 and len(b) * max(rows[i] for i in b) <= budget


def test_plan_refuses_a_row_over_the_budget() -> None:
    with pytest.raises(ValueError, match="max_tokens=10 is below the longest row"):
        bucket_plan(np.array([3, 11]), 10, 0, 0)


@pytest.fixture(scope="module")
def docs_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_docs_corpus(tmp_path_factory.mktemp("buckets"), 120, seed=2, stdlib_files=0)


SEQ, BUDGET = 128, 512


def _make(root: str, **kw: object) -> BucketedBatches:
    opts: dict = dict(seq_len=SEQ, max_tokens=BUDGET, seed=3, epochs=2, pool=32)
    return BucketedBatches(root, **{**opts, **kw})


def test_batches_hold_the_documents_padded_within_budget(docs_root: str) -> None:
    docs = [d.astype(np.int64) for d in wdstream.documents(docs_root)]
    seen = []
    it = _make(docs_root, epochs=1)
    for batch in it:
        B, T = batch["input_ids"].shape
        assert B * T <= BUDGET
        for r in range(B):
            n = int(batch["attention_mask"][r].sum())
            assert batch["attention_mask"][r, :n].all() and not batch["attention_mask"][r, n:].any()
            row = batch["input_ids"][r, :n].tolist() + [int(batch["labels"][r, n - 1])]
            seen.append(row)
            assert (batch["labels"][r, n:] == IGNORE_INDEX).all()
            assert batch["labels"][r, : n - 1].tolist() == row[1:n]
    # Documents longer than SEQ + 1 tokens are split into rows of SEQ inputs (neighbouring
    # rows share a token), never cropped (issue 23: this test expected the crop before).
    want = sorted(
        d[k : k + SEQ + 1].tolist() for d in docs if len(d) > 1 for k in range(0, len(d) - 1, SEQ)
    )
    assert any(len(d) > SEQ + 1 for d in docs)  # the split is exercised
    # The remainder of fewer batches than ranks: none with one rank.
    assert sorted(seen) == want


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_same_count_and_ranks_are_disjoint(docs_root: str, world: int) -> None:
    ranks = [list(_make(docs_root, rank=r, world_size=world, epochs=1)) for r in range(world)]
    assert len({len(r) for r in ranks}) == 1
    assert len(ranks[0]) == _make(docs_root, world_size=world).batches_per_epoch(0)
    rows = [
        tuple(b["input_ids"][i].tolist())
        for r in ranks
        for b in r
        for i in range(len(b["input_ids"]))
    ]
    assert len(rows) == len(set(rows))


def test_resumes_exactly_across_epochs(docs_root: str) -> None:
    n = _make(docs_root).batches_per_epoch(0)
    assert_resumes_exactly(lambda: _make(docs_root), check_at=[0, 1, n - 1, n, n + 2, 2 * n])


def test_epochs_are_shuffled_differently(docs_root: str) -> None:
    it = _make(docs_root)
    assert [b.tolist() for b in it.plan(0)] != [b.tolist() for b in it.plan(1)]


def test_refusals(docs_root: str, tmp_path: Path) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps({"text": "hello world " * 50}) + "\n")
    wdstream.pack([str(src)], str(tmp_path / "c"), seq_len=31, workers=0)
    with pytest.raises(ValueError, match="--mode docs.*mode is concat"):
        BucketedBatches(str(tmp_path / "c"), seq_len=SEQ, max_tokens=BUDGET)
    state = _make(docs_root).state_dict()
    with pytest.raises(StateMismatchError, match="differs in: max_tokens"):
        _make(docs_root, max_tokens=BUDGET * 2).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="batch: 1000000 past"):
        _make(docs_root).load_state_dict({**state, "batch": 10**6})
    assert torch.is_tensor(next(iter(_make(docs_root)))["input_ids"])


def test_loader_max_tokens_is_these_batches_and_resumes(docs_root: str) -> None:
    def loader() -> wdstream.Loader:
        return wdstream.Loader(docs_root, seq_len=SEQ, max_tokens=BUDGET, seed=3, epochs=1,
                               rank=1, world_size=2, num_workers=0)  # fmt: skip

    want = [
        b["input_ids"].tolist() for b in _make(docs_root, rank=1, world_size=2, epochs=1, pool=8192)
    ]
    assert [b["input_ids"].tolist() for b in loader()] == want
    assert len(loader()) == len(want)
    assert_resumes_exactly(loader, check_at=[0, 3, len(want)])
    with pytest.raises(TypeError, match="batch_at"):
        loader().batch_at(0)


def test_a_state_continues_on_another_world_size(docs_root: str) -> None:
    """The plan does not depend on the world size: after rank 0's state of a 2-rank run,
    1 rank yields the batches both ranks would have, in order; 3 ranks share them."""
    one = [b["input_ids"].tolist() for b in _make(docs_root, epochs=1)]
    two = _make(docs_root, rank=0, world_size=2, epochs=1)
    it = iter(two)
    for _ in range(3):
        next(it)
    state = two.state_dict()
    rest = _make(docs_root, epochs=1)
    rest.load_state_dict(state)
    assert [b["input_ids"].tolist() for b in rest] == one[6:]
    three = []
    for r in range(3):
        x = _make(docs_root, rank=r, world_size=3, epochs=1)
        x.load_state_dict(state)
        three.append([b["input_ids"].tolist() for b in x])
    assert len({len(t) for t in three}) == 1 and three[0]
    assert [b for step in zip(*three, strict=True) for b in step] == one[6 : 6 + 3 * len(three[0])]


def test_a_dataset_smaller_than_one_batch_size_reads_with_max_tokens(tmp_path: Path) -> None:
    """``batch_size`` does not apply to ``max_tokens`` batches: a docs dataset of fewer rows
    than one default global batch (8) is read whole, not refused as "too small" (issue 34:
    the global order's minimum was checked against the unused batch_size)."""
    root = pack_docs_corpus(tmp_path, 5, seed=2, stdlib_files=0)
    docs = [d.astype(np.int64).tolist() for d in wdstream.documents(root)]
    seq = max(len(d) for d in docs)  # every document one row
    loader = wdstream.Loader(root, seq_len=seq, max_tokens=4 * seq, seed=0, epochs=1)
    rows = []
    for batch in loader:
        for r in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][r].sum())
            rows.append(batch["input_ids"][r, :n].tolist() + [int(batch["labels"][r, n - 1])])
    assert len(docs) < 8
    assert sorted(rows) == sorted(d for d in docs if len(d) > 1)
