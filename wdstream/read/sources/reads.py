"""What a read of a packed source gives: each piece's tokens, what verifies them, and the
samples that stand in for ones that could not be read.

:meth:`ShardSource.read <wdstream.read.sources.packed.ShardSource.read>` gives a
:class:`PieceRead` per piece; with ``on_corrupt="mask"``
(:mod:`~wdstream.read.sources.quarantine`) a sample that cannot be read is replaced by as
many tokens as it holds, each the dataset's neutral id with bit 31 set, "no loss"
(:mod:`wdstream.format.loss`), and named in ``PieceRead.bad`` as a :class:`BadSample`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wdstream.format.index import DatasetIndex
from wdstream.format.loss import NO_LOSS_BIT
from wdstream.format.sample import LocatedTokens

__all__ = ["CHECKSUM_REASON", "BadSample", "CopyChecks", "PieceRead", "masked_tokens",
           "neutral_id"]  # fmt: skip

# The reason given for a sample whose bytes fail their CRC32C, whoever finds it (a read, or a
# torch worker's copy-time check): the same words either way, so events match at any
# worker count.
CHECKSUM_REASON = "checksum mismatch (corrupt bytes)"


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
class BadSample:
    """A sample replaced by masked tokens: its shard's URL, its index in that shard, the
    byte offset of its data (None when the sidecar that says it could not be read), and
    why it could not be delivered."""

    shard: str
    sample: int
    byte: int | None
    reason: str


@dataclass(frozen=True)
class PieceRead:
    """What :meth:`ShardSource.read` gives for one piece: the samples' tokens, their
    document piece lengths (with ``docs``, else empty), what verifies each sample when
    the caller checks them (``verify=False``, else None), and the samples that stand in
    for unreadable ones (by their index in the piece; only with ``on_corrupt="mask"``)."""

    tokens: LocatedTokens
    doc_lens: list[tuple[int, ...]]
    checks: CopyChecks | None
    bad: dict[int, BadSample] = field(default_factory=dict)


def neutral_id(index: DatasetIndex | None) -> int:
    """The id masked tokens carry: the dataset's padding id, else its EOS id, else 0 (shard
    URLs opened without an ``index.json`` name neither)."""
    if index is not None and index.pad_id is not None:
        return index.pad_id
    if index is not None and index.eos_id is not None:
        return index.eos_id
    return 0


def masked_tokens(counts: np.ndarray, neutral: int) -> LocatedTokens:
    """Samples of ``counts`` tokens each, every token ``neutral`` with the no-loss bit
    (uint32; in the reader's int32 rows a negative number)."""
    counts = np.asarray(counts, dtype=np.int64)
    base = np.full(int(counts.sum()), neutral | NO_LOSS_BIT, dtype=np.uint32)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return LocatedTokens(base, first, counts)
