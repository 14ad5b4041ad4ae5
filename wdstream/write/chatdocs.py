"""The chat document encoder of ``pack --chat``: conversations in, stored tokens with the loss
mask in bit 31 out, run in the token pool's worker processes.

Each conversation (a :class:`~wdstream.chat.records.ChatRecord`, parsed in the packing thread)
goes through :class:`~wdstream.chat.masks.ChatEncoder` with the pack's
:class:`~wdstream.chat.recorded.ChatSettings`; its ids are stored with bit 31 on every token
that carries no loss, the pack's BOS/EOS around them (with the bit, ``docs/CHAT.md``; no EOS
after a conversation whose rendered text already ends with that token, e.g. Mistral's or
DeepSeek's ``</s>``-style end of turn, so it is not doubled)::

    [{user: Hi}, {assistant: Yo}]  ->  <|im_start|>|B user|B \\n|B Hi|B ... Yo <|im_end|> \\n|B EOS|B
    tags                               user       user   ...          assistant      added

Beside the tokens it returns, for the pack's audit (:mod:`wdstream.write.chataudit`), each
token's role (a tag: the index in :data:`~wdstream.chat.conversations.ROLES`, or
:data:`~wdstream.write.chataudit.ADDED_TAG` for BOS/EOS) and each conversation's template
problems, assistant turns trained and those left without a supervised token. A conversation the template refuses (its ``raise_exception``) comes back with
length 0 and a note saying why; the document rules make it a bad record naming file and
line (:mod:`wdstream.write.docrules`).

Tokenizer: chat text is tokenised with special tokens recognised
(:meth:`~wdstream.tokenizers.base.Tokenizer.encode_chat`). The bpe-openai backend does not
recognise them, so a bpe-openai pack encodes chat with tiktoken's encoder of the same
encoding (:attr:`ChatDocumentEncoder.tokenizer`): the workers of such a pack load only that
one (:class:`~wdstream.write.tokenpool.TokenPool` hands it to them as their tokenizer, the
object the encoder holds, so it is unpickled once), never the unused bpe-openai binding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from wdstream.chat.conversations import ROLES
from wdstream.chat.masks import ChatEncoder
from wdstream.chat.recorded import ChatSettings
from wdstream.chat.records import ChatRecord
from wdstream.errors import ConversationError
from wdstream.format.loss import ID_BITS, mark_no_loss
from wdstream.tokenizers.base import Tokenizer
from wdstream.tokenizers.tiktoken import BpeEncoder, TiktokenTokenizer
from wdstream.write.chataudit import ADDED_TAG
from wdstream.write.encoders import EncodedBatch, start_not_target, stored_id

__all__ = ["ChatDocumentEncoder", "chat_tokenizer"]

_ROLE_TAG = {role: k for k, role in enumerate(ROLES)}


def chat_tokenizer(tok: Tokenizer) -> Tokenizer | None:
    """The tokenizer chat text needs when ``tok`` cannot encode it itself: tiktoken's encoder
    for a bpe-openai one (same encoding, same ids for ordinary text), else None."""
    if isinstance(tok, TiktokenTokenizer) and tok.backend == "bpe-openai":
        return TiktokenTokenizer(tok.spec, "tiktoken")
    return None


@dataclass(frozen=True)
class ChatDocumentEncoder:
    """A :class:`~wdstream.write.encoders.DocumentEncoder` of conversations (see the module
    docstring). Picklable: the compiled template is rebuilt in each process, once.

    Args:
        settings: template, ``train_on`` and the rest of what decides the tokens.
        bos_id, eos_id: the pack's BOS/EOS added around each conversation (or None).
        tokenizer: the tokenizer to encode chat with instead of the pool's (bpe-openai:
            :func:`chat_tokenizer`), or None.
    """

    settings: ChatSettings
    bos_id: int | None
    eos_id: int | None
    tokenizer: Tokenizer | None = None
    masked = True
    parallel = True
    dtype = "uint32"

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_chat"}

    def _encoder(self, tok: Tokenizer) -> ChatEncoder:
        """The ChatEncoder over ``tok``, made once per process (and per tokenizer)."""
        cached = self.__dict__.get("_chat")
        if cached is None or cached.tokenizer is not tok:
            cached = self.__dict__["_chat"] = self.settings.encoder(tok)
        return cached

    def encode(self, tok: Tokenizer | BpeEncoder, docs: list[Any]) -> EncodedBatch:
        """See :meth:`~wdstream.write.encoders.DocumentEncoder.encode`; tags and notes as the
        module docstring says."""
        chat_tok = self.tokenizer or tok
        assert isinstance(chat_tok, Tokenizer), "chat needs a tokenizer with encode_chat"
        encoder = self._encoder(chat_tok)
        head = np.array([] if self.bos_id is None else [stored_id(self.bos_id, True)], np.uint32)
        tail = np.array([] if self.eos_id is None else [stored_id(self.eos_id, True)], np.uint32)
        nothing = tail[:0]
        added = np.array([ADDED_TAG], dtype=np.uint8)
        tokens: list[np.ndarray] = []
        tags: list[np.ndarray] = []
        notes: list[Any] = []
        lens = np.zeros(len(docs), dtype=np.int64)
        for i, doc in enumerate(docs):
            note, encoded = self._one(encoder, doc)
            notes.append(note)
            if encoded is None:
                continue
            stored, roles = encoded
            if not len(head):  # the first token: no target (encoders.start_not_target)
                stored = start_not_target(stored)
            # A template that ends the conversation with the EOS itself gets no second one.
            end = nothing if int(stored[-1]) & ID_BITS == self.eos_id else tail
            tokens += [head, stored, end]
            tags += [added[: len(head)], roles, added[: len(end)]]
            lens[i] = len(head) + len(stored) + len(end)
        flat = np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.uint32)
        tag = np.concatenate(tags) if tags else np.zeros(0, dtype=np.uint8)
        return EncodedBatch(flat, lens, tag, notes)

    @staticmethod
    def _one(
        encoder: ChatEncoder, doc: ChatRecord
    ) -> tuple[Any, tuple[np.ndarray, np.ndarray] | None]:
        """``(note, (stored ids, role tags))`` of one conversation; None if it is refused."""
        try:
            enc = encoder.encode(doc.messages, doc.tools)
        except ConversationError as exc:
            return {"refused": str(exc)}, None
        if not len(enc.ids):
            return {"refused": "the chat template renders the conversation as no text"}, None
        role_tags = np.array([_ROLE_TAG[r] for r in enc.roles], dtype=np.uint8)
        problems = [[p.kind, p.message, p.detail] for p in enc.problems]
        note = {"problems": problems, "turns": len(enc.trained_turns),
                "unsupervised_turns": enc.unsupervised_turns}  # fmt: skip
        return note, (mark_no_loss(enc.ids, enc.supervised), role_tags[enc.message_index])
