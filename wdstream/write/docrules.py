"""What a pack does with an encoded document before it is packed: the long-document rule of
best-fit packing, the refusal of a masked document with no supervised token (and of one its
encoder refused: a conversation its chat template refuses), and the counts ``index.json``
reports (``docs/CHAT.md``), with a chat pack's audit (:mod:`wdstream.write.chataudit`).

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
from typing import Any

import numpy as np

from wdstream.errors import InputError
from wdstream.format.loss import carries_loss
from wdstream.inputs import InputPosition
from wdstream.write.chataudit import ADDED_TAG, ChatAudit
from wdstream.write.encoders import EncodedBatch

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
        audited: keep a :class:`~wdstream.write.chataudit.ChatAudit` of the documents
            packed (the encoder tags every token with its role and notes problems).
    """

    sample_tokens: int | None
    long_docs: str
    masked: bool
    allow_unsupervised: bool
    eos: int | None
    on_error: str
    names: list[str]
    start: InputPosition | None = None
    audited: bool = False

    def __post_init__(self) -> None:
        if self.long_docs not in LONG_DOCS:
            raise ValueError(f"long_docs must be one of {LONG_DOCS}, got {self.long_docs!r}")
        at = self.start or InputPosition(0, 0, 0, 0, 0, 0)
        self.supervised, self.long_dropped = at.supervised, at.long_dropped
        self.long_truncated, self.unsupervised = at.long_truncated, at.unsupervised
        self.audit = ChatAudit(at.audit) if self.audited else None

    @property
    def active(self) -> bool:
        """Whether any rule applies (else documents pass untouched and uncounted)."""
        return self.masked or (self.sample_tokens is not None and self.long_docs != "split")

    def counts(self) -> dict[str, Any]:
        """The counters for ``index.json``'s stats (masked packs, and any with a long rule);
        an audited pack's audit under ``chat``."""
        out: dict[str, Any] = {}
        if self.sample_tokens is not None and self.long_docs != "split":
            out |= {"long_documents_dropped": self.long_dropped,
                    "long_documents_truncated": self.long_truncated}  # fmt: skip
        if self.masked:
            out |= {"supervised_tokens": self.supervised,
                    "unsupervised_documents_refused": self.unsupervised}  # fmt: skip
        if self.audit is not None:
            out["chat"] = self.audit.stats()
        return out

    def apply(
        self, batch: EncodedBatch, positions: list[InputPosition]
    ) -> tuple[np.ndarray, np.ndarray, list[InputPosition]]:
        """The documents that go on to be packed (their stored tokens and lengths), each
        position carrying the counts before it."""
        flat, lens = batch.flat, batch.lens
        if not self.active:
            return flat, lens, positions
        ends = np.cumsum(lens)
        starts = ends - lens
        parts: list[np.ndarray] = []
        kept_lens: list[int] = []
        kept_pos: list[InputPosition] = []
        for i, (a, b, pos) in enumerate(
            zip(starts.tolist(), ends.tolist(), positions, strict=True)
        ):
            before = self._counted(pos)
            note = batch.notes[i] if batch.notes is not None else None
            if a == b:  # the encoder refused it; its note says why
                self._refused(pos, note)
                continue
            tags = batch.tags[a:b] if batch.tags is not None else None
            kept = self._rule(flat[a:b], tags, pos)
            if kept is None:
                continue
            doc, tags = kept
            kept_pos.append(before)
            if self.masked:
                self.supervised += int(np.count_nonzero(carries_loss(doc)))
            if self.audit is not None:
                assert tags is not None, "an audited pack's encoder tags every token"
                self.audit.add(doc, tags, note, self._where(pos))
            parts.append(doc)
            kept_lens.append(len(doc))
        out = np.concatenate(parts) if parts else flat[:0]
        return out, np.asarray(kept_lens, dtype=np.int64), kept_pos

    def _where(self, pos: InputPosition) -> str:
        return f"{self.names[pos.file]}:{pos.record + 1}"

    def _refused(self, pos: InputPosition, note: Any) -> None:
        """A document its encoder refused (a conversation the chat template refuses): an
        InputError naming file and line, or with ``on_error="skip"`` counted."""
        why = note.get("refused", "refused by the encoder") if isinstance(note, dict) else str(note)
        if self.on_error == "raise":
            raise InputError(f"{self._where(pos)}: {why}")
        assert self.audit is not None, "only an audited (chat) encoder refuses documents"
        self.audit.refused(self._where(pos), why)

    def _rule(
        self, doc: np.ndarray, tags: np.ndarray | None, pos: InputPosition
    ) -> tuple[np.ndarray, np.ndarray | None] | None:
        """``doc`` (and its tags) as it is packed, or None when it is dropped or refused."""
        S, cut = self.sample_tokens, False
        if S is not None and len(doc) > S and self.long_docs != "split":
            if self.long_docs == "drop":
                self.long_dropped += 1
                return None
            assert self.eos is not None, "best-fit packs append an EOS"
            doc = np.concatenate([doc[: S - 1], np.array([self.eos], dtype=doc.dtype)])
            if tags is not None:
                tags = np.concatenate([tags[: S - 1], np.array([ADDED_TAG], dtype=tags.dtype)])
            self.long_truncated += 1
            cut = True
        if self.masked and not self.allow_unsupervised and not carries_loss(doc).any():
            where = self._where(pos)
            if self.on_error == "raise":
                raise InputError(
                    f"{where}: no token of the document carries loss (its mask is all 0"
                    f"{' once truncated to a row' if cut else ''}); pass --allow-unsupervised "
                    "to keep such documents, or --on-error skip to count and skip them"
                )
            self.unsupervised += 1
            return None
        return doc, tags

    def _counted(self, pos: InputPosition) -> InputPosition:
        """``pos`` with the counts before its document (a resume there counts it again)."""
        return pos._replace(
            supervised=self.supervised, long_dropped=self.long_dropped,
            long_truncated=self.long_truncated, unsupervised=self.unsupervised,
            audit=None if self.audit is None else self.audit.snapshot(),
        )  # fmt: skip
