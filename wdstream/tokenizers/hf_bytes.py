"""A byte-level BPE's character offsets from its tokens' bytes: chat text encoded without
``tokenizers``' offset tracking.

``tokenizers`` tracks every token's character offsets through the normalizer, the
pre-tokenizer and the model; that bookkeeping, and turning the offsets into numpy, is a
fifth of encoding a rendered chat (cl100k on the bench's conversations: ~1.75 ms a
conversation with them, ~1.3 ms ids alone from ``encode_batch_fast``, ~1.55 ms with the
spans this module adds, ``docs/CHAT.md``). A byte-level BPE needs none of it: its tokens'
bytes, in order, *are* the text's UTF-8 bytes, and ``tokenizers`` maps a token's bytes to
the characters holding its first and last byte, which is :func:`char_spans` of the byte
spans (a character split between two tokens is covered by both; an added token covers its
own text).

:class:`ByteOffsets` is made only for a tokenizer whose offsets are exactly that: a BPE
model behind a ``ByteLevel`` pre-tokenizer without ``add_prefix_space`` (in a ``Sequence``,
only with pre-tokenizers that cut or drop, never add: ``_CUTS_ONLY``), no normalizer but NFC
(and then only for text NFC leaves as it is), and no post-processor that moves offsets (``ByteLevel`` or
``RobertaProcessing`` with ``trim_offsets``; ``TemplateProcessing``/``BertProcessing`` add
nothing with ``add_special_tokens=False``). Each encoding is then checked: the ids' bytes
joined must be the text's bytes, else (an added token that strips the spaces beside it,
which has no bytes in the table, a byte-fallback token...) :meth:`ByteOffsets.spans` gives None and the caller
encodes again with ``tokenizers``' own offsets. So the spans it returns are always
``tokenizers``' (tests/test_tokenizer_hf_bytes.py compares them on multi-byte text).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import numpy as np

from wdstream.tokenizers.base import char_spans

__all__ = ["ByteOffsets"]

# Post-processors that leave offsets as the model made them (add_special_tokens=False).
_KEEPS_OFFSETS = frozenset({"TemplateProcessing", "BertProcessing"})
# Pre-tokenizers that only cut the text or drop characters from it, never add or replace
# any: a dropped byte makes the ids' bytes shorter than the text's, so the check sees it.
# One that adds a space (Metaspace's prepend, ByteLevel's add_prefix_space) can make up
# for the spaces an added token with rstrip takes: "<|r|> b" is then "<|r|>" over
# "<|r|> " and "Ġb" over "b", whose bytes joined are the text's all the same.
_CUTS_ONLY = frozenset(
    {
        "Split",
        "Digits",
        "Punctuation",
        "Whitespace",
        "WhitespaceSplit",
        "CharDelimiterSplit",
        "UnicodeScripts",
        "BertPreTokenizer",
        "FixedLength",
    }
)


def _byte_chars() -> dict[int, int]:
    """GPT-2's byte-level alphabet as a ``str.translate`` table: each of its characters to
    the code point of the byte it stands for (``tokenizers``' ByteLevel), and the other
    characters below 256 to U+FFFF, so a piece outside the alphabet fails to encode as
    Latin-1."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = b
        else:
            table[b] = 0xFFFF
            table[256 + extra] = b
            extra += 1
    return table


def _state(component: Any) -> Any:
    """A ``tokenizers`` component's JSON state (None for no component)."""
    return None if component is None else json.loads(component.__getstate__())


def _members(state: Any, key: str) -> list[dict[str, Any]]:
    """A component's parts: a ``Sequence``'s members, else the component itself."""
    if not isinstance(state, dict):
        return []
    if state.get("type") == "Sequence":
        return [m for m in state.get(key) or [] if isinstance(m, dict)]
    return [state]


def _cuts_only(part: dict[str, Any]) -> bool:
    """Whether a pre-tokenizer keeps every byte of the text, in order, adding none."""
    kind = part.get("type")
    return kind in _CUTS_ONLY or (kind == "ByteLevel" and part.get("add_prefix_space") is False)


def _keeps_offsets(part: dict[str, Any]) -> bool:
    """Whether a post-processor leaves the model's offsets as they are."""
    kind = part.get("type")
    return kind in _KEEPS_OFFSETS or (kind == "ByteLevel" and part.get("trim_offsets") is False)


class ByteOffsets:
    """Each id's bytes, to place a byte-level BPE's tokens in the text (module docstring).

    Args:
        table: the bytes of every id (None: an id with no known bytes).
        nfc: the tokenizer normalises to NFC (spans are given only for NFC text).
    """

    def __init__(self, table: list[bytes | None], nfc: bool) -> None:
        self._table = table
        self._lengths = np.array([-1 if b is None else len(b) for b in table], dtype=np.int64)
        self._nfc = nfc

    @classmethod
    def of(cls, tok: Any) -> ByteOffsets | None:
        """The table of a loaded ``tokenizers.Tokenizer``, or None when its offsets are not
        its tokens' bytes (module docstring)."""
        normalizer = _state(tok.normalizer)
        if normalizer is not None and normalizer.get("type") != "NFC":
            return None
        pre = _members(_state(tok.pre_tokenizer), "pretokenizers")
        if type(tok.model).__name__ != "BPE" or not any(p.get("type") == "ByteLevel" for p in pre):
            return None
        if not all(map(_cuts_only, pre)):
            return None
        if not all(map(_keeps_offsets, _members(_state(tok.post_processor), "processors"))):
            return None
        chars = _byte_chars()
        vocab = tok.get_vocab(with_added_tokens=False)
        table: list[bytes | None] = [None] * (max(vocab.values(), default=-1) + 1)
        for piece, token in vocab.items():
            try:
                table[token] = piece.translate(chars).encode("latin-1")
            except UnicodeEncodeError:  # a piece outside the byte-level alphabet: no bytes
                continue
        for token, added in tok.get_added_tokens_decoder().items():
            table.extend([None] * (token + 1 - len(table)))
            # One that strips the spaces beside it has no bytes of its own: its offsets take
            # them even where the next token has them too (" sp " after "<|r|>": overlapping
            # offsets, the bytes joined still the text's).
            strips = added.lstrip or added.rstrip
            table[token] = None if strips else added.content.encode("utf-8")
        return cls([b or None for b in table], normalizer is not None)

    def spans(self, text: str, ids: list[int], id_array: np.ndarray) -> np.ndarray | None:
        """Each token's ``[start, end)`` characters in ``text`` (``int64``, shape ``(n, 2)``),
        or None when the bytes of ``ids`` (also given as ``id_array``) are not ``text``'s
        (then only ``tokenizers``' offsets say where they lie)."""
        if self._nfc and not unicodedata.is_normalized("NFC", text):
            return None
        try:
            joined = b"".join(map(self._table.__getitem__, ids))  # type: ignore[arg-type]
        except (TypeError, IndexError):  # an id without known bytes
            return None
        if joined != text.encode("utf-8"):
            return None
        lengths = self._lengths[id_array]
        ends = np.cumsum(lengths)
        return char_spans(text, ends - lengths, ends)
