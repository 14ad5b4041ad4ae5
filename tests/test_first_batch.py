"""A fresh loader's first batch waits for its own rows only, and they are the same rows.

Without workers the first chunk of an iteration is one step, and its rows read their few
samples alone (``GlobalOrder._samples_alone``) with the window's whole read started behind
them. The oracle is the whole-window path (every window read whole): every batch must be
equal, tokens, labels and document boundaries alike. (That the one-step first chunk gives
the batches of ``K``-step chunks is what the golden-order tests pin.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from wdstream import Loader
from wdstream.read.order import global_order
from wdstream.testing import write_synthetic_dataset


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~170 shards of 8 samples of 17 tokens: the first window (1,024 samples) spans 128."""
    root = tmp_path_factory.mktemp("many")
    write_synthetic_dataset(str(root), n_docs=160, sample_tokens=17, samples_per_shard=8)
    return root


def _loader(root: Path, **kw: Any) -> Loader:
    return Loader(str(root), seq_len=16, batch_size=4, seed=3, num_workers=0, epochs=1, **kw)


def _batches(loader: Loader, n: int) -> list[dict[str, torch.Tensor]]:
    out = []
    for b in loader:
        out.append({k: v.clone() for k, v in b.items()})
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("boundaries", [False, True])
def test_the_first_batches_equal_the_whole_window_path(
    many_shards: Path, monkeypatch: pytest.MonkeyPatch, boundaries: bool
) -> None:
    fast = _batches(_loader(many_shards, return_doc_boundaries=boundaries), 40)
    with monkeypatch.context() as m:
        m.setattr(global_order, "_ALONE_SHARE", 10**9)  # no rows few enough: whole windows
        whole = _batches(_loader(many_shards, return_doc_boundaries=boundaries), 40)
    assert len(fast) == len(whole) == 40
    for a, b in zip(fast, whole, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_first_batch_reads_its_rows_shards_only(
    many_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = _loader(many_shards)
    order = loader.dataset.sequence.order  # type: ignore[attr-defined]
    started: list[tuple[int, int, bool]] = []
    monkeypatch.setattr(order._cache, "_submit", started.append)  # no read-ahead runs
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (4, 16)
    # 4 rows of one sample each (seq_len + 1 = sample_tokens): at most 4 shards read, of
    # the 128 the first window spans; the window's whole read was started behind them.
    assert 1 <= len(order.source._cache) <= 4
    assert started == [(0, 0, False)]
    assert len(order.window(0, 0).positions) == 1024
