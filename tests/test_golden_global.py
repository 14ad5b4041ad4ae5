"""Pinned global batch order for one small dataset and seed: catches accidental order changes.

Pinned for 0, 1 and 2 workers and, through rank 1 of 2 and the single-rank run, for two
world sizes: the global order (``order="global"``) is a function of the dataset, seed,
``seq_len`` and global batch only. If this fails after an intended change of the sequence,
every saved global state changes meaning too: bump ``GLOBAL_STATE_VERSION`` and re-pin.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

# First token of each row of rank 1 of 2's first 6 batches (global batch 4, K=2, seed 1234).
GOLDEN = [[1656, 1665], [873, 3447], [3240, 864], [3249, 891], [4518, 2673], [4527, 4509]]
# sha256 of rank 1's input_ids (little-endian int64) over the whole first epoch.
GOLDEN_EPOCH_SHA256 = "2fc73c403f7d3a4f708e9b0108e0b7afa1eb5cf0982eab62de31acbb42de53bd"
STEPS_PER_EPOCH = 159
OPTS = dict(seq_len=8, chunk_batches=2, seed=1234, shuffle_window=6, shuffle_lanes=2,
            epochs=1, order="global")  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("golden")
    write_synthetic_dataset(str(root), n_docs=40, sample_tokens=9, samples_per_shard=4, seed=1)
    return str(root)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_golden_global_order(dataset: str, workers: int) -> None:
    loader = Loader(dataset, batch_size=2, num_workers=workers, world_size=2, rank=1, **OPTS)
    assert len(loader) == STEPS_PER_EPOCH
    batches = [b["input_ids"].numpy() for b in loader]
    assert len(batches) == STEPS_PER_EPOCH
    assert [b[:, 0].tolist() for b in batches[:6]] == GOLDEN
    digest = hashlib.sha256()
    for b in batches:
        digest.update(np.ascontiguousarray(b, dtype="<i8").tobytes())
    assert digest.hexdigest() == GOLDEN_EPOCH_SHA256


def test_one_rank_holds_both_halves(dataset: str) -> None:
    one = Loader(dataset, batch_size=4, num_workers=0, **OPTS)
    firsts = [b["input_ids"][2:, 0].tolist() for _, b in zip(range(6), one, strict=False)]
    assert firsts == GOLDEN  # rank 1 of 2 is the second half of every global batch
