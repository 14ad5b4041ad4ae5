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
    # chunk_batches=2: new int64 arrays every other batch (~170 chunks). Whether a call
    # handed out a kept array is told from the pool's list, left as it was (addresses
    # cannot tell: the allocator often maps a fresh array where a freed one was).
    loader = _loader(dataset, num_workers=0, chunk_batches=2)
    pool = loader._host
    take = pool.int64
    calls = {"reused": 0, "new": 0}

    def counted(shape: tuple[int, ...]) -> np.ndarray:
        arrays, ids = pool._arrays, [id(a) for a in pool._arrays]
        got = take(shape)
        same = pool._arrays is arrays and len(arrays) == len(ids) and id(got) in ids
        calls["reused" if same else "new"] += 1
        return got

    pool.int64 = counted  # type: ignore[method-assign]
    batches = sum(1 for _ in loader)
    assert batches > 200
    # The loop holds one chunk's batch while the next chunk is cut: a few new arrays at
    # the start (and the last, shorter chunk's), the rest reused.
    assert calls["new"] <= pool.keep and calls["reused"] > 300, calls


def test_an_array_still_viewed_is_not_handed_out() -> None:
    pool = HostBuffers(keep=2)
    # Held as the Loader's batches are: through tensors only.
    a = torch.from_numpy(pool.int64((3, 5)))[1:]
    b = torch.from_numpy(pool.int64((3, 5)))
    first = a.untyped_storage().data_ptr()
    assert b.data_ptr() != first
    c = pool.int64((3, 5))  # both kept arrays in use: a new one, not kept
    assert c.dtype == np.int64 and c.ctypes.data not in (first, b.data_ptr())
    del a, c
    again = torch.from_numpy(pool.int64((3, 5)))  # the free one again
    assert again.data_ptr() == first
    del again
    # Another shape takes the place of a free array: never more than keep arrays.
    other = torch.from_numpy(pool.int64((2, 2)))
    assert other.shape == (2, 2) and len(pool._arrays) == 2
    assert other.data_ptr() not in (first, b.data_ptr())
    assert not any(x.ctypes.data == first for x in pool._arrays)
