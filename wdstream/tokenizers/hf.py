"""Hugging Face ``tokenizers`` files (``tokenizer.json``), e.g. a Llama, Mistral or Qwen one.

BOS and EOS come from the tokenizer's own configuration, first found wins:

1. ``tokenizer_config.json`` next to ``tokenizer.json`` (``bos_token``/``eos_token``, a
   string or ``{"content": ...}``; an explicit ``null`` means "none");
2. the post-processor in ``tokenizer.json``: the special tokens a ``TemplateProcessing``
   puts before / after ``$A`` (also inside a ``Sequence``), or Bert/Roberta's cls/sep;
3. a special added token with a conventional name (``<s>``, ``</s>``, ``<|endoftext|>``, ...).

Document text is encoded with ``add_special_tokens=False`` and ``encode_special_tokens``
on, so a document that contains the text ``</s>`` gets the ordinary ids of those characters,
never the EOS id (tiktoken documents are encoded the same way). Rendered chat text
(:meth:`HFTokenizer.encode_chat`) is encoded with that setting off, so the special tokens a
chat template writes are recognised, exactly as ``transformers`` encodes them. One loaded
tokenizer serves both: the setting is switched when a call needs the other one
(:class:`_SpecialTokens`), instead of loading a second copy for chat (a chat pack's worker
loaded the file twice, ~1 s each for a 14 MB ``tokenizer.json``).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from itertools import chain
from typing import Any

import numpy as np

from wdstream.errors import TokenizerError
from wdstream.tokenizers.base import Tokenizer, read_pinned
from wdstream.tokenizers.hf_bytes import ByteOffsets

_PLACEHOLDER = "\ue000"  # stands for a spelled-out special token in a check

__all__ = ["HFTokenizer", "hf_tokenizer_file"]

CONFIG_NAME = "tokenizer_config.json"
_BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "[CLS]")
_EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[SEP]")


def _import_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError(
            "reading a Hugging Face tokenizer.json needs the 'tokenizers' package "
            f"({exc}); install it with: pip install 'wdstream[hf]'"
        ) from exc
    return tokenizers


def hf_tokenizer_file(spec: str) -> str | None:
    """The ``tokenizer.json`` that ``spec`` names (a ``.json`` path, or a folder holding
    one), or None when ``spec`` is not a Hugging Face tokenizer."""
    if spec.endswith(".json"):
        return spec
    candidate = os.path.join(spec, "tokenizer.json")
    return candidate if os.path.isdir(spec) and os.path.isfile(candidate) else None


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _from_template(items: list[Any]) -> tuple[str | None, str | None]:
    """(BOS, EOS) a TemplateProcessing ``single`` template puts around ``$A``."""
    before, after, seen_a = None, None, False
    for item in items:
        if "Sequence" in item:
            seen_a = True
        elif "SpecialToken" in item:
            token = item["SpecialToken"]["id"]
            if seen_a:
                after = after or token
            else:
                before = token
    return before, after


def _from_post_processor(proc: Any) -> tuple[str | None, str | None]:
    if not isinstance(proc, dict):
        return None, None
    kind = proc.get("type")
    if kind == "TemplateProcessing":
        return _from_template(proc.get("single", []))
    if kind in ("BertProcessing", "RobertaProcessing"):
        return proc["cls"][0], proc["sep"][0]
    if kind == "Sequence":
        for inner in proc.get("processors", []):
            found = _from_post_processor(inner)
            if found != (None, None):
                return found
    return None, None


def _spec_parts(tok: Any) -> dict[str, Any]:
    """The two parts of ``tokenizer.json`` special tokens are looked up in, from the loaded
    tokenizer: parsing the whole file again in Python (a 100k vocabulary: ~13 MB) takes a
    third of the time loading it does."""
    proc = tok.post_processor
    added = tok.get_added_tokens_decoder().values()
    return {
        "post_processor": None if proc is None else json.loads(proc.__getstate__()),
        "added_tokens": [{"content": t.content, "special": t.special} for t in added],
    }


def _special_tokens(
    path: str, spec_json: dict[str, Any], expect_config_sha256: str | None
) -> tuple[str | None, str | None, str]:
    """``(bos_text, eos_text, sha256 of tokenizer_config.json or "" if there is none)`` by
    the order in the module docstring; an expected config hash pins the config file too."""
    config = os.path.join(os.path.dirname(path) or ".", CONFIG_NAME)
    config_sha = ""
    if os.path.isfile(config) or expect_config_sha256:
        raw, config_sha = read_pinned(config, expect_config_sha256)
        cfg = json.loads(raw)
        if "bos_token" in cfg or "eos_token" in cfg:
            bos, eos = _token_content(cfg.get("bos_token")), _token_content(cfg.get("eos_token"))
            return bos, eos, config_sha
    bos, eos = _from_post_processor(spec_json.get("post_processor"))
    if bos is None and eos is None:
        special = {t["content"] for t in spec_json.get("added_tokens", []) if t.get("special")}
        bos = next((t for t in _BOS_NAMES if t in special), None)
        eos = next((t for t in _EOS_NAMES if t in special), None)
    return bos, eos, config_sha


class _SpecialTokens:
    """The ``encode_special_tokens`` setting of one ``tokenizers.Tokenizer``, shared by its
    callers: calls wanting the same setting run together; one wanting the other waits until
    they are done, then switches it (switching is a field write; a text pack or a chat pack
    never switches after its first call)."""

    def __init__(self, tok: Any) -> None:
        self._tok, self._cond = tok, threading.Condition()
        self._users = 0
        tok.encode_special_tokens = self._as_text = True

    @contextmanager
    def set_to(self, as_text: bool) -> Iterator[Any]:
        """The tokenizer, with special-token text encoded as text (``as_text``: documents)
        or recognised (chat), for the time of the block."""
        with self._cond:
            while self._users and self._as_text != as_text:
                self._cond.wait()
            if self._as_text != as_text:
                self._tok.encode_special_tokens = self._as_text = as_text
            self._users += 1
        try:
            yield self._tok
        finally:
            with self._cond:
                self._users -= 1
                self._cond.notify_all()


class HFTokenizer(Tokenizer):
    """A ``tokenizer.json`` loaded with Hugging Face ``tokenizers``.

    Args:
        spec: path to ``tokenizer.json`` or a folder holding it.
        expect_sha256: refuse the file unless its sha256 is this (set when the tokenizer is
            loaded again in a worker process).
        expect_config_sha256: the same for ``tokenizer_config.json`` ("": none was used).

    Raises:
        ImportError: ``tokenizers`` is not installed (names the extra).
        TokenizerError: the file is missing, unreadable, or changed since it was loaded.
    """

    backend = "tokenizers"

    def __init__(
        self,
        spec: str,
        expect_sha256: str | None = None,
        expect_config_sha256: str | None = None,
    ) -> None:
        tokenizers = _import_tokenizers()
        path = hf_tokenizer_file(spec)
        if path is None:
            raise TokenizerError(
                f"{spec!r} is neither a .json file nor a folder with tokenizer.json"
            )
        self.spec = spec
        self.name = spec
        self.path = path
        try:
            raw, self._sha256 = read_pinned(path, expect_sha256)
            self._tok = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
            parts = _spec_parts(self._tok)
            bos, eos, self.config_sha256 = _special_tokens(path, parts, expect_config_sha256)
        except TokenizerError:
            raise
        except Exception as exc:  # noqa: BLE001 - OSError, bad JSON, tokenizers' own errors
            raise TokenizerError(
                f"cannot load Hugging Face tokenizer file {path}: {type(exc).__name__}: {exc}"
            ) from exc
        self._special = _SpecialTokens(self._tok)
        self.bos_id = self._id_of(bos)
        self.eos_id = self._id_of(eos)
        self.n_vocab = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1

    def _id_of(self, token: str | None) -> int | None:
        if token is None:
            return None
        found = self._tok.token_to_id(token)
        return None if found is None else int(found)

    @property
    def ranks_sha256(self) -> str:
        """sha256 of the ``tokenizer.json`` bytes."""
        return self._sha256

    def __reduce__(self) -> tuple[Any, ...]:
        return (HFTokenizer, (self.spec, self._sha256, self.config_sha256))

    def info(self) -> dict[str, Any]:
        """index.json's tokenizer entry, plus the config file's hash when one was read."""
        out = super().info()
        if self.config_sha256:
            out["config_sha256"] = self.config_sha256
        return out

    def encode(self, text: str) -> np.ndarray:
        with self._special.set_to(True) as tok:
            return np.array(tok.encode(text, add_special_tokens=False).ids, dtype=np.uint32)

    def special_texts(self) -> frozenset[str]:
        """The text of every added token marked special (``encode_special_tokens`` governs
        those; other added tokens are matched in documents too)."""
        added = self._tok.get_added_tokens_decoder().values()
        return frozenset(t.content for t in added if t.special and t.content)

    def encode_chat(
        self, text: str, as_text: Sequence[tuple[int, int]] = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids of a rendered chat with special tokens recognised and nothing added, and each
        token's character span: ``tokenizers``' own offsets, the ones ``transformers`` maps
        its assistant masks with (:meth:`Tokenizer.encode_chat`).

        With ``as_text``: the text cut at the special tokens kept, each piece encoded with
        special-token text as text. ``tokenizers`` cuts at its added tokens itself, but a
        piece it encodes is not always encoded as the same text alone (a pre-tokenizer that
        marks only the start of the input, an added token that strips the spaces next to
        it): the cut is checked on the same text with the spans replaced by U+E000 against
        the tokenizer's own encoding, and refused (ValueError) where they differ."""
        if not as_text:
            return self._native(text)
        got = self._pieces(text, {start for start, _ in as_text})
        check = list(text)
        for start, end in as_text:
            check[start:end] = _PLACEHOLDER * (end - start)
        plain = "".join(check)
        if self._pieces(plain, set())[0].tolist() != self._native(plain)[0].tolist():
            raise ValueError(
                f"{self.path}: this tokenizer does not encode the text between special tokens "
                "the same when it is cut there, so special-token text in a message cannot be "
                "kept text (--special-tokens-in-content parse tokenises it as transformers does)"
            )
        return got

    @cached_property
    def _byte_offsets(self) -> ByteOffsets | None:
        """The byte table of a byte-level BPE (None for any other), made on first use:
        ~0.1 s for a 100k vocabulary, in a process that encodes chat."""
        return ByteOffsets.of(self._tok)

    def _native(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Ids and spans of ``text``, special tokens recognised: a byte-level BPE's from its
        tokens' bytes (:mod:`wdstream.tokenizers.hf_bytes`), encoded without ``tokenizers``'
        offsets (~20 % of its time); any other's, or text whose ids' bytes are not its own,
        with them."""
        offsets = self._byte_offsets
        if offsets is not None:
            with self._special.set_to(False) as tok:
                ids = tok.encode_batch_fast([text], add_special_tokens=False)[0].ids
            id_array = np.fromiter(ids, dtype=np.int64, count=len(ids))
            spans = offsets.spans(text, ids, id_array)
            if spans is not None:
                return id_array, spans
        with self._special.set_to(False) as tok:
            enc = tok.encode(text, add_special_tokens=False)
        n = len(enc.ids)
        # fromiter over the flattened pairs: ~40 % less CPU than np.array over the list of
        # tuples, a tenth of a chat pack's time outside the tokenizer itself.
        flat = np.fromiter(chain.from_iterable(enc.offsets), dtype=np.int64, count=2 * n)
        return np.fromiter(enc.ids, dtype=np.int64, count=n), flat.reshape(-1, 2)

    def _pieces(self, text: str, literal: set[int]) -> tuple[np.ndarray, np.ndarray]:
        """The text cut at its special tokens (but those starting at ``literal``), each
        piece encoded with special-token text as text."""
        specials = sorted(self.special_texts(), key=len, reverse=True)
        pattern = re.compile("|".join(map(re.escape, specials)) or "(?!)")
        ids: list[int] = []
        spans: list[tuple[int, int]] = []

        def piece(at: int, end: int) -> None:
            if end > at:
                with self._special.set_to(True) as tok:
                    enc = tok.encode(text[at:end], add_special_tokens=False)
                ids.extend(enc.ids)
                spans.extend((at + a, at + b) for a, b in enc.offsets)

        at = 0
        for match in pattern.finditer(text):
            if match.start() in literal:
                continue
            piece(at, match.start())
            ids.append(int(self._tok.token_to_id(match.group())))
            spans.append(match.span())
            at = match.end()
        piece(at, len(text))
        return np.array(ids, dtype=np.int64), np.array(spans, dtype=np.int64).reshape(-1, 2)

    def encode_ordinary_batch(self, texts: Sequence[str], num_threads: int) -> list[list[int]]:
        """Sequential below 2 threads; else tokenizers' own (Rayon) pool, whose size is
        ``RAYON_NUM_THREADS`` (it cannot be set per call).

        Sequential is one text per ``encode_batch_fast`` call, not ``encode``: the batch
        call skips the character offsets ``encode`` computes, ~25 % of a byte-level BPE's
        time (cl100k on Python sources: 1.65 against 1.25 MB per CPU second)."""
        with self._special.set_to(True) as tok:
            fast = tok.encode_batch_fast
            if num_threads < 2:
                return [fast([t], add_special_tokens=False)[0].ids for t in texts]
            return [e.ids for e in fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))

    def id_to_text(self, token: int) -> str:
        return self.decode([token])
