"""Best-fit packing: rows of ``sample_tokens`` that hold whole documents.

Documents are taken in blocks of ``buffer`` consecutive documents (in input order). Each
block is packed on its own by best-fit decreasing (Ding et al., "Fewer Truncations Improve
Language Modeling", 2024): its items, longest first, each go into the fullest row they still
fit; the slack at a row's end is padding. A document longer than a row is the only one cut:
into full rows plus a *tail* (its last ``len % sample_tokens`` tokens), and only the tail is
best-fit; the full rows are emitted right before the row holding the tail, which starts with
it, so every document's pieces are consecutive samples (``cont`` links them as in concat
mode). A row holds at most one tail. ``sample_tokens = 5``, block of documents
``A`` (3 tokens), ``B`` (7), ``C`` (2), ``D`` (1)::

    items (longest first)   A:3  B-tail:2  C:2  D:1       (B = full row B[0:5] + tail B[5:7])
    rows                    [B B B B B] [B B A A A] [C C D . .]
    doc_lens                 [5, 0]      [2, 3, 0]   [2, 1, 2]    (last entry: padding)
    cont                     False       True        False

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

__all__ = ["DEFAULT_BUFFER", "BestFitPacker", "Piece", "bestfit_rows"]

DEFAULT_BUFFER = 4096  # documents per best-fit block

Piece = tuple[int, int, int]  # (document index in the block, first token, end token)


@dataclass
class _Bin:
    free: int
    pieces: list[Piece]
    tail: bool  # holds a long document's tail (always placed first)
    first_doc: int  # smallest document index in it (orders the output)


def bestfit_rows(lens: Sequence[int] | np.ndarray, sample_tokens: int) -> list[list[Piece]]:
    """Rows of whole documents (long ones cut into full rows plus a tail), best-fit decreasing.

    Args:
        lens: document lengths in tokens (every one >= 1), in input order.
        sample_tokens: tokens per row.

    Returns:
        The rows in output order, each a list of pieces ``(doc, start, stop)`` in row order;
        a row's tokens are its pieces' tokens, then padding up to ``sample_tokens``. Rows come
        in order of the smallest document they hold; a long document's full rows come right
        before the row that starts with its tail.

    Raises:
        ValueError: for a length < 1 or ``sample_tokens`` < 1.
    """
    if sample_tokens < 1:
        raise ValueError(f"sample_tokens must be >= 1, got {sample_tokens}")
    S = sample_tokens
    items: list[tuple[int, int, int, bool]] = []  # (size, doc, start, is_tail)
    full: dict[int, list[list[Piece]]] = {}  # doc -> its full rows
    for d, n in enumerate(lens):
        n = int(n)
        if n < 1:
            raise ValueError(f"document {d} has {n} tokens; every document needs >= 1")
        k, r = divmod(n, S)
        if k and (k > 1 or r):
            full[d] = [[(d, j * S, (j + 1) * S)] for j in range(k)]
        elif k:  # exactly one row: an ordinary item that fills a row
            r = n
        if r:
            items.append((r, d, n - r, n > S))
    items.sort(key=lambda it: (-it[0], it[1]))
    bins: list[_Bin] = []
    keys: list[tuple[int, int]] = []  # (free, bin number) of open bins, sorted
    for size, d, a, is_tail in items:
        at = bisect.bisect_left(keys, (size, -1))
        while at < len(keys) and is_tail and bins[keys[at][1]].tail:
            at += 1
        if at < len(keys):
            b = keys.pop(at)[1]
            bins[b].free -= size
            bins[b].pieces.append((d, a, a + size))
            bins[b].first_doc = min(bins[b].first_doc, d)
            bins[b].tail = bins[b].tail or is_tail
        else:
            b = len(bins)
            bins.append(_Bin(S - size, [(d, a, a + size)], is_tail, d))
        if bins[b].free:
            bisect.insort(keys, (bins[b].free, b))
    units: list[tuple[int, list[list[Piece]]]] = []
    tails: set[int] = set()
    for bin_ in bins:
        # Row order: the tail (a continuation) first, then documents in input order.
        row = sorted(bin_.pieces, key=lambda p: (p[1] == 0, p[0]))
        head = full.get(row[0][0], []) if bin_.tail else []
        if bin_.tail:
            tails.add(row[0][0])
        units.append((bin_.first_doc, [*head, row]))
    units += [(d, rows) for d, rows in full.items() if d not in tails]
    units.sort(key=lambda u: u[0])
    return [row for _, rows in units for row in rows]


class BestFitPacker:
    """Packs documents into best-fit rows of exactly ``sample_tokens`` tokens (padding last).

    Same interface as :class:`~wdstream.write.samples.ConcatPacker`. Every sample's
    ``doc_lens`` ends with its padding length (0 for a full row), so ``doc_lens`` sums to
    ``sample_tokens`` and the padding is told apart without reading the tokens.

    Args:
        sample_tokens: tokens per row (``seq_len + 1``).
        dtype: on-disk token dtype.
        buffer: documents per best-fit block (memory is about one block of tokens).
        pad_id: the token written into padding.
    """

    def __init__(self, sample_tokens: int, dtype: np.dtype, buffer: int, pad_id: int) -> None:
        if sample_tokens < 1:
            raise ValueError(f"sample_tokens must be >= 1, got {sample_tokens}")
        if buffer < 1:
            raise ValueError(f"bestfit buffer must be >= 1 documents, got {buffer}")
        self.sample_tokens, self.dtype = sample_tokens, dtype
        self.buffer, self.pad_id = buffer, pad_id
        self._docs: list[np.ndarray] = []
        self._pos: list[Any] = []
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
            if len(self._docs) == self.buffer:
                yield from self._block()

    def flush(self) -> Iterator[PackedSample]:
        """Yield the rows of the last, partial block."""
        if self._docs:
            yield from self._block()

    def resume_rows(self, rows: int) -> None:
        """Resume inside a block: its first ``rows`` rows are already in committed shards."""
        assert not self._docs, "resume only into an empty packer"
        self._skip = rows

    def _block(self) -> Iterator[PackedSample]:
        docs, pos = self._docs, self._pos
        self._docs, self._pos = [], []
        skip, self._skip = self._skip, 0
        S = self.sample_tokens
        rows = bestfit_rows([len(d) for d in docs], S)
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
            )
