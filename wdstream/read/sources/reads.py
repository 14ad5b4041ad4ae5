"""What one ranged read of a :class:`~wdstream.read.sources.packed.ShardSource` hands back:
each piece's tokens and document pieces, and the checksums its copier verifies itself."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wdstream.format.sample import LocatedTokens

__all__ = ["CopyChecks", "PieceRead"]


@dataclass(frozen=True)
class CopyChecks:
    """The per-sample checksums of one ranged read that its copier verifies itself: sample
    ``i`` of the read (sample ``first + i`` of ``shard``) is ``buf[offsets[i]:][:sizes[i]]``
    with CRC32C ``crcs[i]``; ``buf`` begins at shard byte ``begin`` (see
    :meth:`ShardSource.read` with ``verify=False``)."""

    buf: memoryview
    begin: int
    shard: int
    first: int
    offsets: np.ndarray  # int64[n], in ``buf``
    sizes: np.ndarray  # int64[n]
    crcs: np.ndarray  # uint32[n]


@dataclass(frozen=True)
class PieceRead:
    """What :meth:`ShardSource.read` gives for one piece: the samples' tokens, their
    document piece lengths (with ``docs``, else empty), and what verifies each sample when
    the caller checks them (``verify=False``, else None)."""

    tokens: LocatedTokens
    doc_lens: list[tuple[int, ...]]
    checks: CopyChecks | None
