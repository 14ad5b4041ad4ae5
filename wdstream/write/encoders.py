"""Document encoders: a batch of documents in, their stored tokens out.

The hook every kind of document plugs into (:class:`DocumentEncoder`). The token pool
(:mod:`wdstream.write.tokenpool`) runs an encoder over batches of documents, in worker
processes or inline, and hands the sample builders the result: the **stored** form of every
token (the pack's dtype; in a masked pack ``uint32`` with bit 31 set on every token that
carries no loss, :func:`wdstream.format.loss.mark_no_loss`), BOS/EOS already added. The
builders and everything after them never look inside a token, so a new kind of document
(conversations rendered through a chat template) is one more encoder, nothing else::

    text        "Hello world"                   -> [9906, 1917, EOS]            (TextEncoder)
    ids + mask  [9906, 1917], [0, 1]            -> [9906|B, 1917, EOS|B]        (TokenIdsEncoder)
    conversation [{user: Hi}, {assistant: Yo}]  -> [...|B, Yo, <|im_end|>, EOS|B]
                                                   (ChatDocumentEncoder, wdstream.write.chatdocs)
                                                                 (B = bit 31: no loss)

An encoder returns an :class:`EncodedBatch`: the stored tokens and each document's length,
and, for an encoder that reports what it found (chat: each token's role, each conversation's
template problems), a tag per token and a note per document, which the document rules carry
to the pack's audit (:mod:`wdstream.write.docrules`).

Rules of a masked document (``docs/CHAT.md``): BOS and the EOS the pack appends carry no
loss (the document's own end-of-turn token, inside its ids, is what is supervised), and so
does best-fit padding (the pack's ``pad_id`` is stored with the bit). Without a BOS, the
document's first token carries no loss whatever its mask says (:func:`start_not_target`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from wdstream.format.loss import NO_LOSS_BIT, mark_no_loss
from wdstream.inputs.pretokenized import TokenDocument
from wdstream.tokenizers.base import Tokenizer
from wdstream.tokenizers.tiktoken import BpeEncoder, TiktokenTokenizer

__all__ = [
    "DocumentEncoder",
    "EncodedBatch",
    "TextEncoder",
    "TokenIdsEncoder",
    "encode_flat",
    "join_documents",
    "start_not_target",
    "stored_id",
]


class EncodedBatch(NamedTuple):
    """A batch of encoded documents.

    Attributes:
        flat: every document's stored tokens, concatenated (the encoder's ``dtype``).
        lens: each document's length (int64). 0 only for a document the encoder refused;
            its note says why.
        tags: None, or a ``uint8`` per stored token for the audit (chat: the role).
        notes: None, or one JSON-able value per document for the audit (chat: problems).
    """

    flat: np.ndarray
    lens: np.ndarray
    tags: np.ndarray | None = None
    notes: list[Any] | None = None


class DocumentEncoder(Protocol):
    """Encodes batches of documents into stored tokens. Picklable (it crosses to the token
    pool's worker processes with the tokenizer's recipe), stateless, deterministic.

    Attributes:
        masked: whether stored tokens carry the no-loss bit (the dataset's index.json then
            says ``"loss_mask": "bit31"`` and its dtype is ``uint32``).
        parallel: whether encoding is worth a worker process (tokenising is; copying
            pre-tokenized ids is not, it runs in the packing thread).
        dtype: the stored dtype of the tokens it returns.
    """

    @property
    def masked(self) -> bool: ...

    @property
    def parallel(self) -> bool: ...

    @property
    def dtype(self) -> str: ...

    def encode(self, tok: Tokenizer | BpeEncoder, docs: list[Any]) -> EncodedBatch:
        """Every document's stored tokens concatenated (BOS/EOS added, ``dtype`` of the
        pack) and each document's length (int64, >= 1 unless the encoder refused it)."""
        ...


def stored_id(token: int, masked: bool) -> int:
    """The stored form of a special token the pack adds (BOS, EOS, padding): with the
    no-loss bit in a masked pack."""
    return token | NO_LOSS_BIT if masked else token


def encode_flat(
    tok: Tokenizer | BpeEncoder,
    texts: list[str],
    bos_id: int | None,
    eos_id: int | None,
    dtype: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Encode ``texts``; return all ids (BOS/EOS added) concatenated, and each document's length."""
    fast = tok.bpe if isinstance(tok, TiktokenTokenizer) else tok
    if isinstance(fast, BpeEncoder):
        flat, lens = fast.encode_flat(texts, bos_id, eos_id)
        return flat.astype(dtype, copy=False), lens
    assert isinstance(tok, Tokenizer)
    return join_documents(tok.encode_batch(texts), bos_id, eos_id, dtype)


def join_documents(
    arrays: list[np.ndarray], bos: int | None, eos: int | None, dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    """Documents' ids with ``bos``/``eos`` (stored forms, or None) around each, concatenated."""
    pieces: list[np.ndarray] = []
    head = None if bos is None else np.array([bos], dtype=np.uint32)
    tail = None if eos is None else np.array([eos], dtype=np.uint32)
    for a in arrays:
        if head is not None:
            pieces.append(head)
        pieces.append(a)
        if tail is not None:
            pieces.append(tail)
    extra = (bos is not None) + (eos is not None)
    lens = np.fromiter((len(a) + extra for a in arrays), dtype=np.int64, count=len(arrays))
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint32)
    return flat.astype(dtype, copy=False), lens


@dataclass(frozen=True)
class TextEncoder:
    """Text documents, tokenised; the pack's BOS/EOS around each. Never masked."""

    bos_id: int | None
    eos_id: int | None
    dtype: str
    masked = False
    parallel = True

    def encode(self, tok: Tokenizer | BpeEncoder, docs: list[Any]) -> EncodedBatch:
        """See :meth:`DocumentEncoder.encode`."""
        return EncodedBatch(*encode_flat(tok, docs, self.bos_id, self.eos_id, self.dtype))


@dataclass(frozen=True)
class TokenIdsEncoder:
    """Pre-tokenized documents (:class:`~wdstream.inputs.pretokenized.TokenDocument`): their
    ids as given, BOS/EOS around each; with ``masked``, stored with the loss bit where the
    document's mask says no loss, and on the BOS/EOS the pack adds."""

    bos_id: int | None
    eos_id: int | None
    dtype: str
    masked: bool
    parallel = False

    def encode(self, tok: Tokenizer | BpeEncoder, docs: list[Any]) -> EncodedBatch:
        """See :meth:`DocumentEncoder.encode` (``tok`` is not used: the ids are given)."""
        arrays = [self._stored(d) for d in docs]
        bos = None if self.bos_id is None else stored_id(self.bos_id, self.masked)
        eos = None if self.eos_id is None else stored_id(self.eos_id, self.masked)
        return EncodedBatch(*join_documents(arrays, bos, eos, self.dtype))

    def _stored(self, doc: TokenDocument) -> np.ndarray:
        if not self.masked:
            return doc.ids.astype(self.dtype)
        assert doc.supervised is not None, "a masked pack reads a mask with every record"
        stored = mark_no_loss(doc.ids, doc.supervised)
        return stored if self.bos_id is not None else start_not_target(stored)


def start_not_target(stored: np.ndarray) -> np.ndarray:
    """``stored`` (a masked document's uint32 ids, no BOS before them) with the no-loss bit
    on its first token: nothing in the document predicts it (in a row it would be predicted
    from the previous document's end), as in transformers, where ``labels[0]`` is never a
    target. So the stored mask alone says which targets carry loss, document starts
    included, and the reader applies no document-end rule of its own to masked data
    (``docs/FORMAT.md``: "loss_mask: bit31")."""
    if len(stored):
        stored[0] |= np.uint32(NO_LOSS_BIT)
    return stored
