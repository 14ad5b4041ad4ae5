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

import wdstream.read.order.window_reads as window_reads
from wdstream import Loader
from wdstream.read.mixture.fill import _admitted
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
