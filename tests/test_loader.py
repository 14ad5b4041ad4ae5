"""Loader and TokenDataset: shapes, coverage, sources, options, torch loaders."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import wdstream
from wdstream import Loader, StateMismatchError, TokenDataset
from wdstream.testing import restored_after, write_synthetic_dataset

KW = {"shuffle_window": 16, "shuffle_lanes": 4}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("loader"))
    write_synthetic_dataset(d, n_docs=150, sample_tokens=33, samples_per_shard=9)
    return d


def rows_of(batch: dict) -> np.ndarray:
    """The [B, T+1] rows a batch was cut from."""
    return np.concatenate([batch["input_ids"].numpy(), batch["labels"].numpy()[:, -1:]], axis=1)


def epoch_tokens(batches: list[dict]) -> np.ndarray:
    return np.concatenate([rows_of(b).ravel() for b in batches]) if batches else np.zeros(0)


def test_batch_shapes_dtypes_and_shift(tmp_path) -> None:
    # total tokens a multiple of 33: no short last sample, so rows stay sample-aligned
    write_synthetic_dataset(
        str(tmp_path), doc_lens=[10, 50, 39] * 30, sample_tokens=33, samples_per_shard=9
    )
    loader = Loader(str(tmp_path), seq_len=32, batch_size=4, num_workers=0, epochs=1, **KW)
    n = len(loader)
    batches = list(loader)
    assert len(batches) == n > 0
    for b in batches:
        x, y = b["input_ids"], b["labels"]
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (4, 32)
        assert x.is_contiguous() and y.is_contiguous()
        assert torch.equal(x[:, 1:], y[:, :-1])
    # same seq_len as packed: every row is one whole sample of consecutive token ids
    for r in np.concatenate([rows_of(b) for b in batches]):
        assert r[0] % 33 == 0 and np.all(np.diff(r) == 1)


@pytest.mark.parametrize("seq_len", [32, 20, 50])
def test_one_epoch_no_duplicates_bounded_remainder(root: str, seq_len: int) -> None:
    total = json.load(open(f"{root}/index.json"))["shards"]
    n_tokens = sum(s["tokens"] for s in total)
    loader = Loader(root, seq_len=seq_len, batch_size=3, num_workers=0, epochs=1, streams=2, **KW)
    toks = epoch_tokens(list(loader))
    assert len(np.unique(toks)) == len(toks)  # each token at most once per epoch
    assert n_tokens - len(toks) < 2 * (3 * (seq_len + 1) + 33) + 2 * 33


def test_epochs_iter_continues_and_reshuffles(root: str) -> None:
    loader = Loader(root, seq_len=32, batch_size=4, num_workers=0, epochs=1, **KW)
    e0, e1 = list(loader), list(loader)
    assert len(e0) == len(e1) > 0
    assert not np.array_equal(epoch_tokens(e0), epoch_tokens(e1))
    assert loader.state_dict()["step"] == 2 * len(loader)  # the start of epoch 2
    two = Loader(root, seq_len=32, batch_size=4, num_workers=0, epochs=2, **KW)
    assert np.array_equal(epoch_tokens(list(two)), epoch_tokens(e0 + e1))


def test_infinite_by_default(root: str) -> None:
    loader = Loader(root, seq_len=32, batch_size=4, num_workers=0, **KW)
    n = len(loader)
    it = iter(loader)
    got = [next(it) for _ in range(2 * n + 3)]
    assert len(got) == 2 * n + 3


def test_no_shuffle_is_dataset_order(root: str) -> None:
    loader = Loader(root, seq_len=32, batch_size=2, num_workers=0, epochs=1, shuffle=False)
    toks = epoch_tokens(list(loader))
    assert np.array_equal(toks, np.arange(len(toks)))


def test_brace_list_and_scan_fallback_give_same_batches(tmp_path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_synthetic_dataset(a, n_docs=80, sample_tokens=33, samples_per_shard=9)
    idx = write_synthetic_dataset(
        b, n_docs=80, sample_tokens=33, samples_per_shard=9, sidecars=False, write_index=False
    )
    n = len(idx.shards)
    opts = dict(seq_len=32, batch_size=2, num_workers=0, epochs=1, **KW)
    want = epoch_tokens(list(Loader(a, **opts)))
    brace = f"{a}/data-{{000000..{n - 1:06d}}}.tar"
    assert np.array_equal(epoch_tokens(list(Loader(brace, **opts))), want)
    urls = [f"{b}/data-{i:06d}.tar" for i in range(n)]
    assert np.array_equal(epoch_tokens(list(Loader(urls, **opts))), want)


def test_docs_mode(tmp_path) -> None:
    write_synthetic_dataset(str(tmp_path), n_docs=120, mode="docs", samples_per_shard=7)
    loader = Loader(str(tmp_path), seq_len=40, batch_size=2, num_workers=0, epochs=1, streams=3,
                    return_doc_boundaries=True, **KW)  # fmt: skip
    n = len(loader)  # batches of the current epoch (in docs mode it varies by epoch)
    batches = list(loader)
    assert len(batches) == n > 0
    toks = epoch_tokens(batches)
    assert len(np.unique(toks)) == len(toks)


def test_doc_boundaries(tmp_path) -> None:
    lens = [5, 40, 3, 70, 12] * 20
    write_synthetic_dataset(str(tmp_path), doc_lens=lens, sample_tokens=25, samples_per_shard=6)
    doc_start = set(np.concatenate([[0], np.cumsum(lens)[:-1]]).tolist())
    loader = Loader(str(tmp_path), seq_len=24, batch_size=3, num_workers=0, epochs=1,
                    return_doc_boundaries=True, **KW)  # fmt: skip
    for b in loader:
        x, pos, cu = b["input_ids"], b["position_ids"], b["cu_seqlens"]
        assert pos.shape == x.shape and cu.dtype == torch.int32
        for r in range(x.shape[0]):
            for t in range(x.shape[1]):
                tok = int(x[r, t])
                # a piece starts at row start, at a document start, or at a sample start
                # (a sample boundary in the shuffled stream: its first token is a multiple of 25)
                new = t == 0 or tok in doc_start or tok % 25 == 0
                assert (int(pos[r, t]) == 0) == new, (r, t, tok)
        flat = pos.reshape(-1)
        want = torch.nonzero(flat == 0).reshape(-1).tolist() + [flat.numel()]
        assert cu.tolist() == want


def test_workers_match_in_process(root: str) -> None:
    opts = dict(seq_len=20, batch_size=2, epochs=1, streams=2, chunk_batches=3, **KW)
    ref = epoch_tokens(list(Loader(root, num_workers=0, **opts)))
    got = epoch_tokens(list(Loader(root, num_workers=2, **opts)))
    assert np.array_equal(ref, got)


def test_dataset_with_plain_dataloader(root: str) -> None:
    ds = TokenDataset(root, 32, 4, streams=2, epochs=1, **KW)
    want = epoch_tokens(list(ds))
    ds2 = TokenDataset(root, 32, 4, streams=2, epochs=1, **KW)
    got = epoch_tokens(list(DataLoader(ds2, batch_size=None, num_workers=2)))
    assert np.array_equal(got, want)
    assert len(ds2) == len(want) // (4 * 33)


def test_dataset_with_stateful_dataloader(root: str) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make() -> StatefulDataLoader:
        ds = TokenDataset(root, 32, 4, streams=2, epochs=1, **KW)
        return StatefulDataLoader(ds, batch_size=None, num_workers=2)

    dl = make()
    ref = [rows_of(b) for b in dl]
    for stop in [0, 1, 5, len(ref) - 1]:
        rest = [rows_of(b) for b in restored_after(make, stop)]
        assert len(rest) == len(ref) - stop
        assert all(np.array_equal(a, b) for a, b in zip(rest, ref[stop:], strict=True)), stop


def test_state_mismatch_is_refused(root: str, tmp_path) -> None:
    # Per-rank streams: their state belongs to one world size, stream count and batch size.
    # (The global order's state loads on any of these: tests/test_global_order.py.)
    opts = dict(seq_len=32, batch_size=4, num_workers=0, seed=1, order="streams", **KW)
    loader = Loader(root, **opts)
    state = loader.state_dict()
    assert len(json.dumps(state)) < 2000
    for kw in [dict(seed=2), dict(world_size=2, rank=0), dict(streams=2), dict(batch_size=2)]:
        other = Loader(root, **{**opts, **kw})
        with pytest.raises(StateMismatchError):
            other.load_state_dict(state)
    write_synthetic_dataset(str(tmp_path), n_docs=151, sample_tokens=33, samples_per_shard=9)
    with pytest.raises(StateMismatchError, match="dataset"):
        Loader(str(tmp_path), **opts).load_state_dict(state)
    with pytest.raises(StateMismatchError):
        loader.load_state_dict({"version": 99})


def test_rank_from_env(root: str, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = Loader(root, seq_len=32, batch_size=2, num_workers=0, **KW)
    assert (loader.rank, loader.world_size) == (1, 3)


@pytest.mark.parametrize("order", ["global", "streams"])
def test_too_small_dataset_raises(root: str, order: str) -> None:
    with pytest.raises(ValueError, match="too small"):
        next(iter(Loader(root, seq_len=32, batch_size=1000, num_workers=0, order=order)))


def test_exports() -> None:
    assert wdstream.__all__ == sorted(wdstream.__all__)
    assert {"Loader", "TokenDataset"} <= set(wdstream.__all__)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_prefetch(root: str) -> None:
    opts = dict(seq_len=32, batch_size=4, epochs=1, **KW)
    ref = list(Loader(root, num_workers=0, **opts))
    got = list(
        Loader(root, num_workers=2, streams=2, device="cuda", return_doc_boundaries=True, **opts)
    )
    cpu = list(Loader(root, num_workers=0, streams=2, **opts))
    assert len(got) == len(ref)
    for a, b in zip(got, cpu, strict=True):
        assert a["input_ids"].is_cuda and torch.equal(a["input_ids"].cpu(), b["input_ids"])
