"""The training process's int64 arrays are reused only once no batch uses them.

Oracle: the batches of a second loader, each cloned as it arrives (no reuse can touch a
clone), against batches kept uncloned for a whole epoch while the loader went on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from wdstream import Loader
from wdstream.read.torch.host_buffers import HostBuffers
from wdstream.testing import write_synthetic_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("host")
    write_synthetic_dataset(str(root), n_docs=300, sample_tokens=33, samples_per_shard=16)
    return root


def _loader(root: Path, **kw: Any) -> Loader:
    return Loader(str(root), seq_len=32, batch_size=4, seed=5, epochs=1, **kw)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("boundaries", [False, True])
def test_batches_kept_by_the_caller_are_never_overwritten(
    dataset: Path, workers: int, boundaries: bool
) -> None:
    opts = {"num_workers": workers, "return_doc_boundaries": boundaries}
    kept = list(_loader(dataset, **opts))  # every batch held, none cloned
    cloned = [{k: v.clone() for k, v in b.items()} for b in _loader(dataset, **opts)]
    assert len(kept) == len(cloned) > 20
    for a, b in zip(kept, cloned, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_arrays_are_reused_once_the_batches_are_dropped(dataset: Path) -> None:
    # chunk_batches=2: a new chunk (new int64 arrays) every other batch, ~170 chunks.
    storages, chunks, last = set(), 0, None
    for batch in _loader(dataset, num_workers=0, chunk_batches=2):
        ptr = batch["input_ids"].untyped_storage().data_ptr()
        chunks += ptr != last
        storages.add(ptr)
        last = ptr
    # The loop holds one chunk's batch while the next chunk is cut: a few arrays in turn
    # (the last, shorter chunk has a shape of its own).
    assert chunks > 100 and len(storages) <= 2 * HostBuffers().keep, (chunks, len(storages))


def test_an_array_still_viewed_is_not_handed_out() -> None:
    pool = HostBuffers(keep=2)
    # Held as the Loader's batches are: through tensors only.
    a = torch.from_numpy(pool.int64((3, 5)))[1:]
    b = torch.from_numpy(pool.int64((3, 5)))
    assert b.data_ptr() != a.untyped_storage().data_ptr()
    first = a.untyped_storage().data_ptr()
    del a
    again = torch.from_numpy(pool.int64((3, 5)))  # the free one again
    assert again.data_ptr() == first
    assert pool.int64((2, 2)).shape == (2, 2)  # another shape: arrays of its own
    c = pool.int64((3, 5))  # both kept arrays in use: a new one, not kept
    assert c.dtype == np.int64 and c.ctypes.data not in (first, b.data_ptr())
    assert pool.int64((3, 5)) is not c
