"""What a pack's documents are: text (the default), pre-tokenized ids with an optional loss
mask, or conversations rendered through a chat template (``chat``), resolved once into the
parts the engines run (:class:`~wdstream.write.engine.PackJob`): the record parser, the
:class:`~wdstream.write.encoders.DocumentEncoder`, the
:class:`~wdstream.write.docrules.DocumentRules`, the stored dtype and padding.

Whether a dataset stores a loss mask is decided here, before the first shard, from the
options alone (never from what the records hold): it sets every shard's dtype (``uint32``,
whatever the vocabulary) and is part of the pack's resume fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from wdstream.chat.recorded import ChatSettings
from wdstream.chat.records import ConversationFields
from wdstream.chat.template import template_variables
from wdstream.format.index import ShardEntry
from wdstream.format.loss import LOSS_MASK_KIND
from wdstream.inputs.records import RecordDocument
from wdstream.storage import Store
from wdstream.tokenizers import Tokenizer
from wdstream.write.chatdocs import ChatDocumentEncoder, chat_tokenizer
from wdstream.write.docrules import LONG_DOCS, DocumentRules
from wdstream.write.encoders import DocumentEncoder, TextEncoder, TokenIdsEncoder, stored_id
from wdstream.write.journal import journal_fingerprint
from wdstream.write.token_records import CheckedTokenFields

__all__ = ["DocumentParts", "PackDocuments", "interrupted_chat_now", "mask_stats"]


@dataclass(frozen=True)
class DocumentParts:
    """The resolved parts (see the module docstring)."""

    document: RecordDocument | None
    encoder: DocumentEncoder
    dtype: str
    pad_id: int  # stored form (with the no-loss bit in a masked pack)
    loss_mask: str | None  # index.json's "loss_mask"
    rules: partial[DocumentRules] | None
    chat: ChatSettings | None = None  # a chat pack's settings (index.json's stats.chat)
    long_docs: str | None = None  # best-fit packs: the long-document rule in force


@dataclass(frozen=True)
class PackDocuments:
    """The document options of :func:`wdstream.pack` (see its docstring)."""

    pretokenized: bool = False
    ids_key: str = "input_ids"
    mask_key: str | None = None
    long_docs: str | None = None
    allow_unsupervised: bool = False
    chat: bool = False
    messages_key: str = "messages"
    chat_template: str | None = None
    train_on: str = "assistant"
    special_tokens_in_content: str = "text"
    chat_template_kwargs: dict[str, Any] | None = None
    allow_unlocated: bool = False

    @property
    def masked(self) -> bool:
        """Whether the dataset stores a loss mask."""
        return self.chat or (self.pretokenized and self.mask_key is not None)

    def check(self, mode: str, engine: str) -> None:
        """Refuse options that do not go together.

        Raises:
            ValueError: naming the option.
        """
        if self.chat:
            self._check_chat(mode)
        elif (
            self.messages_key,
            self.chat_template,
            self.train_on,
            self.special_tokens_in_content,
            self.chat_template_kwargs or None,
        ) != ("messages", None, "assistant", "text", None):
            raise ValueError(
                "messages_key, chat_template, train_on, special_tokens_in_content and "
                "chat_template_kwargs (--messages-key, --chat-template, --train-on, "
                "--special-tokens-in-content, --chat-template-kwargs) are options of chat "
                "packs: add --chat"
            )  # fmt: skip
        if self.mask_key is not None and not self.pretokenized:
            raise ValueError(
                "mask_key (--mask-key) reads pre-tokenized records: add --pretokenized"
            )
        if self.long_docs is not None:
            if self.long_docs not in LONG_DOCS:
                raise ValueError(f"long_docs must be one of {LONG_DOCS}, got {self.long_docs!r}")
            if mode != "bestfit":
                raise ValueError(
                    f"long_docs (--long-docs) is a rule of --mode bestfit (got mode {mode!r}): "
                    "concat and docs samples hold documents of any length"
                )
        if self.allow_unlocated and not self.chat:
            raise ValueError("allow_unlocated (--allow-unlocated) is for chat packs (--chat)")
        if self.allow_unsupervised and not self.masked:
            raise ValueError("allow_unsupervised (--allow-unsupervised) is for masked packs only")
        if engine != "local" and (self.pretokenized or self.chat or self.long_docs is not None):
            raise ValueError(
                "engine='ray' packs text only: pre-tokenized documents, conversations (--chat) "
                "and --long-docs need engine='local' (--engine local)"
            )

    def _check_chat(self, mode: str) -> None:
        if self.chat_template_kwargs is not None:
            template_variables(self.chat_template_kwargs)
        if self.pretokenized:
            raise ValueError("chat (--chat) reads conversations, pretokenized records of ids")
        if mode == "concat":
            raise ValueError(
                "chat (--chat) keeps every conversation whole: use mode 'bestfit' (rows of whole "
                "conversations, the default with --chat) or 'docs' (one per sample), not 'concat'"
            )

    def fingerprint(self) -> dict[str, Any]:
        """What of these options decides the output (nothing for a plain text pack, so its
        resume fingerprint is unchanged; a chat pack adds its settings' fingerprint, made
        by :meth:`resolve`)."""
        keys = ("pretokenized", "ids_key", "mask_key", "long_docs", "allow_unsupervised")
        defaults = PackDocuments()
        return {k: getattr(self, k) for k in keys if getattr(self, k) != getattr(defaults, k)}

    def resolve(
        self,
        tok: Tokenizer,
        ids: tuple[int | None, int | None, str],
        layout: tuple[str, int],
        on_error: str,
        names: list[str],
        chat_now: datetime | str | None = None,
    ) -> DocumentParts:
        """The parts for ``tok`` with ``ids`` = (bos_id, eos_id, dtype by vocabulary) and
        ``layout`` = (mode, seq_len); a chat pack's template renders ``strftime_now`` as
        ``chat_now`` (default: the clock, :class:`~wdstream.chat.recorded.ChatSettings`).

        Raises:
            ChatTemplateError: a chat pack's template is missing or does not compile.
        """
        bos_id, eos_id, dtype = ids
        mode, seq_len = layout
        masked = self.masked
        if masked:
            dtype = "uint32"  # the mask is bit 31 of every stored id
        encoder: DocumentEncoder
        document: RecordDocument | None = None
        chat = None
        if self.chat:
            chat = ChatSettings.load(tok, self.chat_template, self.train_on, self.messages_key,
                                     chat_now, self.special_tokens_in_content,
                                     self.chat_template_kwargs)  # fmt: skip
            document = ConversationFields(self.messages_key)
            encoder = ChatDocumentEncoder(chat, bos_id, eos_id, chat_tokenizer(tok))
        elif self.pretokenized:
            document = CheckedTokenFields(tok.n_vocab, self.ids_key, self.mask_key)
            encoder = TokenIdsEncoder(bos_id, eos_id, dtype, masked)
        else:
            encoder = TextEncoder(bos_id, eos_id, dtype)
        long_docs = self.long_docs or ("drop" if masked else "split")
        rules = None
        if masked or long_docs != "split":
            eos = None if eos_id is None else stored_id(eos_id, masked)
            rules = partial(
                DocumentRules, seq_len + 1 if mode == "bestfit" else None, long_docs, masked,
                self.allow_unsupervised, eos, on_error, names, audited=self.chat,
            )  # fmt: skip
        pad = stored_id(eos_id or 0, masked)
        return DocumentParts(
            document, encoder, dtype, pad, LOSS_MASK_KIND if masked else None, rules, chat,
            long_docs if mode == "bestfit" else None,
        )  # fmt: skip


def mask_stats(
    counts: dict[str, Any], entries: list[ShardEntry], parts: DocumentParts
) -> dict[str, Any]:
    """``index.json`` stats of the document rules: the rules' counters, and in a masked
    dataset ``masked_documents`` (every document of a masked pack carries a mask) and
    ``unsupervised_tokens`` (every stored token without loss: masked-out tokens, the BOS/EOS
    the pack adds, best-fit padding), so the two token counts add up to the dataset's; a
    chat pack's ``chat``: its settings (:meth:`ChatSettings.record`), its ``long_docs`` rule
    and its audit (:mod:`wdstream.write.chataudit`)."""
    out = dict(counts)
    if parts.chat is not None:
        out["chat"] = {**parts.chat.record(), "long_docs": parts.long_docs,
                       **counts.get("chat", {})}  # fmt: skip
    if parts.loss_mask is not None:
        tokens = sum(e.tokens for e in entries)
        out["masked_documents"] = sum(e.documents for e in entries)
        out["unsupervised_tokens"] = tokens - counts["supervised_tokens"]
    return out


def interrupted_chat_now(store: Store) -> str | None:
    """The time an interrupted chat pack at ``store`` pinned for its template, so that its
    resume renders ``strftime_now`` as it did (None: no such pack, or its template never
    called it). A journal that does not parse is left to :meth:`Journal.load` to report."""
    try:
        now = journal_fingerprint(store).get("chat", {}).get("now")
    except (FileNotFoundError, ValueError, AttributeError):
        return None
    return now if isinstance(now, str) else None
