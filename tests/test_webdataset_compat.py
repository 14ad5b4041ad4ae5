"""Plain webdataset reads packed shards: default decoders, ``wds_decoder``, node/worker splits."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import torch
import webdataset as wds

import wdstream
from wdstream.read.sources.shards import iter_samples, read_index
from wdstream.storage import open_store
from wdstream.testing import write_synthetic_dataset


@pytest.fixture(scope="module", params=[2, 1], ids=["v2", "v1"])
def root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp(f"v{request.param}"))
    write_synthetic_dataset(
        d, n_docs=40, sample_tokens=33, samples_per_shard=7, version=request.param
    )
    return d


def shard_urls(root: str) -> list[str]:
    return [f"{root}/{s.name}" for s in read_index(open_store(root)).shards]


def expected(root: str) -> dict[str, list[int]]:
    """Every sample's tokens by webdataset key, read through wdstream's own reader."""
    store = open_store(root)
    samples = iter_samples(store, read_index(store))
    return {f"{n:012d}": s.tokens.tolist() for n, (_, _, s) in enumerate(samples)}


def sample_of(item: dict) -> dict:
    return item["mp"] if "mp" in item else item["msgpack"]


def test_wds_decoder_yields_the_packed_tokens(root: str) -> None:
    got = {
        s["__key__"]: sample_of(s)["input_ids"].tolist()
        for s in wds.WebDataset(shard_urls(root), shardshuffle=False).decode(wdstream.wds_decoder)
    }
    assert got == expected(root)


def test_v2_members_decode_with_webdatasets_defaults(tmp_path) -> None:
    write_synthetic_dataset(str(tmp_path), n_docs=5, sample_tokens=9, samples_per_shard=4)
    first = next(iter(wds.WebDataset(shard_urls(str(tmp_path)), shardshuffle=False).decode()))
    # No wdstream code involved: webdataset's own msgpack handler unpacks ``.mp``.
    assert isinstance(first["mp"], dict) and first["mp"]["dtype"] == "uint32"
    assert np.frombuffer(first["mp"]["tokens"], "<u4").tolist() == list(range(9))
    assert first["mp"] == msgpack.unpackb(msgpack.packb(first["mp"]))


def test_split_by_node_gives_disjoint_complete_shards(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = expected(root)
    seen: list[str] = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = wds.WebDataset(shard_urls(root), shardshuffle=False, nodesplitter=wds.split_by_node)
        part = [s["__key__"] for s in ds.decode(wdstream.wds_decoder)]
        assert part, f"rank {rank} got no samples"
        seen += part
    assert sorted(seen) == sorted(want) and len(seen) == len(set(seen))


def test_split_by_worker_in_a_real_dataloader(root: str) -> None:
    ds = wds.WebDataset(
        shard_urls(root),
        shardshuffle=False,
        nodesplitter=wds.single_node_only,
        workersplitter=wds.split_by_worker,
    ).decode(wdstream.wds_decoder)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = {s["__key__"]: sample_of(s)["input_ids"].tolist() for s in loader}
    assert got == expected(root)
