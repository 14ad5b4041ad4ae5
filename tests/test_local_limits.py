"""Local reads stay within bounded resources, and a damaged sidecar is named, not an IndexError."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from wdstream import CorruptShardError, Loader
from wdstream.format.index import DatasetIndex
from wdstream.format.sidecar import ShardSidecar
from wdstream.storage import LocalStore, local
from wdstream.testing import rewrite_index, write_synthetic_dataset


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_store_keeps_a_bounded_number_of_files_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local._MAPPED, "limit", 64)  # the process's maps, over every store
    for i in range(300):
        (tmp_path / f"f{i:03d}").write_bytes(bytes([i % 256]) * 100)
    store = LocalStore(tmp_path)
    before = _open_fds()
    for i in range(300):
        assert store.read_range(f"f{i:03d}", 10, 12) == bytes([i % 256]) * 2
    assert _open_fds() - before <= 64 + 2  # the map cache, plus slack for the interpreter
    store.close()
    assert _open_fds() <= before + 2


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_loader_over_many_shards_does_not_pile_up_open_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local._MAPPED, "limit", 64)
    write_synthetic_dataset(str(tmp_path), n_docs=400, sample_tokens=9, samples_per_shard=1)
    assert len(DatasetIndex.from_json((tmp_path / "index.json").read_text()).shards) > 200
    before = _open_fds()
    loader = Loader(str(tmp_path), seq_len=8, batch_size=4, num_workers=0, epochs=1)
    assert sum(1 for _ in loader) == len(loader)
    assert _open_fds() - before <= 64 + 8


def test_sidecar_shorter_than_the_index_names_the_file(tmp_path: Path) -> None:
    write_synthetic_dataset(str(tmp_path), n_docs=40, sample_tokens=17, samples_per_shard=7)
    side_path = tmp_path / "data-000000.idx"
    side = ShardSidecar.from_bytes(side_path.read_bytes())
    short = ShardSidecar(side.offsets[:3], side.sizes[:3], side.tokens[:3], side.crc32c[:3])
    side_path.write_bytes(short.to_bytes())
    loader = Loader(str(tmp_path), seq_len=16, batch_size=2, shuffle=False, num_workers=0)
    with pytest.raises(CorruptShardError, match=r"data-000000\.idx: sha256 .* differs"):
        next(iter(loader))
    # Even with index.json edited to carry the short sidecar's hash, the counts disagree.
    index = json.loads((tmp_path / "index.json").read_text())
    index["shards"][0]["sidecar_sha256"] = hashlib.sha256(short.to_bytes()).hexdigest()
    rewrite_index(str(tmp_path), index)  # index.json and its shard table
    loader = Loader(str(tmp_path), seq_len=16, batch_size=2, shuffle=False, num_workers=0)
    with pytest.raises(CorruptShardError, match=r"data-000000\.idx: 3 samples, index.json says 7"):
        next(iter(loader))
