"""read.shards: ranged sample reads, and errors that name the shard and byte offset."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import wdstream
from wdstream.errors import CorruptShardError
from wdstream.read.sources.shards import iter_samples, read_index, read_samples, read_sidecar
from wdstream.storage import open_store


@pytest.fixture
def root(tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]) -> Path:
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:30])
    wdstream.pack([str(src)], str(tmp_path / "ds"), seq_len=47, shard_size="12KB", workers=0)
    return tmp_path / "ds"


def test_ranged_reads_match_full_iteration(root: Path) -> None:
    store = open_store(str(root))
    index = read_index(store)
    all_samples = [s for _, _, s in iter_samples(store, index)]
    assert len(all_samples) == index.total_samples
    shard = index.shards[1]
    sidecar = read_sidecar(store, shard)
    first = sum(s.samples for s in index.shards[:1])
    part = list(read_samples(store, shard.name, sidecar, 1, 3))
    for got, want in zip(part, all_samples[first + 1 : first + 3], strict=True):
        assert np.array_equal(got.tokens, want.tokens) and got.doc_lens == want.doc_lens
    assert int(sidecar.tokens.sum()) == shard.tokens


def test_truncated_shard_names_sample_and_offset(root: Path) -> None:
    store = open_store(str(root))
    index = read_index(store)
    shard = index.shards[0]
    sidecar = read_sidecar(store, shard)
    last = len(sidecar) - 1
    (root / shard.name).write_bytes(
        (root / shard.name).read_bytes()[: int(sidecar.offsets[last]) + 10]
    )
    store = open_store(str(root))
    with pytest.raises(
        CorruptShardError,
        match=rf"{shard.name}: sample {last} at byte {int(sidecar.offsets[last])}",
    ):
        list(read_samples(store, shard.name, sidecar, 0, len(sidecar)))


def test_corrupt_sidecar_is_named(root: Path) -> None:
    store = open_store(str(root))
    shard = read_index(store).shards[0]
    (root / shard.sidecar).write_bytes(b"\x93garbage")
    with pytest.raises(CorruptShardError, match=shard.sidecar):
        read_sidecar(open_store(str(root)), shard)
    with pytest.raises(CorruptShardError, match=shard.sidecar):
        list(wdstream.documents(str(root)))
