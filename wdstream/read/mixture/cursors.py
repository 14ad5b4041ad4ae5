"""A mixture chunk's cursors, each carrying its batch's ``source`` indices, pickled compactly.

A torch worker sends each chunk's cursors to the training process by pickle. A mixture's
cursors each hold an int64 array of their batch's row sources; pickled one by one, the 16
arrays of a chunk cost the worker 28 us to dump and the training process 14 us to load
(numpy's reduce per array), where the same indices as one ``bytes`` object cost ~0.3 us each
way. :class:`SourceCursors` is a plain list of the same dicts that pickles so: the cursors
without their ``source`` and the sources' bytes, rebuilt on load as row views of one array::

    cursors  [{"step": 17, "source": [0 1 0 2 ...]}, {"step": 18, "source": [...]}, ...]
    pickled  [{"step": 17}, {"step": 18}, ...] + b"..." (n * B int64) + B + dtype
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wdstream.read.order.base import Cursor
from wdstream.read.order.steps import step_cursors
from wdstream.read.order.window_data import Hit

__all__ = ["SourceCursors", "chunk_cursors"]


class SourceCursors(list[Cursor]):
    """Cursors (each a dict with a ``source`` array of one dtype and length) that pickle
    their sources as one ``bytes`` object; in every other way the list of dicts it holds."""

    def __reduce__(self) -> tuple[Any, ...]:
        rows = [c["source"] for c in self]
        if not rows:
            return (SourceCursors, ([],))
        data = np.concatenate(rows).tobytes()
        if all(len(c) == 2 for c in self):  # mostly: a step and its sources, nothing masked
            return (_rebuilt_steps, ([c["step"] for c in self], data, len(rows[0]),
                                     rows[0].dtype.str))  # fmt: skip
        plain = [{k: v for k, v in c.items() if k != "source"} for c in self]
        return (_rebuilt, (plain, data, len(rows[0]), rows[0].dtype.str))


def _rebuilt(plain: list[Cursor], data: bytes, width: int, dtype: str) -> SourceCursors:
    """The cursors ``plain`` with their sources back: rows of ``width`` of one writable
    array read from ``data`` (each batch's own ``source``, as before pickling)."""
    src = np.frombuffer(data, dtype=np.dtype(dtype)).copy().reshape(len(plain), width)
    for cursor, row in zip(plain, src, strict=True):
        cursor["source"] = row
    return SourceCursors(plain)


def _rebuilt_steps(steps: list[int], data: bytes, width: int, dtype: str) -> SourceCursors:
    """:func:`_rebuilt` of cursors holding only ``step`` and ``source`` (sent as the steps:
    a dict pickled per cursor cost the worker ~6 us a chunk more). The training process
    runs this once a chunk, with its code out of the caches: a writable array straight from
    a ``bytearray`` and a plain loop (no numpy copy, no comprehension's code object) took
    14-15 us a chunk in place against 17-18 (docs/MIXTURES.md, session 46)."""
    src = np.frombuffer(bytearray(data), dtype=dtype).reshape(len(steps), width)
    cursors = SourceCursors()
    for k, x in zip(steps, src, strict=False):  # as many rows as steps: the reshape
        cursors.append({"step": k, "source": x})
    return cursors


def chunk_cursors(
    first: int, n: int, batch_size: int, rank: int, hits: list[Hit], src: np.ndarray
) -> SourceCursors:
    """The cursors of a chunk's steps ``[first, first + n)`` (:func:`step_cursors`), each
    with its batch's ``source``: a row of ``src`` (the chunk's row sources, ``n *
    batch_size``). Without masked rows (mostly) each is made with its sources at once."""
    rows = src.reshape(n, batch_size)
    if not hits:  # a plain loop: run once a chunk, cold, a comprehension is one code object more
        made = SourceCursors()
        for i, x in enumerate(rows, first + 1):
            made.append({"step": i, "source": x})
        return made
    cursors = SourceCursors(step_cursors(first, n, batch_size, rank, hits))
    for cursor, x in zip(cursors, rows, strict=True):
        cursor["source"] = x
    return cursors
