"""Pinned batch order of the per-rank streams order for one small dataset and seed: catches
accidental shuffle changes (the global order has its own pin: ``tests/test_golden_global.py``).

The order is pinned for 0, 1 and 2 workers with ``order="streams"`` and ``streams=2`` fixed:
that order is a function of the streams, not of the worker processes serving them (README,
"Per-rank streams"), so all three must give the very same batches. With 2 workers the first
6 batches already come from both workers (chunks of K=2 batches, streams served round-robin).

If this fails after an intended change of the plan or shuffle, the order of every saved
cursor changes too: bump the state version and re-pin these values.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

# First token of each row of the first 6 batches of rank 1 of 2 (2 streams, K=2, seed 1234).
GOLDEN = [[414, 423], [207, 198], [2610, 2601], [63, 2619], [3420, 189], [3429, 5085]]
# sha256 of every batch's input_ids (little-endian int64) of that rank's whole first epoch.
GOLDEN_EPOCH_SHA256 = "f2a521f3e69f885df3899e2b8e1cf5796b0e487624d039f2d946d2c19096fe69"
BATCHES_PER_EPOCH = 158


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("golden")
    write_synthetic_dataset(str(root), n_docs=40, sample_tokens=9, samples_per_shard=4, seed=1)
    return str(root)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_golden_order(dataset: str, workers: int) -> None:
    loader = Loader(dataset, seq_len=8, batch_size=2, num_workers=workers, order="streams",
                    streams=2, chunk_batches=2, seed=1234, shuffle_window=6, shuffle_lanes=2,
                    world_size=2, rank=1, epochs=1)  # fmt: skip
    assert len(loader) == BATCHES_PER_EPOCH
    batches = [b["input_ids"].numpy() for b in loader]
    assert len(batches) == BATCHES_PER_EPOCH
    assert [b[:, 0].tolist() for b in batches[:6]] == GOLDEN
    digest = hashlib.sha256()
    for b in batches:
        digest.update(np.ascontiguousarray(b, dtype="<i8").tobytes())
    assert digest.hexdigest() == GOLDEN_EPOCH_SHA256
