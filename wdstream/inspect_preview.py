"""The text ``wdstream inspect`` prints for one sample: a line per document piece, the
best-fit padding on a line of its own, supervised spans marked whole.

A piece is decoded whole and cut on characters (never on tokens: a cut through a character
that takes several tokens, as CJK often does in byte-level BPE, would print U+FFFD). In a
dataset with a loss mask, each run of tokens that carry loss is decoded on its own and shown
whole in ``[[...]]``; the width bounds the text around the runs, each run of text without
loss longer than its share shown as its start and end with ``…`` between::

    doc      [267 tokens] <|im_start|>system\\nYou are…<|im_start|>assistant\\n[[Hello<|im_end|>]]\\n…
    padding  [12 tokens]

A span is closed with ``]]`` only where the loss mask ends it; a piece cut inside a span (a
document continued in the next row, or ``width`` shorter than one span with ``whole_spans=
False``) ends in ``[[…`` without ``]]``. A character split across the edge of a span (its
bytes in tokens on both sides) shows as U+FFFD on each side, as the data holds it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from wdstream.format.index import DatasetIndex
from wdstream.inspect import SamplePreview
from wdstream.words import count

__all__ = ["DEFAULT_WIDTH", "marked_text", "sample_lines"]

DEFAULT_WIDTH = 160  # characters of a piece's text shown (0: all)
_MIN_SHARE = 24  # characters a run without loss keeps at least, when spans fill the width
_CUT = "…"


def sample_lines(
    p: SamplePreview, index: DatasetIndex | None, decode: Callable[[Any], str], width: int
) -> list[str]:
    """The sample's header line and a line per document piece (``...cont`` for a piece
    continuing the previous sample's document), then ``padding`` for a best-fit row's
    padding (never shown as a document; a single shard read without its ``index.json``
    does not say its mode, so there the last piece of a row is shown as it is stored)."""
    sup = "" if p.supervised is None else f", {int(p.supervised.sum())} supervised"
    lines = [
        f"{p.key}: {count(p.tokens, 'token')}{sup}, doc_lens {list(p.doc_lens)}, cont {p.cont}"
    ]
    pieces = index.document_pieces(p.doc_lens) if index is not None else p.doc_lens
    pos = 0
    for j, n in enumerate(pieces):
        ids = p.ids[pos : pos + n]
        mask = None if p.supervised is None else p.supervised[pos : pos + n]
        pos += n
        head = "  ...cont " if j == 0 and p.cont else "  doc      "
        goes_on = j == len(pieces) - 1 and _goes_on(index, ids)
        text = marked_text(decode, ids, mask, width, open_end=goes_on)
        lines.append(f"{head}[{count(n, 'token')}] {text}")
    if len(pieces) < len(p.doc_lens) and p.doc_lens[-1]:
        lines.append(f"  padding  [{count(p.doc_lens[-1], 'token')}]")
    return lines


def marked_text(
    decode: Callable[[Any], str],
    ids: Any,
    supervised: np.ndarray | None,
    width: int = DEFAULT_WIDTH,
    whole_spans: bool = True,
    open_end: bool = False,
) -> str:
    """``ids`` decoded on one line (newlines as ``\\n``), each run of supervised tokens in
    ``[[...]]`` (module docstring).

    Args:
        decode: the dataset's tokenizer's decode.
        ids: token ids (no loss bit).
        supervised: True where a token carries loss; None: no mask (plain text).
        width: characters of text shown; 0: all. Supervised spans do not count against it
            while ``whole_spans``.
        whole_spans: show every supervised span whole, however long; False: cut them too.
        open_end: the document goes on in the next sample: a span at the end is left open
            (``[[...…``), as it does not end here.
    """
    if supervised is None or not len(ids):
        return _escaped(_cut(decode(ids), width))
    flips = (np.flatnonzero(supervised[1:] != supervised[:-1]) + 1).tolist()
    edges = [0, *flips, len(ids)]
    runs = [(decode(ids[a:b]), bool(supervised[a]))
            for a, b in zip(edges, edges[1:], strict=False)]  # fmt: skip
    if width and whole_spans:
        plain = [len(t) for t, sup in runs if not sup]
        room = width - sum(len(t) for t, sup in runs if sup)
        share = max(_MIN_SHARE, room // max(len(plain), 1))
        runs = [(t if sup else _middle(t, share, k == 0, k == len(runs) - 1), sup)
                for k, (t, sup) in enumerate(runs)]  # fmt: skip
        width = 0
    out: list[str] = []
    left = width or sys.maxsize  # 0: no bound
    for k, (text, sup) in enumerate(runs):
        if left <= 0:
            out.append(_CUT)
            break
        cut = len(text) > left
        shown = text[: left - 1] + _CUT if cut else text
        left -= len(shown)
        if sup and open_end and k == len(runs) - 1 and not cut:
            shown, cut = shown + _CUT, True
        out.append(("[[" + shown + ("" if cut else "]]")) if sup else shown)
        if cut:
            break
    return _escaped("".join(out))


def _goes_on(index: DatasetIndex | None, ids: np.ndarray) -> bool:
    """Whether a sample's last document piece continues in the next sample: it does not end
    with the EOS every document ends with (unknown without an index or an EOS: False)."""
    if index is None or index.eos_id is None or not len(ids) or index.mode == "docs":
        return False
    return int(ids[-1]) != index.eos_id


def _escaped(text: str) -> str:
    return text.replace("\n", "\\n")


def _cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with ``…`` as its last (0: whole)."""
    return text if not width or len(text) <= width else text[: width - 1] + _CUT


def _middle(text: str, share: int, first: bool, last: bool) -> str:
    """A run without loss in ``share`` characters: the piece's first run keeps its end (the
    prompt right before the first span), its last run (or its only one) its start, a run
    between spans both ends."""
    if len(text) <= share:
        return text
    if first and not last:
        return _CUT + text[len(text) - share + 1 :]
    if last:
        return text[: share - 1] + _CUT
    half = (share - 1) // 2
    return text[:half] + _CUT + text[len(text) - (share - 1 - half) :]
