"""A raw-text stream's windows, tokenized piece by piece in their shuffled order.

A window is ``W`` documents read in file order; its shuffled order is a permutation that
depends only on the window's seed and its document count, so once the window's *text* is
read the order is known without tokenizing anything. Its tokens are then made in pieces
along that order, each piece one batched tokenizer call over a run of consecutive
documents: the first sized (by characters) for the tokens of the first chunk of batches, a
small one to top it up, then each twice the last::

    window 7 (W = 1024 documents, read and parsed: ~14 MB of text, ~0.3 s)
    shuffled order   d812 d3 d419 ... d77 | d5 d61 | d930 ... | ......... | ...... d200
    pieces           ~ the first chunk      | 1/4    | 1/2      | x2 ...    | capped
                                              (each tokenized in the background while the
                                               one before it is cut into rows)

So the first batch of a fresh start needs the window's text and about one chunk's worth of
tokens, not the whole window's (13 s of a Hugging Face cl100k on 2 cores for 1,024 files),
and a resumed cursor ``(window, emitted=k, offset=o)`` tokenizes from its ``k``-th document
on: the documents before it are read (to know the window) but never tokenized. The tokens
are the same whatever the pieces (a document is always encoded whole, on its own), so the
batches are those of tokenizing the window at once.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import numpy as np

from wdstream.read.sources.text import TextSource

__all__ = ["DocReader", "TextPiece", "TextWindow", "pieces"]

# The longest piece, in characters (~4 MB of text: seconds of one tokenizer thread).
_MAX_PIECE_CHARS = 1 << 22
# Characters per token the first piece is sized for: Python code and English take ~3.5-4.5
# with a 100k-vocabulary BPE. Where the first piece falls short, the second (a quarter of it)
# tops it up, so a first chunk never waits for a piece twice its size.
_CHARS_PER_TOKEN = 4.5


class DocReader:
    """The documents of one stream's files from a position, read strictly sequentially."""

    def __init__(self, source: TextSource, files: list[int], f: int, byte: int, record: int):
        self._gen = self._iter(source, files, f, byte, record)
        self._head = next(self._gen, None)

    @staticmethod
    def _iter(
        source: TextSource, files: list[int], f: int, byte: int, record: int
    ) -> Generator[tuple[str, int, int, int], None, None]:
        for i in range(f, len(files)):
            b, r = (byte, record) if i == f else (0, 0)
            for text, at, rec in source.docs(files[i], b, r):
                yield text, i, at, rec

    def position(self) -> tuple[int, int, int] | None:
        """``(file, byte, record)`` of the next document, None when the files are done."""
        return None if self._head is None else self._head[1:]

    def take(self, n: int) -> list[str]:
        out: list[str] = []
        while len(out) < n and self._head is not None:
            out.append(self._head[0])
            self._head = next(self._gen, None)
        return out

    def close(self) -> None:
        self._gen.close()


@dataclass
class TextWindow:
    """One window's documents, read and put in shuffled order (not yet tokenized)."""

    window: int
    file: int  # where the window starts: index into the stream's file list of this epoch,
    byte: int  # byte offset and record number in that (decompressed) file
    record: int
    texts: list[str]  # in shuffled order

    @classmethod
    def read(
        cls, reader: DocReader, window: int, size: int, order: Callable[[int, int], np.ndarray]
    ) -> TextWindow | None:
        """The next ``size`` documents of ``reader`` as window ``window`` (None: no more).

        ``order(window, n)`` is the window's permutation of its ``n`` documents.
        """
        at = reader.position()
        if at is None:
            return None
        texts = reader.take(size)
        return cls(window, *at, [texts[i] for i in order(window, len(texts)).tolist()])


@dataclass
class TextPiece:
    """Documents ``first ..`` of a window's shuffled order, tokenized and flattened."""

    window: TextWindow
    first: int  # shuffled index (the cursor's ``emitted``) of its first document
    tokens: np.ndarray  # flat int32
    starts: np.ndarray  # int64[m + 1]: where each of its m documents starts in ``tokens``
    doc_start: np.ndarray | None

    def doc_at(self, pos: int) -> tuple[int, int]:
        """``(emitted, offset)`` of token ``pos``: its document's shuffled index in the
        window, and the token's place in that document (the last document starting at
        ``pos`` when some are empty)."""
        k = int(np.searchsorted(self.starts, pos, side="right")) - 1
        return self.first + k, pos - int(self.starts[k])


Tokenize = Callable[[list[str]], tuple[np.ndarray, np.ndarray, np.ndarray | None]]


def pieces(
    reader: DocReader,
    win: TextWindow,
    first: int,
    tokenize: Tokenize,
    next_window: Callable[[DocReader, int], TextWindow | None],
    first_tokens: int,
) -> Iterator[TextPiece]:
    """The stream's pieces from document ``first`` of window ``win`` on, to the files' end.

    Args:
        reader: the stream's documents after ``win``.
        win: the window to start in (already read).
        first: its first document to tokenize (a resumed cursor's ``emitted``).
        tokenize: texts -> ``(flat tokens, starts, doc starts)``, one batched call.
        next_window: ``(reader, window number)`` -> the next window read, or None.
        first_tokens: tokens the first piece is sized for (the first chunk of batches).
    """
    budget = max(1, int(first_tokens * _CHARS_PER_TOKEN))
    grow = [max(1, budget // 4)]  # then twice the last, up to the cap
    while True:
        texts, j = win.texts, first
        while j < len(texts):
            m, size = j, 0
            while m < len(texts) and (m == j or size < budget):
                size += len(texts[m])
                m += 1
            yield TextPiece(win, j, *tokenize(texts[j:m]))
            j, budget = m, grow.pop() if grow else min(2 * budget, _MAX_PIECE_CHARS)
        following = next_window(reader, win.window + 1)
        if following is None:
            return
        win, first = following, 0
