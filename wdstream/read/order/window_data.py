"""A window's samples as read, their copy-time checks, and the rows quarantine masks.

The global order (:mod:`~wdstream.read.order.global_order`) reads a window whole and copies
rows out of it. What it keeps of the read is a :class:`WindowData`; a torch worker of several
verifies each sample at its first copy (:class:`CopyTimeChecks`). With ``on_corrupt="mask"``
a sample that could not be read stands in masked (``WindowData.bad``, from the read or from
a failed copy-time check), and every row that holds any token of it is masked whole
(:func:`mask_rows`): each of its tokens becomes the dataset's neutral id with the no-loss bit,
so its ``input_ids`` are that id and its ``labels`` all -100. A row that touches no such
sample is exactly the clean row::

    stream   ... s41 s41 s41 | s42 s42 s42 s42 | s43 s43 ...     (s42 failed its CRC32C)
    rows     [ row 7       ][ row 8          ][ row 9    ]
    masked                  row 8, and row 7 or 9 only if they hold a token of s42
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wdstream.format.checksum import crc32c
from wdstream.format.loss import NO_LOSS_BIT
from wdstream.read.order.plan import EpochPlan
from wdstream.read.sources.packed import ShardSource
from wdstream.read.sources.quarantine import QuarantinedReads
from wdstream.read.sources.reads import CHECKSUM_REASON, BadSample, CopyChecks, PieceRead

__all__ = [
    "CopyTimeChecks",
    "Hit",
    "WindowData",
    "emitted_bad",
    "mask_rows",
    "samples_alone",
    "samples_used",
]

Hit = tuple[int, BadSample]  # (row of the filled block, the bad sample it holds tokens of)


@dataclass(frozen=True)
class CopyTimeChecks:
    """Emitted sample ``i`` is bytes ``[start[i], end[i])`` of ``reads[r].buf``, where ``r`` is
    its read (``WindowData.base_of[i]``), with CRC32C ``want[i]``; ``want[i]`` is -1 once the
    filling thread has verified it, and from the start for a read without checksums (a v1 or
    sidecar-less shard, read unchecked with a warning). Plain lists: looked up once per
    copied row, and three columns are all a window builds for them."""

    reads: list[CopyChecks | None]
    start: list[int]
    end: list[int]
    want: list[int]

    def verify(
        self, i: int, read: int, source: ShardSource, bad: dict[int, BadSample] | None
    ) -> None:
        """Verify emitted sample ``i`` of read ``read``: on a mismatch raise
        :class:`CorruptShardError` naming it, or with ``bad`` (``on_corrupt="mask"``)
        record it there."""
        checks, start = self.reads[read], self.start[i]
        assert checks is not None, "only samples of checked reads are pending"
        # GIL held (below 16 KiB): one short sum of cached bytes, no hand-off to a thread.
        if crc32c(checks.buf[start : self.end[i]]) != self.want[i]:
            if bad is None:
                source.report_corrupt(checks, start)
            k = checks.first + int(np.searchsorted(checks.offsets, start))
            where = source.where(checks.shard)
            bad[i] = BadSample(where, k, checks.begin + start, CHECKSUM_REASON)
        self.want[i] = -1


@dataclass(frozen=True)
class WindowData:
    """The window's samples, emitted order: sample ``i`` is
    ``bases[base_of[i]][first[i] : first[i] + its tokens]`` (no view per sample: a torch
    worker copies only its own rows out of a window, a view per sample cost more than the
    copies)."""

    bases: list[np.ndarray]  # token arrays the samples lie in: one per piece read
    base_of: list[int]
    first: list[int]
    pieces: list[tuple[int, ...]]  # their document piece lengths (empty unless asked for)
    # Samples still to verify when first copied (a worker of several), else None.
    unverified: CopyTimeChecks | None = None
    # Emitted samples standing in masked (on_corrupt="mask"), by emitted index.
    bad: dict[int, BadSample] = field(default_factory=dict)


def samples_alone(
    reads: ShardSource | QuarantinedReads,
    plan: EpochPlan,
    positions: np.ndarray,
    emitted: set[int],
    docs: bool,
) -> WindowData:
    """A window whose samples are at epoch ``positions`` (emitted order) with only the
    ``emitted`` ones read, each alone (one ranged read, verified); only those may be
    copied from it.

    For rows that hold few of a window not read yet (the first batch of an iteration): a
    window is ~1,000 samples, often from a hundred shards, and the first batch needs 8.
    """
    order = sorted(emitted)
    pieces_read = []
    for i in order:
        p = int(positions[i])
        [(shard, k, _)] = plan.pieces(p, p + 1)
        pieces_read.append((shard, k, k + 1))
    parts = reads.read(pieces_read, docs=docs)
    size = len(positions)
    base_of, first = [-1] * size, [0] * size
    pieces: list[tuple[int, ...]] = [()] * size if docs else []
    bases, bad = [], {}
    for j, (i, part) in enumerate(zip(order, parts, strict=True)):
        base_of[i] = j
        if docs:
            bases.append(part.tokens.views()[0])
            pieces[i] = part.doc_lens[0]
        else:
            bases.append(part.tokens.base)
            first[i] = int(part.tokens.first[0])
        if part.bad:
            bad[i] = part.bad[0]
    return WindowData(bases, base_of, first, pieces, bad=bad)


def emitted_bad(reads: list[PieceRead], order: np.ndarray) -> dict[int, BadSample]:
    """The stand-ins of a window's ``reads`` (lane order) by emitted index (emitted sample
    ``i`` is the ``order[i]``-th in lane order)."""
    lane: dict[int, BadSample] = {}
    at = 0
    for part in reads:
        lane.update({at + j: b for j, b in part.bad.items()})
        at += len(part.tokens)
    if not lane:
        return {}
    emitted = np.empty_like(order)
    emitted[order] = np.arange(len(order))
    return {int(emitted[k]): b for k, b in lane.items()}


def mask_rows(
    tokens: np.ndarray, doc_start: np.ndarray | None, hits: list[Hit], neutral: int
) -> None:
    """Mask every row ``hits`` names whole: the neutral id with the no-loss bit in every
    token (``input_ids`` that id, ``labels`` all -100), one document piece from its start."""
    rows = sorted({r for r, _ in hits})
    tokens[rows] = np.array(neutral | NO_LOSS_BIT, dtype=np.uint32).astype(tokens.dtype)
    if doc_start is not None:
        doc_start[rows] = False
        doc_start[rows, 0] = True


def samples_used(starts: np.ndarray, order: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """Which of a window's samples (lane order, as read) the token ``spans`` touch;
    ``starts``: each emitted sample's first token in the epoch's stream (and the end)."""
    emitted = np.zeros(len(order), dtype=bool)
    for a, b in spans:
        first = int(np.searchsorted(starts, a, side="right")) - 1
        emitted[max(first, 0) : int(np.searchsorted(starts, b, side="left"))] = True
    used = np.empty_like(emitted)
    used[order] = emitted
    return used
