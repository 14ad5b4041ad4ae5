"""Where the rows a fill cuts go in the caller's block: rows ``[0, n)`` of it, or any ``n``
rows of it (``RowPlaces``), so that a mixture writes each source's rows straight into their
places in the batch instead of into a scratch block scattered after::

    mixture rows   0    1    2    3    4    5    6    7        (one chunk, batch block)
    source         web  code web  code web  web  code web
    web's fill     rows 0 1 2 3 4 of its epoch run -> into = [0, 2, 4, 5, 7]

The filled rows' tokens are numbered as if contiguous (token ``o`` is token ``o % (T + 1)``
of filled row ``o // (T + 1)``); a place maps them to the block.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RowPlaces", "piece_starts"]


class RowPlaces:
    """Filled row ``j`` is row ``into[j]`` of a block of rows of ``row_tokens`` tokens.

    Args:
        into: the block's rows, one per filled row (int64).
        row_tokens: tokens per row (T + 1).
    """

    def __init__(self, into: np.ndarray, row_tokens: int) -> None:
        self.into, self.row_tokens = into, row_tokens
        self.starts: list[int] = (into * row_tokens).tolist()  # flat offset of each row

    def copy(self, flat: np.ndarray, o: int, piece: np.ndarray) -> None:
        """Copy ``piece``, tokens ``[o, o + len(piece))`` of the filled rows, into ``flat``
        (the block, flat): one copy per row it reaches."""
        T1, done = self.row_tokens, 0
        while done < len(piece):
            r, c = divmod(o + done, T1)
            take = min(T1 - c, len(piece) - done)
            flat[self.starts[r] + c : self.starts[r] + c + take] = piece[done : done + take]
            done += take

    def flat(self, tokens: np.ndarray) -> np.ndarray:
        """The block's flat offsets of filled-row tokens ``tokens``."""
        return self.into[tokens // self.row_tokens] * self.row_tokens + tokens % self.row_tokens


def piece_starts(doc_lens: tuple[int, ...], off: int, take: int) -> np.ndarray:
    """Where document pieces begin in tokens ``[off, off + take)`` of a sample of documents
    ``doc_lens`` long, counted from ``off``: 0 (a sample boundary, or a row start inside a
    sample) and every document start inside."""
    marks = np.concatenate([[0], np.cumsum(doc_lens)[:-1]]) - off
    return np.append(marks[(marks > 0) & (marks < take)], 0)
