"""A window's samples as read, the copy of rows out of them with their copy-time checks,
and the rows quarantine masks.

The global order (:mod:`~wdstream.read.order.global_order`) reads a window whole and copies
rows out of it (:func:`copy_rows`). What it keeps of the read is a :class:`WindowData`; a
torch worker of several verifies each sample at its first copy (:class:`CopyTimeChecks`). With ``on_corrupt="mask"``
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

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from wdstream.errors import IndexValidationError
from wdstream.format.checksum import crc32c
from wdstream.format.loss import NO_LOSS_BIT
from wdstream.read.order.plan import EpochPlan
from wdstream.read.order.row_places import RowPlaces, piece_starts
from wdstream.read.sources.fetches import Stop
from wdstream.read.sources.packed import ShardSource
from wdstream.read.sources.quarantine import QuarantinedReads
from wdstream.read.sources.reads import CHECKSUM_REASON, BadSample, CopyChecks, PieceRead

__all__ = [
    "WINDOW_MASK",
    "WINDOW_TAG",
    "CopyTimeChecks",
    "Hit",
    "Segment",
    "WindowData",
    "copy_rows",
    "emitted_bad",
    "finish_copy",
    "mask_rows",
    "samples_alone",
    "samples_used",
]

Hit = tuple[int, BadSample]  # (row of the filled block, the bad sample it holds tokens of)


@dataclass(frozen=True)
class CopyTimeChecks:
    """Emitted sample ``i`` is bytes ``[start, end)`` of ``bufs[r]`` (the buffer of
    ``reads[r]``, ``r = WindowData.base_of[i]``) with CRC32C ``want``: column ``i`` of
    ``spans``, whose ``want`` is -1 once a fill has verified it, and from the start for a
    read without checksums (a v1 or sidecar-less shard, read unchecked with a warning).

    One numpy array for the window, not Python lists: a torch worker of ``W`` copies only
    ``1/W`` of a window's samples, so a Python object per sample of the window cost the
    read-ahead thread more than the sums of its own; a fill takes the columns of the
    emitted samples it copies (one contiguous range per window) as lists (:func:`copy_rows`).
    """

    reads: list[CopyChecks | None]
    bufs: list[memoryview]  # each read's buffer (empty for a read without checksums)
    spans: np.ndarray  # int64 [3, n]: start, end, CRC32C (-1: nothing to verify), emitted order

    @classmethod
    def of(
        cls, reads: list[CopyChecks | None], counts: list[int], order: np.ndarray
    ) -> CopyTimeChecks | None:
        """The checks of a window read as ``reads`` (``counts[r]`` samples each, lane order),
        emitted in ``order``; None when no read has checksums."""
        if all(c is None for c in reads):
            return None
        none = np.full(max(counts), -1, dtype=np.int64)
        lane = np.empty((3, sum(counts)), dtype=np.int64)  # start, size then end, CRC32C
        for row, name in enumerate(("offsets", "sizes", "crcs")):
            parts = [none[:n] if c is None else getattr(c, name)
                     for c, n in zip(reads, counts, strict=True)]  # fmt: skip
            np.concatenate(parts, out=lane[row])
        lane[1] += lane[0]
        spans = lane.take(order, axis=1)  # emitted order (take: 4x faster than [:, order])
        bufs = [memoryview(b"") if c is None else c.buf for c in reads]
        return cls(reads, bufs, spans)

    def failed(
        self,
        i: int,
        read: int,
        start: int,
        source: ShardSource,
        bad: dict[int, BadSample] | None,
    ) -> None:
        """Emitted sample ``i`` (of read ``read``, at ``start`` in its buffer) failed its
        CRC32C: raise :class:`CorruptShardError` naming it, or with ``bad``
        (``on_corrupt="mask"``) record it there."""
        checks = self.reads[read]
        assert checks is not None, "only samples of checked reads are verified"
        if bad is None:
            source.ranges.report_corrupt(checks, start)
        k = checks.first + int(np.searchsorted(checks.offsets, start))
        bad[i] = BadSample(source.where(checks.shard), k, checks.begin + start, CHECKSUM_REASON)


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


Segment = tuple[int, int, int, int]  # (window, emitted index, first token, tokens)
# A segment's window is ``tag | w``: window ``w`` of its epoch, ``tag`` 0 for one dataset's
# fill, a multiple of WINDOW_TAG naming a run of rows (a source and epoch) in a mixture's.
WINDOW_TAG = 1 << 32
WINDOW_MASK = WINDOW_TAG - 1


def copy_rows(
    segments: list[Segment],
    windows: dict[int, WindowData],
    load: Callable[[int], WindowData],
    flat: np.ndarray,
    flat_ds: np.ndarray | None,
    row_tokens: int,
    source_of: Callable[[int], ShardSource],
    quarantine: bool,
    places: RowPlaces | None = None,
) -> list[Hit]:
    """Copy ``segments`` (stream order) end to end into ``flat`` (with ``places``, filled
    row ``j`` into row ``places.into[j]`` of ``flat``'s block), reading each window's
    data from ``windows`` (those missing with ``load``); ``source_of(window)``: the
    source a window's samples are of (for messages). Verify each sample a
    :class:`CopyTimeChecks` holds pending right after its copy, while its bytes are in
    the cache (batched at the fill's end they had left it, and the sums slowed by more
    than the batching saved); mark document starts in ``flat_ds``.

    A fill's samples of one window are consecutive emitted indices, so their check
    columns are one slice of the window's array, taken as lists when the fill enters the
    window and marked verified (in the array) when it leaves it: a sample whose check
    raised stays pending, so a retried fill checks it again.

    Returns:
        Each filled row (``j``, before ``places``) that holds tokens of a stand-in sample
        (``on_corrupt="mask"``: ``quarantine``), with it, in stream order: see
        :func:`finish_copy`.
    """
    hits: list[Hit] = []
    o, cw, lo = 0, -1, 0
    checks: CopyTimeChecks | None = None
    data: WindowData
    starts: list[int]
    ends: list[int]
    wants: list[int]
    bufs: list[memoryview]
    row_at = places.starts if places is not None else []  # each filled row's flat offset
    # As many segments as rows (a mixture's rows of whole samples): while every segment so
    # far was one whole row, segment k is row k, its place one lookup with no arithmetic.
    whole = len(segments) == len(row_at)
    for k, (w, i, off, take) in enumerate(segments):
        if w != cw:
            if checks is not None:  # leaving a window: its samples of this fill are verified
                checks.spans[2, lo : segments[k - 1][1] + 1] = -1
            if w not in windows:
                windows[w] = load(w)
            data = windows[w]
            cw, checks = w, data.unverified
            if checks is not None:
                # At most the rest of the fill's segments are this window's.
                lo = i
                starts, ends, wants = checks.spans[:, lo : lo + len(segments) - k].tolist()
                bufs = checks.bufs
        r = data.base_of[i]
        base, at = data.bases[r], data.first[i] + off
        if places is None:
            flat[o : o + take] = base[at : at + take]
        elif whole and take == row_tokens:  # row k, whole
            d = row_at[k]
            flat[d : d + take] = base[at : at + take]
        elif (c := o % row_tokens) + take <= row_tokens:  # in one row: the place inline
            whole = False
            d = row_at[o // row_tokens] + c
            flat[d : d + take] = base[at : at + take]
        else:
            whole = False
            places.copy(flat, o, base[at : at + take])
        if checks is not None:
            j = i - lo
            want = wants[j]
            if want >= 0:
                wants[j] = -1  # a sample cut into two rows of this fill: checked once
                # GIL held (below 16 KiB): one short sum of cached bytes, no hand-off.
                if crc32c(bufs[r][starts[j] : ends[j]]) != want:
                    checks.failed(i, r, starts[j], source_of(w), data.bad if quarantine else None)
        if data.bad and i in data.bad:
            hits += [
                (x, data.bad[i]) for x in range(o // row_tokens, (o + take - 1) // row_tokens + 1)
            ]
        if flat_ds is not None:
            marks = o + piece_starts(data.pieces[i], off, take)
            flat_ds[marks if places is None else places.flat(marks)] = True
        o += take
    if checks is not None:
        checks.spans[2, lo : segments[-1][1] + 1] = -1
    return hits


def finish_copy(
    segments: list[Segment],
    windows: dict[int, WindowData],
    flat: np.ndarray,
    into: np.ndarray | None,
    row_tokens: int,
    source: ShardSource,
    hits: list[Hit],
) -> list[Hit]:
    """After :func:`copy_rows`, for the filled rows of one source (``into``: their rows of
    the block, None: all of it) and its ``segments`` and ``hits``: refuse ids outside its
    vocabulary where the bytes were not verified as read (:func:`_check_copied_ids`);
    returns ``hits`` with rows of the block."""
    if any(windows[w].unverified is not None for w in {s[0] for s in segments}):
        _check_copied_ids(segments, windows, flat, into, row_tokens, source, hits)
    if into is not None:
        hits = [(int(into[r]), bad) for r, bad in hits]
    return hits


def _check_copied_ids(
    segments: list[Segment],
    windows: dict[int, WindowData],
    flat: np.ndarray,
    into: np.ndarray | None,
    row_tokens: int,
    source: ShardSource,
    hits: list[Hit],
) -> None:
    """Refuse a fill whose rows hold an id outside the vocabulary (``source.id_limit``), as
    a read that verifies its own samples refuses it (:mod:`~wdstream.read.sources.vouch`):
    samples of unverified windows are checked here, once copied (one max over the rows
    filled, in the cache), rows masked for a stand-in sample left out.

    Raises:
        CorruptShardError, IndexValidationError: for the first sample holding such an id
            (its bytes verified first, and the error raised as a read raises it).
    """
    limit = source.id_limit
    if limit is None:
        return
    block = flat if into is None else flat.reshape(-1, row_tokens)[into]
    rows = block.reshape(-1, row_tokens)
    if hits:
        rows = np.delete(rows, sorted({r for r, _ in hits}), axis=0)
    if limit.admits(rows):
        return
    for w, i, off, take in segments:
        data = windows[w]
        r = data.base_of[i]
        if i in data.bad or limit.admits(data.bases[r][data.first[i] + off :][:take]):
            continue
        checks = data.unverified
        read = checks.reads[r] if checks is not None else None
        if checks is None or read is None:
            continue  # a read verified as read: its ids were checked then
        k = read.first + int(np.searchsorted(read.offsets, checks.spans[0, i]))
        source.read_sample(read.shard, k)  # verifies the bytes, then refuses the id
        raise IndexValidationError(
            f"{source.where(read.shard)}: sample {k}: an id outside the vocabulary (tokenizer."
            f"n_vocab = {limit.n_vocab})"
        )


def samples_alone(
    reads: ShardSource | QuarantinedReads,
    plan: EpochPlan,
    positions: np.ndarray,
    emitted: set[int],
    docs: bool,
    stop: Stop | None = None,
) -> WindowData:
    """A window whose samples are at epoch ``positions`` (emitted order) with only the
    ``emitted`` ones read, each alone (one ranged read, verified); only those may be
    copied from it. ``stop``: the reads' (:meth:`ShardSource.read`).

    For rows that hold few of a window not read yet (the first batch of an iteration): a
    window is ~1,000 samples, often from a hundred shards, and the first batch needs 8.
    """
    order = sorted(emitted)
    pieces_read = []
    for i in order:
        p = int(positions[i])
        [(shard, k, _)] = plan.pieces(p, p + 1)
        pieces_read.append((shard, k, k + 1))
    parts = reads.read(pieces_read, docs=docs, stop=stop)
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
