"""Pinned batch order for one small dataset and seed: catches accidental shuffle changes.

If this fails after an intended change of the plan or shuffle, the order of every saved
cursor changes too: bump the state version and re-pin these values.
"""

from __future__ import annotations

from pathlib import Path

from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

# First token of each row of the first 6 batches of rank 1 of 2 (2 streams, K=2, seed 1234).
GOLDEN = [[414, 423], [207, 198], [2610, 2601], [63, 2619], [3420, 189], [3429, 5085]]


def test_golden_order(tmp_path: Path) -> None:
    write_synthetic_dataset(str(tmp_path), n_docs=40, sample_tokens=9, samples_per_shard=4, seed=1)
    loader = Loader(str(tmp_path), seq_len=8, batch_size=2, num_workers=0, streams=2,
                    chunk_batches=2, seed=1234, shuffle_window=6, shuffle_lanes=2,
                    world_size=2, rank=1)  # fmt: skip
    assert len(loader) == 158
    it = iter(loader)
    assert [next(it)["input_ids"][:, 0].tolist() for _ in range(6)] == GOLDEN
