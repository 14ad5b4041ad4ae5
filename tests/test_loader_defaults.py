"""The Loader's default ``num_workers`` leaves the training process a core."""

from __future__ import annotations

from pathlib import Path

import pytest

import wdstream.read.torch.loader as loader_module
from wdstream import Loader
from wdstream.testing import write_synthetic_dataset


@pytest.mark.parametrize(("cores", "workers"), [(1, 0), (2, 1), (3, 2), (5, 4), (64, 4)])
def test_default_workers_leave_a_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, workers: int
) -> None:
    write_synthetic_dataset(str(tmp_path), n_docs=20, sample_tokens=33, samples_per_shard=9)
    monkeypatch.setattr(loader_module, "_usable_cores", lambda: cores)
    loader = Loader(str(tmp_path), seq_len=32, batch_size=2)
    assert loader.num_workers == workers
    # Given explicitly, num_workers is taken as is.
    assert Loader(str(tmp_path), seq_len=32, batch_size=2, num_workers=3).num_workers == 3
