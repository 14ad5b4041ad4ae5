"""``GlobalOrder.fill`` with ``into`` (a mixture fills each source's rows straight into their
places in the batch) writes exactly the rows the contiguous fill writes, in the rows named,
and nothing else: tokens and document starts, for rows that cut samples and samples that
cut rows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from wdstream.read.order.global_order import GlobalOrder, OrderConfig
from wdstream.read.order.row_places import RowPlaces
from wdstream.read.order.window_data import WindowData, copy_rows
from wdstream.read.sources.packed import ShardSource
from wdstream.testing import write_synthetic_dataset


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    concat = str(tmp_path_factory.mktemp("concat"))
    write_synthetic_dataset(concat, n_docs=80, sample_tokens=17, samples_per_shard=7)
    docs = str(tmp_path_factory.mktemp("docs"))
    write_synthetic_dataset(docs, n_docs=120, mode="docs", samples_per_shard=9)
    return {"concat": concat, "docs": docs}


@pytest.mark.parametrize("kind", ["concat", "docs"])
@pytest.mark.parametrize("seq_len", [16, 6, 40])  # rows of one sample, in one, across many
def test_fill_into_rows_is_the_contiguous_fill_placed(
    roots: dict[str, str], kind: str, seq_len: int
) -> None:
    order = GlobalOrder(ShardSource(roots[kind]), OrderConfig(seq_len, 1, True, 3, 10, 3))
    T1, rng = seq_len + 1, np.random.default_rng(0)
    for epoch, first, n in [(0, 0, 5), (0, 7, 13), (1, 3, 1), (1, 0, order.rows_per_epoch)]:
        want = np.zeros((n, T1), dtype=np.int32)
        want_ds = np.zeros((n, T1), dtype=bool)
        order.fill(epoch, first, want, want_ds)
        block = 2 * n + 3
        into = np.sort(rng.choice(block, size=n, replace=False)).astype(np.int64)
        got = np.full((block, T1), -7, dtype=np.int32)
        got_ds = np.ones((block, T1), dtype=bool)
        assert order.fill(epoch, first, got, got_ds, into) == []
        assert np.array_equal(got[into], want)
        assert np.array_equal(got_ds[into], want_ds)
        rest = np.setdiff1d(np.arange(block), into)
        assert (got[rest] == -7).all() and got_ds[rest].all()  # other rows untouched
    assert want_ds[:, 1:].any()  # over a whole epoch, pieces start inside rows: tested


def test_row_places_copy_splits_a_piece_at_row_ends() -> None:
    places = RowPlaces(np.array([3, 0, 2], dtype=np.int64), 4)
    flat = np.full(16, -1, dtype=np.int64)
    places.copy(flat, 2, np.arange(100, 109))  # tokens 2..10 of rows 0, 1, 2 (4 tokens each)
    assert flat.reshape(4, 4).tolist() == [
        [102, 103, 104, 105],  # filled row 1
        [-1, -1, -1, -1],
        [106, 107, 108, -1],  # filled row 2
        [-1, -1, 100, 101],  # filled row 0, from its token 2
    ]
    assert places.flat(np.array([0, 5, 9])).tolist() == [12, 1, 9]


def _no_source(window: int) -> ShardSource:
    """``copy_rows``'s ``source_of``: asked only for a failed check's message (none here)."""
    raise AssertionError(f"no check fails here (window {window})")


def _placed(takes: list[int], T1: int) -> tuple[list[list[int]], list[list[int]]]:
    """``copy_rows`` of segments of ``takes`` tokens (one window, consecutive samples) into
    rows ``into`` of a block of 4 rows of ``T1`` (the rest -1), and what it must write."""
    n = sum(takes) // T1
    base = np.arange(100, 100 + sum(takes), dtype=np.int32)
    firsts = np.concatenate([[0], np.cumsum(takes)[:-1]]).tolist()
    data = WindowData([base], [0] * len(takes), firsts, [()] * len(takes))
    segments = [(0, i, 0, t) for i, t in enumerate(takes)]
    into = np.array([2, 0, 3, 1][:n], dtype=np.int64)
    flat = np.full(4 * T1, -1, dtype=np.int32)
    got = copy_rows(segments, {0: data}, lambda w: data, flat, None, T1, _no_source, False,
                    RowPlaces(into, T1))  # fmt: skip
    assert got == []
    want = np.full((4, T1), -1, dtype=np.int32)
    want[into] = base.reshape(n, T1)
    return flat.reshape(4, T1).tolist(), want.tolist()


@pytest.mark.parametrize(
    "takes",
    [
        [4, 4, 4],  # as many segments as rows, each a whole row: placed by index
        [6, 2, 4],  # as many segments as rows, not whole: placed by offset
        [4, 6, 2],  # whole rows first, then not
        [2, 4, 6],  # a segment of a row's tokens, not from its start
        [4, 2, 2, 4],  # more segments than rows
    ],
)
def test_copy_rows_places_each_segment_where_its_tokens_go(takes: list[int]) -> None:
    """``copy_rows`` with places writes token ``o`` of the filled rows to row
    ``into[o // T1]``, column ``o % T1``, however the segments cut the rows (a segment
    per whole row is placed by its index: the count alone does not make it so)."""
    got, want = _placed(takes, 4)
    assert got == want


def test_copy_rows_places_every_cut_into_as_many_segments_as_rows() -> None:
    """Every way to cut 1-4 rows of 4 tokens into as many segments as rows (518 cuts: the
    count that lets ``copy_rows`` place whole rows by index) is placed where its tokens go:
    also a row's length of tokens after a segment across two rows (``[4, 6, 4, 2]``), not
    at a row's start (fails with the index path kept after a segment across rows)."""
    for n in range(1, 5):
        for cuts in itertools.combinations(range(1, 4 * n), n - 1):
            takes = np.diff([0, *cuts, 4 * n]).tolist()
            got, want = _placed(takes, 4)
            assert got == want, takes
