"""Best-fit packing: rows of ``sample_tokens`` that hold whole documents.

Documents are taken in blocks of consecutive documents (in input order): a block closes at
``buffer`` documents or once it holds ``buffer`` rows' worth of tokens, whichever comes
first. Each block is laid out on its own:

1. documents longer than a row -- the only ones cut -- are concatenated in input order and
   cut every ``sample_tokens`` tokens, as concat mode does, so their rows are full; only the
   last of these rows is partial;
2. the other documents are packed by best-fit decreasing (Ding et al., "Fewer Truncations
   Improve Language Modeling", 2024): longest first, each into the fullest row it still fits
   (that last partial row included), a new row when none has room. The slack at a row's end
   is padding.

A row thus holds at most one piece continued from the sample before it (first) and one
continued in the sample after it (last, in a full row), and every document's pieces are
consecutive samples linked by ``cont`` as in concat mode. ``sample_tokens = 5``, block of
documents ``A`` (3 tokens), ``B`` (7), ``C`` (2), ``D`` (1)::

    long documents        B B B B B | B B            (B cut every 5 tokens)
    short, longest first  A:3  C:2  D:1             (A joins B's last row; C, D a new one)
    rows                  [B B B B B] [B B A A A] [C C D . .]
    doc_lens               [5, 0]      [2, 3, 0]   [2, 1, 2]    (last entry: padding)
    cont                   False       True        False

The layout is a pure function of the block's document lengths and ``sample_tokens``
(:func:`bestfit_rows`), so every engine that feeds documents in input order gets identical
rows; blocks make memory flat in corpus size and give exact resume points: a sample's
``end`` is the block's first document and how many of the block's rows are emitted up to
it, so a resumed pack re-reads that block, re-packs it and skips those rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdstream.write.samples import PackedSample

__all__ = ["DEFAULT_BUFFER", "BestFitSampleBuilder", "RowPiece", "bestfit_blocks", "bestfit_rows"]

# Documents per best-fit block (and rows' worth of tokens): 0.24 % padding or less on the
# bench and long-tailed corpora at seq_len 2048 and 8192 (docs/PACK.md), ~8 MB per block.
DEFAULT_BUFFER = 1024

RowPiece = tuple[int, int, int]  # (document index in the block, first token, end token)


@dataclass
class _Bin:
    free: int
    pieces: list[RowPiece]
    first_doc: int  # smallest document index in it (orders the output)


def bestfit_rows(
    lens: Sequence[int] | np.ndarray, sample_tokens: int, min_head: int = 1
) -> list[list[RowPiece]]:
    """Rows of whole documents (long ones cut as in concat mode), best-fit decreasing.

    Args:
        lens: document lengths in tokens (every one >= 1), in input order.
        sample_tokens: tokens per row.
        min_head: a long document starts at the end of a row only if at least this many of
            its tokens fit there (else the row ends in padding): 2 when documents start
            with a BOS equal to the padding id, so no row ends in a lone BOS.

    Returns:
        The rows in output order, each a list of pieces ``(doc, start, stop)`` in row order;
        a row's tokens are its pieces' tokens, then padding up to ``sample_tokens``. The rows
        of the long documents come first, as one run (in the position of the first of them),
        the others in order of the smallest document they hold.

    Raises:
        ValueError: for a length < 1 or ``sample_tokens`` < 1.
    """
    if sample_tokens < 1:
        raise ValueError(f"sample_tokens must be >= 1, got {sample_tokens}")
    S = sample_tokens
    sizes = [int(n) for n in lens]
    for d, n in enumerate(sizes):
        if n < 1:
            raise ValueError(f"document {d} has {n} tokens; every document needs >= 1")
    # 1. Long documents: one stream cut every S tokens (all rows full but the last).
    chain: list[list[RowPiece]] = []
    row: list[RowPiece] = []
    free = S
    for d in (d for d, n in enumerate(sizes) if n > S):
        a = 0
        if row and free < min_head:
            chain.append(row)  # the row ends in padding rather than in a lone first token
            row, free = [], S
        while a < sizes[d]:
            take = min(free, sizes[d] - a)
            row.append((d, a, a + take))
            a, free = a + take, free - take
            if not free:
                chain.append(row)
                row, free = [], S
    # 2. The rest, longest first, each into the fullest row with room (best fit).
    bins = [_Bin(free, row, row[0][0])] if row else []
    keys = [(free, 0)] if row else []  # (free, bin number) of rows with room, sorted
    for d in sorted((d for d, n in enumerate(sizes) if n <= S), key=lambda d: (-sizes[d], d)):
        n = sizes[d]
        at = bisect.bisect_left(keys, (n, -1))
        if at < len(keys):
            b = keys.pop(at)[1]
            bins[b].free -= n
            bins[b].pieces.append((d, 0, n))
            bins[b].first_doc = min(bins[b].first_doc, d)
        else:
            b = len(bins)
            bins.append(_Bin(S - n, [(d, 0, n)], d))
        if bins[b].free:
            bisect.insort(keys, (bins[b].free, b))
    # Output: the long documents' run where its first document is; rows by first document.
    units: list[tuple[int, list[list[RowPiece]]]] = []
    for i, bin_ in enumerate(bins):
        # The continued piece (only in the chain's last row) first, then input order.
        pieces = sorted(bin_.pieces, key=lambda p: (p[1] == 0, p[0]))
        if i == 0 and chain and pieces[0][1] > 0:
            chain.append(pieces)  # the chain's partial last row
        else:
            units.append((bin_.first_doc, [pieces]))
    if chain:
        units.append((chain[0][0][0], chain))
    units.sort(key=lambda u: u[0])
    return [row for _, rows in units for row in rows]


def bestfit_blocks(lens: Sequence[int] | np.ndarray, buffer: int, sample_tokens: int) -> list[int]:
    """Where the blocks of a document sequence end (exclusive indices), as the sample builder cuts
    them: a block closes at ``buffer`` documents or once it holds at least
    ``buffer * sample_tokens`` tokens."""
    ends, docs, tokens = [], 0, 0
    for i, n in enumerate(lens):
        docs, tokens = docs + 1, tokens + int(n)
        if docs == buffer or tokens >= buffer * sample_tokens:
            ends.append(i + 1)
            docs = tokens = 0
    if docs:
        ends.append(len(lens))
    return ends


class BestFitSampleBuilder:
    """Packs documents into best-fit rows of exactly ``sample_tokens`` tokens (padding last).

    ``add``/``flush`` as :class:`~wdstream.write.samples.ConcatSampleBuilder`; a resume restarts at
    a block's first document and skips rows (:meth:`resume_rows`). Every sample's
    ``doc_lens`` ends with its padding length (0 for a full row), so ``doc_lens`` sums to
    ``sample_tokens`` and the padding is told apart without reading the tokens.

    Args:
        sample_tokens: tokens per row (``seq_len + 1``).
        dtype: on-disk token dtype.
        buffer: documents per best-fit block, and its tokens at most ``buffer`` rows' worth
            (memory is one block: at most ``buffer * sample_tokens`` tokens plus one document).
        pad_id: the token written into padding.
        min_head: see :func:`bestfit_rows`: 2 when documents start with a BOS equal to the
            padding id (pack passes it), else 1.
    """

    # Rows reorder documents and end in padding: not consecutive slices of the tokens.
    in_order = False

    def __init__(
        self,
        sample_tokens: int,
        dtype: np.dtype,
        buffer: int,
        pad_id: int,
        min_head: int = 1,
    ) -> None:
        if sample_tokens < 1:
            raise ValueError(f"sample_tokens must be >= 1, got {sample_tokens}")
        if buffer < 1:
            raise ValueError(f"bestfit buffer must be >= 1 documents, got {buffer}")
        self.sample_tokens, self.dtype = sample_tokens, dtype
        self.buffer, self.pad_id = buffer, pad_id
        self.min_head = min_head
        self._docs: list[np.ndarray] = []
        self._pos: list[Any] = []
        self._tokens = 0  # tokens in the open block
        self._skip = 0  # rows of the first block already in committed shards (resume)

    def add(
        self, tokens: np.ndarray, lens: Sequence[int] | np.ndarray, positions: Sequence[Any]
    ) -> Iterator[PackedSample]:
        """Add documents (concatenated ``tokens``, their ``lens``); yield each full block's rows."""
        start = 0
        for n, p in zip(lens, positions, strict=True):
            self._docs.append(tokens[start : start + int(n)])
            self._pos.append(p)
            start += int(n)
            self._tokens += int(n)
            if len(self._docs) == self.buffer or self._tokens >= self.buffer * self.sample_tokens:
                yield from self._block()

    def flush(self) -> Iterator[PackedSample]:
        """Yield the rows of the last, partial block."""
        if self._docs:
            yield from self._block()

    def resume_rows(self, rows: int) -> None:
        """Resume inside a block: its first ``rows`` rows are already in committed shards."""
        assert not self._docs, "resume only into an empty sample builder"
        self._skip = rows

    def resume(
        self, tokens: np.ndarray, lens: np.ndarray, emitted: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Resume at a block's first document, ``emitted`` of whose rows are committed: the
        block is laid out again from all its documents and those rows skipped."""
        self.resume_rows(emitted)
        return tokens, lens, 0

    def _block(self) -> Iterator[PackedSample]:
        docs, pos = self._docs, self._pos
        self._docs, self._pos, self._tokens = [], [], 0
        skip, self._skip = self._skip, 0
        S = self.sample_tokens
        rows = bestfit_rows([len(d) for d in docs], S, self.min_head)
        for k, row in enumerate(rows[skip:], start=skip + 1):
            lens = [b - a for _, a, b in row]
            pad = S - sum(lens)
            parts = [docs[d][a:b] for d, a, b in row]
            if pad:
                parts.append(np.full(pad, self.pad_id, dtype=self.dtype))
            new = [pos[d] for d, a, _ in row if a == 0]
            yield PackedSample(
                np.concatenate(parts).astype(self.dtype, copy=False),
                [*lens, pad],
                row[0][1] > 0,
                len(new),
                (pos[0], k),
                new,
                row[0][1],
            )
