"""What a pack does with an encoded document before it is packed: the long-document rule of
best-fit packing, the refusal of a masked document with no supervised token, and the counts
``index.json`` reports (``docs/MASKS.md``).

It runs in the packing thread on the stored tokens (:mod:`wdstream.write.encoders`), after
the encoder and before the sample builder, so it serves every kind of document alike.
Its counters travel in the positions of the documents it passes on
(:class:`~wdstream.inputs.InputPosition`: the counts *before* each document), exactly like
the reader's, so a resumed pack continues them where the committed shards end::

    best-fit, sample_tokens = 4, long_docs = "truncate", B = bit 31 (no loss)
    document  [p|B q r s t E|B]  ->  [p|B q r E|B]           (cut to a row, EOS appended)
    document  [p|B q|B E|B]      ->  refused: no token carries loss (a bad record)

``long_docs``: ``split`` (cut the document across rows, as text packing does), ``drop``
(skip it, counted) or ``truncate`` (keep its first ``sample_tokens - 1`` tokens and the EOS,
counted). A truncated document is checked for a supervised token after the cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wdstream.errors import InputError
from wdstream.format.loss import NO_LOSS_BIT
from wdstream.inputs import InputPosition

__all__ = ["LONG_DOCS", "DocumentRules"]

LONG_DOCS = ("split", "drop", "truncate")


@dataclass
class DocumentRules:
    """Applies the rules to batches of encoded documents, in input order.

    Args:
        sample_tokens: best-fit row length (the long-document rule), or None: no rule.
        long_docs: ``split``, ``drop`` or ``truncate`` (see the module docstring).
        masked: stored tokens carry the no-loss bit: count supervised tokens, and refuse a
            document without one unless ``allow_unsupervised``.
        allow_unsupervised: keep masked documents none of whose tokens carries loss.
        eos: the stored EOS appended to a truncated document.
        on_error: ``raise`` an InputError for a refused document, or ``skip`` it (counted).
        names: the input file names, for messages.
        start: the resume position (its counters are taken over), or None.
    """

    sample_tokens: int | None
    long_docs: str
    masked: bool
    allow_unsupervised: bool
    eos: int | None
    on_error: str
    names: list[str]
    start: InputPosition | None = None

    def __post_init__(self) -> None:
        if self.long_docs not in LONG_DOCS:
            raise ValueError(f"long_docs must be one of {LONG_DOCS}, got {self.long_docs!r}")
        at = self.start or InputPosition(0, 0, 0, 0, 0, 0)
        self.supervised, self.long_dropped = at.supervised, at.long_dropped
        self.long_truncated, self.unsupervised = at.long_truncated, at.unsupervised

    @property
    def active(self) -> bool:
        """Whether any rule applies (else documents pass untouched and uncounted)."""
        return self.masked or (self.sample_tokens is not None and self.long_docs != "split")

    def counts(self) -> dict[str, int]:
        """The counters for ``index.json``'s stats (masked packs, and any with a long rule)."""
        out: dict[str, int] = {}
        if self.sample_tokens is not None and self.long_docs != "split":
            out |= {"long_documents_dropped": self.long_dropped,
                    "long_documents_truncated": self.long_truncated}  # fmt: skip
        if self.masked:
            out |= {"supervised_tokens": self.supervised,
                    "unsupervised_documents_refused": self.unsupervised}  # fmt: skip
        return out

    def apply(
        self, flat: np.ndarray, lens: np.ndarray, positions: list[InputPosition]
    ) -> tuple[np.ndarray, np.ndarray, list[InputPosition]]:
        """The documents that go on to be packed, each position carrying the counts before it."""
        if not self.active:
            return flat, lens, positions
        ends = np.cumsum(lens)
        starts = ends - lens
        parts: list[np.ndarray] = []
        kept_lens: list[int] = []
        kept_pos: list[InputPosition] = []
        for a, b, pos in zip(starts.tolist(), ends.tolist(), positions, strict=True):
            doc = self._rule(flat[a:b], pos)
            if doc is None:
                continue
            kept_pos.append(self._counted(pos))
            if self.masked:
                self.supervised += int(np.count_nonzero(doc < NO_LOSS_BIT))
            parts.append(doc)
            kept_lens.append(len(doc))
        out = np.concatenate(parts) if parts else flat[:0]
        return out, np.asarray(kept_lens, dtype=np.int64), kept_pos

    def _rule(self, doc: np.ndarray, pos: InputPosition) -> np.ndarray | None:
        """``doc`` as it is packed, or None when it is dropped or refused."""
        S, cut = self.sample_tokens, False
        if S is not None and len(doc) > S and self.long_docs != "split":
            if self.long_docs == "drop":
                self.long_dropped += 1
                return None
            assert self.eos is not None, "best-fit packs append an EOS"
            doc = np.concatenate([doc[: S - 1], np.array([self.eos], dtype=doc.dtype)])
            self.long_truncated += 1
            cut = True
        if self.masked and not self.allow_unsupervised and not (doc < NO_LOSS_BIT).any():
            where = f"{self.names[pos.file]}:{pos.record + 1}"
            if self.on_error == "raise":
                raise InputError(
                    f"{where}: no token of the document carries loss (its mask is all 0"
                    f"{' once truncated to a row' if cut else ''}); pass --allow-unsupervised "
                    "to keep such documents, or --on-error skip to count and skip them"
                )
            self.unsupervised += 1
            return None
        return doc

    def _counted(self, pos: InputPosition) -> InputPosition:
        return pos._replace(
            supervised=self.supervised, long_dropped=self.long_dropped,
            long_truncated=self.long_truncated, unsupervised=self.unsupervised,
        )  # fmt: skip
