"""The driver's shard layout for concat and docs packs: document lengths in, token spans out.

The concat and docs sample builders cut the run's token stream in order (concat: every
``sample_tokens`` tokens from the run's first token; docs: at every document's end), so
where each sample starts and which document pieces it holds follow from the documents'
lengths alone. :class:`SpanLayout` computes, per piece and with array operations, every
sample's tar member size from that metadata (the msgpack map's size is a sum over its
``doc_lens``), cuts shards with the local writer's rule on cumulative sizes, and hands each
shard's task one span of global tokens ``[a, b)`` and the documents overlapping it. The
task (:func:`~wdstream.ray.tasks.write_shard`) runs the local engine's own sample builder
over that span, so the driver does per-piece and per-shard work, not per-sample work::

    stream    base ................................................... T (tokens so far)
    samples   |  S  |  S  |  S  |  S  |  S  |  S  |  S  |  S  | ...     sized per piece
    shards    [a0 ............ b0)[a1 ................ b1)[open ...      cut on the sizes

A document's start is its first token's global index; the run's first document, resumed
inside, starts ``pre`` tokens before the run's first token (those are in committed shards),
so "tokens of a document before position ``a``" is always ``a - start``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy as np

from wdstream.format.sample import DTYPES, encoded_size
from wdstream.format.tar import BLOCK, END_OF_ARCHIVE
from wdstream.ray.layout import CutShard, SampleLayout, ShardCutter
from wdstream.ray.tasks import SpanPlan
from wdstream.write.builders import SampleBuilder
from wdstream.write.engine import PackJob
from wdstream.write.resume import ResumePoint, drop_packed
from wdstream.write.samples import ConcatSampleBuilder

__all__ = [
    "SpanLayout",
    "driver_layout",
    "drop_resumed",
    "encoded_sizes",
    "member_sizes",
    "uint_sizes",
]

_I64 = np.int64
_MAX_NAMED = 10**12 - 1  # sample numbers whose 12-digit member name keeps one header block


_UINT_LIMITS = np.array([1 << 7, 1 << 8, 1 << 16, 1 << 32], dtype=_I64)
_UINT_BYTES = np.array([1, 2, 3, 5, 9], dtype=_I64)  # positive fixint, uint 8/16/32/64


def uint_sizes(v: np.ndarray) -> np.ndarray:
    """Bytes msgpack takes for each non-negative int of ``v``."""
    return _UINT_BYTES[np.searchsorted(_UINT_LIMITS, v, side="right")]


def _array_header(n: np.ndarray) -> np.ndarray:
    """Bytes of msgpack's array header for arrays of ``n`` items."""
    return 1 + 2 * (n >= 16) + 2 * (n >= 1 << 16)


def _bin_header(n: np.ndarray) -> np.ndarray:
    return 2 + (n >= 1 << 8) + 2 * (n >= 1 << 16)


def encoded_sizes(
    tokens: np.ndarray, pieces: np.ndarray, int_bytes: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    """:func:`~wdstream.format.sample.encoded_size` of samples of ``tokens`` tokens holding
    ``pieces`` document pieces whose lengths take ``int_bytes`` msgpack bytes in all
    (:func:`uint_sizes`), as arrays: the sample's map without its ``doc_lens`` array and
    token bin headers, plus those headers, the lengths and the token bytes."""
    head = encoded_size(0, dtype, [], False) - 1 - 2  # the empty array's and bin's headers
    nb = tokens * dtype.itemsize
    return head + _array_header(pieces) + int_bytes + nb + _bin_header(nb)


def member_sizes(
    tokens: np.ndarray, pieces: np.ndarray, int_bytes: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    """Tar member sizes of those samples: a header block (12-digit names always fit one)
    and the data padded to whole blocks."""
    size = encoded_sizes(tokens, pieces, int_bytes, dtype)
    return BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK


def driver_layout(
    job: PackJob, first: tuple[int, int, int], doc_offset: int, position: Callable[[int], Any]
) -> SpanLayout | SampleLayout:
    """The driver's layout for ``job``, numbering from ``first`` (shard, sample, document):
    concat and docs packs from document lengths (their samples built in the shard tasks);
    best-fit rows, and packs whose documents may be empty (no EOS or BOS: an empty
    document's place among samples is the builder's to decide), sample by sample."""
    b = job.new_builder(np.dtype(np.int64), -1)
    if b.in_order and (job.eos_id is not None or job.bos_id is not None):
        per = b.sample_tokens if isinstance(b, ConcatSampleBuilder) else None
        return SpanLayout(per, job.shard_bytes, job.shard_samples, job.dtype, *first, position)
    cutter = ShardCutter(
        job.shard_bytes, job.shard_samples, job.dtype, *first, doc_offset=doc_offset,
        consecutive=b.in_order,
    )  # fmt: skip
    return SampleLayout(b, cutter, position)


def drop_resumed(
    lens: np.ndarray,
    positions: list[Any],
    resume: ResumePoint,
    new_builder: Callable[[np.dtype, int], SampleBuilder],
) -> tuple[int, bool]:
    """On resume, what committed shards hold of the run's first document (of ``lens``, at
    ``positions[0]``): ``(tokens, whether that is the whole document)``, by the local
    engine's rule and checks (:func:`drop_packed`, over that document's indices alone).

    Raises:
        WdstreamError: the document is not at the recorded position, or is shorter than
            what was packed of it: the input changed since the interrupted pack.
    """
    head = np.arange(int(lens[0]) if len(lens) else 0, dtype=np.int64)
    _, kept, _ = drop_packed(head, lens[:1], positions, resume, new_builder(head.dtype, -1))
    return (resume.emitted, False) if len(kept) else (int(lens[0]), True)


class SpanLayout:
    """Cuts the run's documents into shards of whole samples, from their lengths.

    Args:
        sample_tokens: concat: tokens per sample; None: docs mode (one sample per document).
        shard_bytes, shard_samples, dtype: the pack's shard limits and on-disk token dtype.
        first_shard, first_sample, first_doc: where numbering continues (resume).
        position: the journal's input position of a document, by its number in the run.
    """

    def __init__(
        self,
        sample_tokens: int | None,
        shard_bytes: int,
        shard_samples: int | None,
        dtype: str,
        first_shard: int,
        first_sample: int,
        first_doc: int,
        position: Callable[[int], Any],
    ) -> None:
        self.sample_tokens = sample_tokens
        self.shard_bytes, self.shard_samples = shard_bytes, shard_samples
        self._dtype = DTYPES[dtype]
        self._position = position
        self.next_shard = first_shard
        self._first_doc = first_doc
        # Documents not yet wholly in a cut shard: start, end (global tokens), run number,
        # file, record (absolute, 0-based); and their msgpack int sizes' prefix sums.
        empty = np.zeros(0, dtype=_I64)
        self._st, self._en, self._id, self._file, self._rec, self._ints = (empty,) * 6
        self._int_total = 0  # msgpack bytes of every document length so far (prefix sums)
        self._base: int | None = None  # the run's first token
        self._sized = 0  # token where the next sample not yet sized starts
        self._open_at = 0  # token where the open shard starts
        self._open_sample = first_sample  # its first sample's number
        self._open_n = self._open_size = 0  # its samples and their member bytes
        self._limit = shard_bytes - len(END_OF_ARCHIVE)

    def add(
        self,
        first: int,
        lens: np.ndarray,
        first_id: int,
        file: int,
        records: np.ndarray,
        pre: int,
        piece_starts: list[int],
    ) -> list[CutShard]:
        """Add one piece's documents (``lens`` tokens each from global token ``first``,
        numbered from ``first_id``, at absolute ``records`` of ``file``; ``pre``: tokens of
        the first one in committed shards); return the shards they closed."""
        if not len(lens):
            return []
        ends = first + np.cumsum(lens, dtype=_I64)
        starts = ends - lens
        if self._base is None:
            self._base = self._sized = self._open_at = first
        starts[0] -= pre
        self._st = np.concatenate((self._st, starts))
        self._en = np.concatenate((self._en, ends))
        self._id = np.concatenate((self._id, np.arange(first_id, first_id + len(lens))))
        self._file = np.concatenate((self._file, np.full(len(lens), file, dtype=_I64)))
        self._rec = np.concatenate((self._rec, records.astype(_I64, copy=False)))
        ints = self._int_total + np.cumsum(uint_sizes(ends - starts))
        self._ints, self._int_total = np.concatenate((self._ints, ints)), int(ints[-1])
        S, total = self.sample_tokens, int(ends[-1])
        if S is None:  # docs: each document is a sample
            lo = int(np.searchsorted(self._en, self._sized, side="right"))
            bounds = self._en[lo:]
        else:
            bounds = np.arange(self._sized + S, total + 1, S, dtype=_I64)
        cuts = self._place(bounds, piece_starts)
        keep = int(np.searchsorted(self._en, self._open_at, side="right"))
        if keep:
            self._st, self._en, self._id, self._file, self._rec, self._ints = (
                x[keep:] for x in (self._st, self._en, self._id, self._file, self._rec, self._ints)
            )
        return cuts

    def close(self, piece_starts: list[int]) -> list[CutShard]:
        """The shards left at the end of the run: concat's shorter last sample, and the open
        shard's samples."""
        cuts: list[CutShard] = []
        if self._base is not None and len(self._en) and self._sized < int(self._en[-1]):
            cuts = self._place(self._en[-1:].copy(), piece_starts)
        if self._open_n:
            cuts.append(self._cut(self._sized, piece_starts))
        return cuts

    def _sizes(self, bounds: np.ndarray) -> np.ndarray:
        """Member sizes of the samples ending at ``bounds`` (each starts where the last ends)."""
        st, en = self._st, self._en
        b = bounds
        a = np.concatenate(([self._sized], bounds[:-1]))
        i0 = np.searchsorted(en, a, side="right")
        i1 = np.searchsorted(st, b, side="left")
        pieces = i1 - i0
        first = np.minimum(en[i0], b) - np.maximum(st[i0], a)
        last = b - np.maximum(st[i1 - 1], a)
        # Whole documents between the first and the last piece: prefix sums (inclusive) of
        # their lengths' msgpack bytes; none when the sample holds fewer than 3 pieces.
        ints = self._ints
        middle = ints[np.maximum(i1 - 2, i0)] - ints[i0]
        int_bytes = uint_sizes(first) + (uint_sizes(last) + middle) * (pieces >= 2)
        if self._open_sample + self._open_n + len(b) > _MAX_NAMED:
            raise ValueError("more than 10**12 samples: sample member names outgrow 12 digits")
        return member_sizes(b - a, pieces, int_bytes, self._dtype)

    def _place(self, bounds: np.ndarray, piece_starts: list[int]) -> list[CutShard]:
        """Size the samples ending at ``bounds`` and cut shards where the local writer would."""
        if not len(bounds):
            return []
        sizes = np.cumsum(self._sizes(bounds))
        ends = bounds.tolist()
        cuts: list[CutShard] = []
        j, n = 0, len(ends)
        while j < n:
            before = int(sizes[j - 1]) if j else 0
            if not self._open_n:  # a shard's first sample goes in whatever its size
                self._open_n, self._open_size = 1, int(sizes[j]) - before
                j += 1
                continue
            # Samples j.. fit while their cumulative size stays within the room left.
            room = self._limit - self._open_size + before
            t = max(0, int(np.searchsorted(sizes, room, side="right")) - j)
            if self.shard_samples is not None:
                t = min(t, self.shard_samples - self._open_n)
            if t:
                self._open_n += t
                self._open_size += int(sizes[j + t - 1]) - before
                j += t
            if j < n:  # sample j opens the next shard
                cuts.append(self._cut(ends[j - 1] if j else self._sized, piece_starts))
        self._sized = ends[-1]
        return cuts

    def _cut(self, b: int, piece_starts: list[int]) -> CutShard:
        """The open shard, ending at token ``b``, as a task's plan."""
        a = self._open_at
        st, en = self._st, self._en
        lo = int(np.searchsorted(en, a, side="right"))
        hi = int(np.searchsorted(st, b, side="left"))
        pre = max(0, a - int(st[lo]))
        new_docs = hi - lo - (1 if pre else 0)
        runs = np.array([[a, b - a]], dtype=_I64)
        per_piece = _span_pieces(a, b, piece_starts)
        pieces = sorted(per_piece)
        plan = SpanPlan(
            index=self.next_shard,
            first_sample=self._open_sample,
            first_doc=self._first_doc,
            doc_offset=pre,
            runs=runs,
            piece_offsets=[piece_starts[p] for p in pieces],
            sample_tokens=self.sample_tokens,
            samples=self._open_n,
            new_docs=new_docs,
            pre=pre,
            doc_lens=np.minimum(en[lo:hi], b) - np.maximum(st[lo:hi], a),
            files=self._file[lo:hi],
            records=self._rec[lo:hi],
        )
        end = (self._position(int(self._id[hi - 1])), b - int(st[hi - 1]))
        self.next_shard += 1
        self._first_doc += new_docs
        self._open_sample += self._open_n
        self._open_at, self._open_n, self._open_size = b, 0, 0
        return CutShard(plan, end, pieces, per_piece)


def _span_pieces(a: int, b: int, piece_starts: list[int]) -> dict[int, int]:
    """How many tokens of ``[a, b)`` lie in each piece (pieces start at ``piece_starts``,
    the last one runs to at least ``b``)."""
    p = bisect.bisect_right(piece_starts, a) - 1
    counts: dict[int, int] = {}
    while p < len(piece_starts) and piece_starts[p] < b:
        stop = piece_starts[p + 1] if p + 1 < len(piece_starts) else b
        n = min(stop, b) - max(piece_starts[p], a)
        if n > 0:
            counts[p] = n
        p += 1
    return counts
