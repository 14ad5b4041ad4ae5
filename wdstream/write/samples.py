"""Cut a stream of tokenised documents into samples, remembering document boundaries.

Concat mode, ``sample_tokens = 5`` (``seq_len = 4``), documents ``A`` (3 tokens incl. EOS),
``B`` (6), ``C`` (2)::

    stream   A A A B B B B B B C C
    samples  [A A A B B] [B B B B C] [C]       (the dataset's last sample may be shorter)
    doc_lens  [3, 2]      [4, 1]      [1]
    cont      False       True        True

Docs mode: one document per sample (``cont`` False, ``doc_lens == [len]``).

Each :class:`PackedSample` also carries ``end``: the position of the document holding its last
token and how many of that document's tokens are emitted up to the sample's end. That is the
whole resume state after a shard commit: re-read from that document, drop that many of its
tokens, and packing continues exactly as before (no carry buffer to save).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from wdstream.errors import WdstreamError

__all__ = ["ConcatSampleBuilder", "DocsSampleBuilder", "PackedSample", "drop_first_tokens"]


class PackedSample(NamedTuple):
    """A sample ready to encode, with where in the input it ends. (A named tuple: one is
    made per sample in the packing process, ~10x faster than a frozen dataclass.)"""

    tokens: np.ndarray  # on-disk dtype
    doc_lens: list[int]
    cont: bool
    new_docs: int  # documents whose first token is in this sample
    end: tuple[Any, int]  # (position of the last document touched, its tokens emitted so far)
    starts: list[Any]  # positions of the ``new_docs`` documents that start here (provenance)
    # The first piece's token offset in its document, where the sample builder knows it (best-fit
    # rows: their padding keeps the writer from counting it); None: the writer counts it.
    offset: int | None = None


class ConcatSampleBuilder:
    """Packs documents into samples of exactly ``sample_tokens`` tokens."""

    # Every sample is a consecutive slice of the documents' concatenated tokens (the Ray
    # driver then ships each sample's tokens as one run, wdstream.ray.layout.ShardCutter).
    in_order = True

    def __init__(self, sample_tokens: int, dtype: np.dtype) -> None:
        if sample_tokens < 1:
            raise ValueError(f"sample_tokens must be >= 1, got {sample_tokens}")
        self.sample_tokens = sample_tokens
        self.dtype = dtype
        self._carry = np.zeros(0, dtype=dtype)
        self._lens: list[int] = []  # pieces in the carry
        self._pos: list[Any] = []  # their document positions
        self._pre = 0  # tokens of the first carry piece's document emitted before the carry
        self._cont = False  # whether the first carry piece continues a document

    def add(
        self, tokens: np.ndarray, lens: Sequence[int] | np.ndarray, positions: Sequence[Any]
    ) -> Iterator[PackedSample]:
        """Add documents (concatenated ``tokens``, their ``lens``); yield every full sample."""
        stream = np.concatenate((self._carry, tokens)) if len(self._carry) else tokens
        piece_lens = np.asarray(self._lens + list(lens), dtype=np.int64)
        pos = self._pos + list(positions)
        ends = np.cumsum(piece_lens)
        starts = ends - piece_lens
        size = self.sample_tokens
        n_full = len(stream) // size
        ends_list, starts_list = ends.tolist(), starts.tolist()  # bisect per sample, not numpy
        for k in range(n_full):
            yield self._sample(stream, starts_list, ends_list, pos, k * size, (k + 1) * size)
        cut = n_full * size
        first = int(np.searchsorted(ends, cut, side="right"))
        if n_full and first < len(pos):
            # The carry now starts inside (or at) piece ``first``.
            self._pre = (self._pre if first == 0 else 0) + cut - int(starts[first])
            self._cont = bool(cut > starts[first] or (first == 0 and self._cont))
        elif n_full:
            self._pre, self._cont = 0, False
        self._carry = stream[cut:]
        self._lens = [int(x) for x in (ends[first:] - np.maximum(starts[first:], cut))]
        self._pos = pos[first:]

    def _sample(
        self,
        stream: np.ndarray,
        starts: list[int],
        ends: list[int],
        pos: list[Any],
        a: int,
        b: int,
    ) -> PackedSample:
        i0 = bisect.bisect_right(ends, a)
        i1 = bisect.bisect_left(starts, b)
        doc_lens = [min(e, b) - max(s, a) for s, e in zip(starts[i0:i1], ends[i0:i1], strict=True)]
        first_cont = a > starts[i0] or (i0 == 0 and self._cont)
        first_new = i0 + (1 if first_cont else 0)
        last = i1 - 1
        emitted = b - starts[last] + (self._pre if last == 0 else 0)
        return PackedSample(
            stream[a:b], doc_lens, bool(first_cont), i1 - first_new, (pos[last], emitted),
            pos[first_new:i1],
        )  # fmt: skip

    def flush(self) -> Iterator[PackedSample]:
        """Yield the final, shorter sample holding whatever is left."""
        if len(self._carry):
            n = len(self._carry)
            ends = np.cumsum(np.asarray(self._lens, dtype=np.int64))
            starts = ends - np.asarray(self._lens)
            yield self._sample(self._carry, starts.tolist(), ends.tolist(), self._pos, 0, n)
            self._carry = self._carry[:0]
            self._lens, self._pos, self._pre, self._cont = [], [], 0, False

    def resume_inside_document(self, emitted: int) -> None:
        """Resume mid-document: the next tokens added continue a document of which
        ``emitted`` tokens are already in earlier samples."""
        assert not len(self._carry), "resume only into an empty sample builder"
        self._pre, self._cont = emitted, emitted > 0

    def resume(
        self, tokens: np.ndarray, lens: np.ndarray, emitted: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Resume at a document of which ``emitted`` tokens are in committed shards: drop
        them (see :func:`drop_first_tokens`) and continue that document."""
        tokens, lens, dropped = drop_first_tokens(tokens, lens, emitted)
        if not dropped:
            self.resume_inside_document(emitted)
        return tokens, lens, dropped


class DocsSampleBuilder:
    """One document per sample."""

    in_order = True  # as ConcatSampleBuilder: each sample one consecutive slice of the tokens

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype

    def add(
        self, tokens: np.ndarray, lens: Sequence[int] | np.ndarray, positions: Sequence[Any]
    ) -> Iterator[PackedSample]:
        start = 0
        for n, p in zip(lens, positions, strict=True):
            yield PackedSample(tokens[start : start + n], [int(n)], False, 1, (p, int(n)), [p])
            start += n

    def flush(self) -> Iterator[PackedSample]:
        return iter(())

    def resume(
        self, tokens: np.ndarray, lens: np.ndarray, emitted: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Resume after a document whose sample is committed (``emitted`` is its length)."""
        tokens, lens, dropped = drop_first_tokens(tokens, lens, emitted)
        assert dropped or not emitted, "docs mode never splits a document"
        return tokens, lens, dropped


def drop_first_tokens(
    tokens: np.ndarray, lens: np.ndarray, emitted: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Drop the first document's ``emitted`` tokens (already in committed shards) from a
    tokenised batch; returns the rest and how many whole documents went (0 or 1).

    Raises:
        WdstreamError: the first document is shorter than what was packed of it: the input
            changed since the interrupted pack.
    """
    first_len = int(lens[0])
    if emitted > first_len:
        raise WdstreamError(
            "the input changed since the interrupted pack; use --overwrite (overwrite=True in Python)"
        )
    if emitted == first_len:
        return tokens[first_len:], lens[1:], 1
    lens = lens.copy()
    lens[0] -= emitted
    return tokens[emitted:], lens, 0
