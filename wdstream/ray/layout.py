"""The driver's shard layout: samples of token *indices* in, shard plans out.

The driver never holds token ids. It runs the local engine's own sample builder (concat,
docs or bestfit, :mod:`wdstream.write.samples`) over each document's *global token indices*
(positions in the concatenation of every piece's tokens, ``-1`` for padding), so every
sample comes out with exactly the local engine's boundaries, document pieces and resume
position, and its tokens are a list of index runs into the pieces' arrays::

    pieces' tokens   piece 0: [t0 .. t4999]   piece 1: [t5000 .. t8999]
    builder input     arange(0, 5000), then arange(5000, 9000)   (docs' lengths as usual)
    sample 2         indices 4098..6146  ->  runs [(4098, 2049)]  (crosses into piece 1)

:class:`ShardCutter` then cuts samples into shards with the local writer's rule
(:func:`~wdstream.write.shards.starts_new_shard` on each sample's tar member size, computed
from its metadata without building its bytes: :func:`~wdstream.format.sample.encoded_size`,
:func:`~wdstream.write.shards.sample_member_size`), and tracks the document numbering the
provenance tables continue from. A shard plan is handed to one task, which
writes that shard and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdstream.format.sample import DTYPES, encoded_size
from wdstream.ray.tasks import ShardPlan, SpanPlan
from wdstream.write.builders import SampleBuilder
from wdstream.write.samples import PackedSample
from wdstream.write.shards import doc_tokens_after, sample_member_size, starts_new_shard

__all__ = ["CutShard", "SampleLayout", "ShardCutter", "index_runs"]


def index_runs(idx: np.ndarray) -> np.ndarray:
    """``[n, 2]`` rows ``(first index, count)`` of consecutive indices; padding (-1) rows
    have first index -1.

    >>> index_runs(np.array([4, 5, 6, 9, -1, -1])).tolist()
    [[4, 3], [9, 1], [-1, 2]]
    """
    if not len(idx):
        return np.zeros((0, 2), dtype=np.int64)
    if idx[0] >= 0 and (idx[1:] - idx[:-1] == 1).all():  # concat, docs: one run
        return np.array([[idx[0], len(idx)]], dtype=np.int64)
    pad = idx < 0
    same = np.where(pad[1:], pad[:-1], ~pad[:-1] & (np.diff(idx) == 1))
    heads = np.concatenate(([0], np.flatnonzero(~same) + 1))
    counts = np.diff(np.concatenate((heads, [len(idx)])))
    return np.stack((np.where(pad[heads], -1, idx[heads]), counts), axis=1).astype(np.int64)


@dataclass
class CutShard:
    """A laid-out shard: the task's plan, plus what the driver keeps for the journal."""

    plan: ShardPlan | SpanPlan  # SpanPlan: laid out by wdstream.ray.spans.SpanLayout
    end: Any  # the journal's resume position after the shard's last sample
    pieces: list[int]  # numbers of the pieces whose tokens it holds, ascending
    tokens_per_piece: dict[int, int]  # how many of its tokens each of them holds


class ShardCutter:
    """Collects samples (index arrays) into shard plans, cut where the local writer cuts.

    Args:
        shard_bytes, shard_samples: the pack's shard limits.
        dtype: the on-disk token dtype name (sample sizes depend on it).
        first_shard, first_sample, first_doc, doc_offset: where numbering continues (resume).
        consecutive: every sample's indices are one run of consecutive indices by
            construction (the concat and docs builders over ascending pieces; not best-fit
            rows, which reorder documents and pad): a shard's runs then come from each
            sample's first index and length, checked only by its last index, instead of a
            comparison of every index with the next (a third of the driver's time per
            sample).

    :meth:`add` and :meth:`close` take ``piece_starts``, the global first token of every piece
    laid out so far, to tell which pieces a shard's tokens come from.
    """

    def __init__(
        self,
        shard_bytes: int,
        shard_samples: int | None,
        dtype: str,
        first_shard: int,
        first_sample: int,
        first_doc: int,
        doc_offset: int,
        *,
        consecutive: bool = False,
    ) -> None:
        self.shard_bytes, self.shard_samples = shard_bytes, shard_samples
        self._consecutive = consecutive
        self._dtype = DTYPES[dtype]
        self.next_shard, self.next_sample = first_shard, first_sample
        self._next_doc, self._doc_tokens = first_doc, doc_offset
        self._open: list[tuple[PackedSample, list[tuple[int, int]], Any]] = []
        self._size = 0
        self._shard_doc, self._shard_offset = first_doc, doc_offset

    def _member_size(self, sample: PackedSample) -> int:
        size = encoded_size(len(sample.tokens), self._dtype, sample.doc_lens, sample.cont)
        return sample_member_size(self.next_sample, size)

    def add(
        self, sample: PackedSample, starts: list[tuple[int, int]], end: Any, piece_starts: list[int]
    ) -> CutShard | None:
        """Add one sample (``starts``: (file, record) of its new documents; ``end``: the
        journal position after it); return the shard it closed, if it closed one."""
        member = self._member_size(sample)
        done = None
        if starts_new_shard(
            len(self._open), self._size, member, self.shard_bytes, self.shard_samples
        ):
            done = self._cut(piece_starts)
        self._open.append((sample, starts, end))
        self._size += member
        self.next_sample += 1
        counted = self._doc_tokens if sample.offset is None else sample.offset
        offset = counted if sample.cont else 0  # as ShardWriter tracks provenance
        self._next_doc += sample.new_docs
        self._doc_tokens = doc_tokens_after(offset, sample.doc_lens, sample.cont)
        return done

    def close(self, piece_starts: list[int]) -> CutShard | None:
        """The last, partly filled shard, if any samples are left."""
        return self._cut(piece_starts) if self._open else None

    def _cut(self, piece_starts: list[int]) -> CutShard:
        samples = self._open
        if self._consecutive:
            runs = _joined(_consecutive_runs([s.tokens for s, _, _ in samples]))
        else:
            runs = _joined(
                np.concatenate([index_runs(np.asarray(s.tokens)) for s, _, _ in samples])
            )
        per_piece = _tokens_per_piece(runs, piece_starts)
        pieces = sorted(per_piece)
        plan = ShardPlan(
            index=self.next_shard,
            first_sample=self.next_sample - len(samples),
            first_doc=self._shard_doc,
            doc_offset=self._shard_offset,
            runs=runs,
            sample_tokens=[len(s.tokens) for s, _, _ in samples],
            doc_lens=[list(map(int, s.doc_lens)) for s, _, _ in samples],
            cont=[bool(s.cont) for s, _, _ in samples],
            new_docs=[int(s.new_docs) for s, _, _ in samples],
            starts=[st for _, st, _ in samples],
            offsets=[s.offset for s, _, _ in samples],
            piece_offsets=[piece_starts[p] for p in pieces],
        )
        cut = CutShard(plan, samples[-1][2], pieces, per_piece)
        self.next_shard += 1
        self._open, self._size = [], 0
        self._shard_doc, self._shard_offset = self._next_doc, self._doc_tokens
        return cut


class SampleLayout:
    """The layout sample by sample: the local sample builder over token indices, each sample
    cut into shards by :class:`ShardCutter`. Best-fit rows need it (they reorder documents
    and pad), and so do packs whose documents may be empty (no EOS or BOS); concat and docs
    packs otherwise use :class:`~wdstream.ray.spans.SpanLayout`, which does no per-sample
    work on the driver.

    ``position``: the journal's input position of a document, by its number in the run.
    """

    def __init__(
        self, builder: SampleBuilder, cutter: ShardCutter, position: Callable[[int], Any]
    ) -> None:
        self.builder, self.cutter, self._position = builder, cutter, position
        self._end: tuple[int, Any] = (-1, None)

    def add(
        self, idx: np.ndarray, lens: np.ndarray, ids: list[int], piece_starts: list[int]
    ) -> list[CutShard]:
        """Lay out documents (their global token indices ``idx``, ``lens``, numbers ``ids``);
        return the shards they closed."""
        cuts = (self._add(s, piece_starts) for s in self.builder.add(idx, lens, ids))
        return [c for c in cuts if c is not None]

    def close(self, piece_starts: list[int]) -> list[CutShard]:
        """The builder's last samples and the last shard."""
        cuts = [self._add(s, piece_starts) for s in self.builder.flush()]
        cuts.append(self.cutter.close(piece_starts))
        return [c for c in cuts if c is not None]

    def _add(self, sample: PackedSample, piece_starts: list[int]) -> CutShard | None:
        starts = [(p.file, p.record) for p in map(self._position, sample.starts)]
        if sample.end[0] != self._end[0]:
            # Kept: best-fit rows all end at their block's first document, whose piece may
            # be released while the block's later rows are laid out.
            self._end = (sample.end[0], self._position(sample.end[0]))
        return self.cutter.add(sample, starts, (self._end[1], sample.end[1]), piece_starts)


def _consecutive_runs(samples: list[np.ndarray]) -> np.ndarray:
    """``[n, 2]`` rows ``(first index, count)``, one per sample, of samples whose indices
    are consecutive by construction; each sample's last index is checked against that.

    Raises:
        RuntimeError: a sample's indices are not one run (a driver bug).
    """
    samples = [t for t in samples if len(t)]
    runs = np.array([(int(t[0]), len(t)) for t in samples], dtype=np.int64).reshape(-1, 2)
    lasts = np.array([int(t[-1]) for t in samples], dtype=np.int64)
    if len(runs) and ((runs[:, 0] < 0).any() or (runs[:, 0] + runs[:, 1] - 1 != lasts).any()):
        raise RuntimeError("a laid-out sample's token indices are not one consecutive run")
    return runs


def _joined(runs: np.ndarray) -> np.ndarray:
    """``runs`` with each run that continues the one before it (consecutive indices, or
    padding after padding) merged into it: runs may span samples (a task cuts samples by
    ``sample_tokens``), so a concat shard is one run.

    >>> _joined(np.array([[4, 3], [7, 2], [-1, 1], [-1, 2], [0, 1]])).tolist()
    [[4, 5], [-1, 3], [0, 1]]
    """
    if len(runs) < 2:
        return runs
    first, count = runs[:, 0], runs[:, 1]
    pad = first < 0
    follows = np.where(pad[1:], pad[:-1], ~pad[:-1] & (first[:-1] + count[:-1] == first[1:]))
    heads = np.concatenate(([0], np.flatnonzero(~follows) + 1))
    return np.stack((first[heads], np.add.reduceat(count, heads)), axis=1).astype(np.int64)


def _tokens_per_piece(runs: np.ndarray, piece_starts: list[int]) -> dict[int, int]:
    """How many of the runs' (non-padding) tokens lie in each piece."""
    real = runs[runs[:, 0] >= 0]
    first = np.searchsorted(piece_starts, real[:, 0], side="right") - 1
    last = np.searchsorted(piece_starts, real[:, 0] + real[:, 1] - 1, side="right") - 1
    within = first == last
    counts: dict[int, int] = {}
    ids, sums = np.unique(first[within], return_inverse=True)
    totals = np.bincount(sums, weights=real[within, 1]) if len(ids) else np.zeros(0)
    for p, c in zip(ids.tolist(), totals, strict=True):
        counts[p] = int(c)
    for (a, n), p in zip(real[~within].tolist(), first[~within].tolist(), strict=True):
        while n:  # a run crossing pieces: count each piece's part
            stop = piece_starts[p + 1] if p + 1 < len(piece_starts) else a + n
            take = min(n, stop - a)
            if take:
                counts[p] = counts.get(p, 0) + take
            a, n, p = a + take, n - take, p + 1
    return counts
