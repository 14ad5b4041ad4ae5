"""A mixture's one-pass fill (``read/mixture/fill.py``): what it reads and checks per chunk.

A chunk enters a source's next window with few of its rows (a mixture's chunk holds only
that source's share of them); a local source must read that window whole where its rows
need it, not its few samples alone first and the window again behind them: only an
iteration's first rows are read alone (its first batch waits for them only). And the
copy-time ids check of a fill's rows is one max over the whole block where every source
has the same vocabulary limit, else per source.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdstream.read.order.window_reads as window_reads
from wdstream import Loader
from wdstream.read.mixture.fill import _admitted, block_runs, source_runs
from wdstream.read.mixture.schedule import Schedule, SchedulePiece
from wdstream.read.sources.vouch import IdLimit
from wdstream.testing import write_synthetic_dataset


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two sources of ~3 windows of 128 samples an epoch each."""
    root = tmp_path_factory.mktemp("fill")
    for i, name in enumerate(("web", "code")):
        write_synthetic_dataset(str(root / name), n_docs=400, sample_tokens=17,
                                samples_per_shard=40, seed=i)  # fmt: skip
    return {"web": str(root / "web"), "code": str(root / "code")}


def test_a_local_source_reads_samples_alone_only_for_the_first_rows(
    sources: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    alone = window_reads.samples_alone

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(args[3]))  # the emitted samples read alone
        return alone(*args, **kwargs)

    monkeypatch.setattr(window_reads, "samples_alone", counted)
    loader = Loader(sources, weights={"web": 0.5, "code": 0.5}, seq_len=16, batch_size=2,
                    chunk_batches=2, shuffle_window=128, shuffle_lanes=2, seed=3,
                    num_workers=0)  # fmt: skip
    it = iter(loader)
    next(it)
    first = len(calls)
    assert 1 <= first <= 2  # each source's window of the first batch: its rows alone
    # 1,200 rows of each source's epoch of ~3,600 (29 windows): each later window is
    # entered by a chunk with 2 of its 128 samples, and read whole there (18 read alone
    # first before).
    for _ in itertools.islice(it, 1200):
        pass
    assert len(calls) == first


def _orders(*limits: IdLimit | None) -> list[tuple[Any, int]]:
    return [(SimpleNamespace(source=SimpleNamespace(id_limit=x)), 0) for x in limits]


def test_the_whole_block_is_checked_at_once_only_under_one_limit() -> None:
    block = np.arange(64, dtype=np.int32).reshape(4, 16)
    web, code = IdLimit(100, False, "web/index.json"), IdLimit(100, False, "code/index.json")
    assert _admitted(_orders(web, code), block)  # same vocabulary, named apart
    assert not _admitted(_orders(IdLimit(50, False, "web"), IdLimit(50, False, "code")), block)
    # A limit that differs (the loss bit, the vocabulary, none): each source on its own.
    assert not _admitted(_orders(web, IdLimit(100, True, "code")), block)
    assert not _admitted(_orders(web, IdLimit(200, False, "code")), block)
    assert not _admitted(_orders(web, None), block)
    assert _admitted(_orders(None, None), block)
    masked = block | np.int32(-(2**31))  # bit 31 set: the sign of the int32 block
    assert _admitted(_orders(IdLimit(100, True, "a"), IdLimit(100, True, "b")), masked)
    assert not _admitted(_orders(web, code), masked)


def test_sources_sharing_a_vocabulary_read_with_workers_as_without(
    sources: dict[str, str],
) -> None:
    opts: dict[str, Any] = dict(weights={"web": 0.6, "code": 0.4}, seq_len=16, batch_size=3,
                                chunk_batches=2, shuffle_window=128, shuffle_lanes=2, seed=4)  # fmt: skip
    want = [b["input_ids"] for b in itertools.islice(Loader(sources, num_workers=0, **opts), 40)]
    got = [b["input_ids"] for b in itertools.islice(Loader(sources, num_workers=2, **opts), 40)]
    assert all(bool((a == b).all()) for a, b in zip(want, got, strict=True))


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.integers(0, 9), min_size=2, max_size=4).filter(lambda w: sum(w) > 0),
    later=st.lists(st.integers(1, 9), min_size=2, max_size=4),
    boundary=st.integers(1, 40),
    row=st.integers(0, 400),
    n=st.integers(1, 130),
    epoch_rows=st.integers(1, 60),
)
def test_a_blocks_runs_are_those_of_locating_every_row(
    weights: list[int], later: list[int], boundary: int, row: int, n: int, epoch_rows: int
) -> None:
    """Consecutive rows' runs from the cached Block (``fill_block``: a chunk of one rank)
    are those located row by row and sorted (``fill_rows`` of any rows), in a schedule's
    first piece, its second (indices counted on from the first's) and across the two
    (no block there), with runs split at sources' epoch ends; asked twice (the cache's
    second answer)."""
    k = len(weights)
    later = (later * k)[:k]
    sched = Schedule([SchedulePiece(0, 0, tuple(weights)),
                      SchedulePiece(1, boundary, tuple(later))])  # fmt: skip
    per_epoch = [epoch_rows + 7 * i for i in range(k)]
    rows = np.arange(row, row + n, dtype=np.int64)
    src, idx = sched.locate(rows)
    want, placed = source_runs(src, idx, per_epoch)
    for _ in range(2):
        found = sched.block(row, n)
        if row < boundary < row + n:
            assert found is None
            return
        assert found is not None
        block, q = found
        got = block_runs(block, q, per_epoch)
        assert [r[:3] for r in got] == [r[:3] for r in want]
        assert [r[3].tolist() for r in got] == [r[3].tolist() for r in want]
        assert block.order.tolist() == placed.tolist() and block.source.tolist() == src.tolist()
        assert block.places(5).starts == (placed * 5).tolist()


def test_a_block_is_cached_read_only_per_place_in_the_period() -> None:
    """A block's arrays are shared by every chunk at its place in the period, so they
    are read-only (``fill_block`` hands the batches a copy of the sources)."""
    sched = Schedule([SchedulePiece(0, 0, (2, 1))])
    found = sched.block(0, 6)
    assert found is not None and not found[0].source.flags.writeable
    again = sched.block(3 * 6, 6)  # period 3: the same place
    assert again is not None and again[0] is found[0] and again[1] == 6


def test_a_chunks_sources_cross_to_the_training_process_as_one_buffer(
    sources: dict[str, str],
) -> None:
    """A torch worker pickles each chunk's cursors to the training process: the batches'
    ``source`` arrays go as one bytes object (16 arrays pickled one by one cost ~3x the CPU
    each way) and come back equal, writable, each batch its own row."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    loader = Loader(sources, weights={"web": 0.6, "code": 0.4}, seq_len=16, batch_size=3,
                    chunk_batches=4, num_workers=0)  # fmt: skip
    chunks = loader.dataset.iter_chunks(loader.dataset.position.copy())
    _, _, _, cursors = next(c for c in chunks if len(c[3]) > 1)  # past a first one-step chunk
    data = bytes(ForkingPickler.dumps(cursors))
    assert b"_reconstruct" not in data  # no numpy array pickled on its own
    back = pickle.loads(data)
    assert [{k: v for k, v in c.items() if k != "source"} for c in back] == [
        {k: v for k, v in c.items() if k != "source"} for c in cursors
    ]
    for mine, theirs in zip(back, cursors, strict=True):
        assert mine["source"].dtype == np.int64 and mine["source"].flags.writeable
        assert mine["source"].tolist() == theirs["source"].tolist()
    back[0]["source"][:] = 9
    assert back[1]["source"].tolist() == cursors[1]["source"].tolist()
