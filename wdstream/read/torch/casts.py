"""The int64 copies the training process makes of a chunk's int32 rows: each batch's
``input_ids`` and ``labels`` (:func:`batch_casts`, for
:func:`~wdstream.read.torch.dataset.chunk_to_batches`) and its ``position_ids``
(:func:`long_copy`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from wdstream.read.batches.rows import IGNORE_INDEX, copy_ids
from wdstream.read.torch.host_buffers import HostBuffers

__all__ = ["batch_casts", "long_copy"]


def long_copy(x: torch.Tensor, pin: bool, buffers: HostBuffers | None = None) -> torch.Tensor:
    """A contiguous int64 copy of ``x`` (page-locked if ``pin``; else in an array of
    ``buffers`` if given).

    On the CPU the cast goes through numpy: one thread, in the caller's. torch's own cast
    splits a chunk over its intra-op OpenMP threads, and on a busy 2-core host waking that
    team cost 10-45x the copy (12 ms instead of 0.26 ms for a [128, 2048] chunk, measured).
    """
    if x.device.type != "cpu":
        return x.to(torch.int64, memory_format=torch.contiguous_format)
    out = _long_empty(x, pin, buffers)
    np.copyto(out.numpy(), x.numpy())
    return out


def _long_empty(x: torch.Tensor, pin: bool, buffers: HostBuffers | None) -> torch.Tensor:
    """An uninitialised int64 CPU tensor shaped as ``x`` (page-locked if ``pin``; else an
    array of ``buffers`` if given), to be filled."""
    if buffers is not None and not pin:
        return torch.from_numpy(buffers.int64(tuple(x.shape)))
    return torch.empty(tuple(x.shape), dtype=torch.int64, pin_memory=pin)


def _cast_rows(
    out_ids: np.ndarray,
    out_targets: np.ndarray,
    ids: np.ndarray,
    targets: np.ndarray,
    stored: np.ndarray | None,
) -> None:
    """Cast rows of a chunk into their int64 ``input_ids`` and ``labels``; with ``stored``
    (the rows as stored, int32, carrying the no-loss bit) the bit is stripped in the copy
    and the targets it marks set to -100 (:meth:`RowLabels.split_chunk`)."""
    strip = stored is not None
    copy_ids(out_ids, ids, strip)
    copy_ids(out_targets, targets, strip)
    if stored is not None:
        np.copyto(out_targets, IGNORE_INDEX, where=stored[:, 1:] < 0)


def batch_casts(
    ids: torch.Tensor,
    targets: torch.Tensor,
    stored: np.ndarray | None,
    batch_size: int,
    pin: bool,
    buffers: HostBuffers | None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each batch's int64 contiguous ``input_ids`` and ``labels``, cast from a chunk's
    ``ids`` and ``targets`` as the batch is asked for.

    On the CPU with ``buffers`` (a ``Loader``'s training process) every batch is cast into
    arrays of its own from the pool: the two or three batches alive at once reuse a few
    arrays of 128 KB that stay in the cache, where arrays of a chunk's size (2 MB each,
    4 alive at once) were written out to memory and a fresh process faulted each page of
    them in (~3,000 page faults in a short epoch; the cast of 16 batches into reused
    per-batch arrays took 0.11 ms against 0.22 ms into reused chunk arrays and 1.2 ms into
    fresh ones, measured). Otherwise one array per chunk and each batch a row slice of it:
    a device's cast is one op, and pinned memory is allocated per chunk; on the CPU the
    first batch's rows are cast before it goes, the rest in one call as the second is
    asked for (the first batch waits for its own rows only).
    """
    n, B = ids.shape[0], batch_size
    if ids.device.type != "cpu":
        all_ids, all_targets = long_copy(ids, pin), long_copy(targets, pin)
        for a in range(0, n, B):
            yield all_ids[a : a + B], all_targets[a : a + B]
        return
    src_ids, src_targets = ids.numpy(), targets.numpy()
    if buffers is not None and not pin:
        shape = (B, ids.shape[1])
        for a in range(0, n, B):
            out_ids, out_targets = buffers.int64(shape), buffers.int64(shape)
            _cast_rows(out_ids, out_targets, src_ids[a : a + B], src_targets[a : a + B],
                       None if stored is None else stored[a : a + B])  # fmt: skip
            yield torch.from_numpy(out_ids), torch.from_numpy(out_targets)
        return
    all_ids, all_targets = _long_empty(ids, pin, None), _long_empty(targets, pin, None)
    for a in range(0, n, B):
        if a <= B:
            cast = slice(a, a + B) if a == 0 else slice(B, n)
            _cast_rows(all_ids[cast].numpy(), all_targets[cast].numpy(), src_ids[cast],
                       src_targets[cast], None if stored is None else stored[cast])  # fmt: skip
        yield all_ids[a : a + B], all_targets[a : a + B]
