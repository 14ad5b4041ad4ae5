"""What a pack's documents are: text (the default) or pre-tokenized ids with an optional loss
mask, resolved once into the parts the engines run (:class:`~wdstream.write.engine.PackJob`):
the record parser, the :class:`~wdstream.write.encoders.DocumentEncoder`, the
:class:`~wdstream.write.docrules.DocumentRules`, the stored dtype and padding.

Whether a dataset stores a loss mask is decided here, before the first shard, from the
options alone (never from what the records hold): it sets every shard's dtype (``uint32``,
whatever the vocabulary) and is part of the pack's resume fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from wdstream.format.index import ShardEntry
from wdstream.format.loss import LOSS_MASK_KIND
from wdstream.inputs.pretokenized import TokenFields
from wdstream.inputs.records import RecordDocument
from wdstream.tokenizers import Tokenizer
from wdstream.write.docrules import LONG_DOCS, DocumentRules
from wdstream.write.encoders import DocumentEncoder, TextEncoder, TokenIdsEncoder, stored_id

__all__ = ["DocumentParts", "PackDocuments", "mask_stats"]


@dataclass(frozen=True)
class DocumentParts:
    """The resolved parts (see the module docstring)."""

    document: RecordDocument | None
    encoder: DocumentEncoder
    dtype: str
    pad_id: int  # stored form (with the no-loss bit in a masked pack)
    loss_mask: str | None  # index.json's "loss_mask"
    rules: partial[DocumentRules] | None


@dataclass(frozen=True)
class PackDocuments:
    """The document options of :func:`wdstream.pack` (see its docstring)."""

    pretokenized: bool = False
    ids_key: str = "input_ids"
    mask_key: str | None = None
    long_docs: str | None = None
    allow_unsupervised: bool = False

    @property
    def masked(self) -> bool:
        """Whether the dataset stores a loss mask."""
        return self.pretokenized and self.mask_key is not None

    def check(self, mode: str, engine: str) -> None:
        """Refuse options that do not go together.

        Raises:
            ValueError: naming the option.
        """
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
        if self.allow_unsupervised and not self.masked:
            raise ValueError("allow_unsupervised (--allow-unsupervised) is for masked packs only")
        if engine != "local" and (self.pretokenized or self.long_docs is not None):
            raise ValueError(
                "engine='ray' packs text only: pre-tokenized and masked documents and "
                "--long-docs need engine='local' (--engine local)"
            )

    def fingerprint(self) -> dict[str, Any]:
        """What of these options decides the output (nothing for a plain text pack, so its
        resume fingerprint is unchanged)."""
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
    ) -> DocumentParts:
        """The parts for ``tok`` with ``ids`` = (bos_id, eos_id, dtype by vocabulary) and
        ``layout`` = (mode, seq_len)."""
        bos_id, eos_id, dtype = ids
        mode, seq_len = layout
        masked = self.masked
        if masked:
            dtype = "uint32"  # the mask is bit 31 of every stored id
        encoder: DocumentEncoder
        document: RecordDocument | None = None
        if self.pretokenized:
            document = TokenFields(tok.n_vocab, self.ids_key, self.mask_key)
            encoder = TokenIdsEncoder(bos_id, eos_id, dtype, masked)
        else:
            encoder = TextEncoder(bos_id, eos_id, dtype)
        long_docs = self.long_docs or ("drop" if masked else "split")
        rules = None
        if masked or long_docs != "split":
            eos = None if eos_id is None else stored_id(eos_id, masked)
            rules = partial(
                DocumentRules, seq_len + 1 if mode == "bestfit" else None, long_docs, masked,
                self.allow_unsupervised, eos, on_error, names,
            )  # fmt: skip
        pad = stored_id(eos_id or 0, masked)
        return DocumentParts(
            document, encoder, dtype, pad, LOSS_MASK_KIND if masked else None, rules
        )


def mask_stats(counts: dict[str, int], entries: list[ShardEntry], masked: bool) -> dict[str, int]:
    """``index.json`` stats of the document rules: the rules' counters, and in a masked
    dataset ``masked_documents`` (every document of a masked pack carries a mask) and
    ``unsupervised_tokens`` (every stored token without loss: masked-out tokens, the BOS/EOS
    the pack adds, best-fit padding), so the two token counts add up to the dataset's."""
    out = dict(counts)
    if masked:
        tokens = sum(e.tokens for e in entries)
        out["masked_documents"] = sum(e.documents for e in entries)
        out["unsupervised_tokens"] = tokens - counts["supervised_tokens"]
    return out
