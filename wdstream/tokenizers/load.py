"""Load any tokenizer offline: a tiktoken encoding (and the faster bpe-openai backend), a
Hugging Face ``tokenizer.json`` or a SentencePiece ``.model`` file.

A path ending in ``.json`` (or a folder holding ``tokenizer.json``) loads with Hugging Face
``tokenizers`` (:mod:`wdstream.tokenizers.hf`), one ending in ``.model`` (or a folder
holding ``tokenizer.model``) with SentencePiece (:mod:`wdstream.tokenizers.spm`); both are
the ``hf`` extra. Their ``ranks_sha256`` is the sha256 of the file, checked again whenever
the tokenizer is loaded in another process. Anything else is a tiktoken encoding
(:mod:`wdstream.tokenizers.tiktoken`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

from wdstream.errors import TokenizerError
from wdstream.tokenizers.base import Tokenizer
from wdstream.tokenizers.tiktoken import BACKENDS, CHECK_TEXT, TiktokenTokenizer, reference_ids

__all__ = ["index_tokenizer", "load_tokenizer"]


def _file_kind(spec: str) -> str | None:
    """``"tokenizers"`` or ``"sentencepiece"`` when ``spec`` names such a file, else None."""
    from wdstream.tokenizers.hf import hf_tokenizer_file

    if hf_tokenizer_file(spec) is not None:
        return "tokenizers"
    if spec.endswith(".model") or os.path.isfile(os.path.join(spec, "tokenizer.model")):
        return "sentencepiece"
    return None


def _load_file_tokenizer(spec: str, backend: str) -> Tokenizer | None:
    """A Hugging Face or SentencePiece tokenizer when ``spec`` names one, else None."""
    kind = _file_kind(spec)
    if kind is None:
        if os.path.isdir(spec):
            raise TokenizerError(
                f"cannot load tokenizer {spec!r}: a folder must hold tokenizer.json (Hugging "
                "Face tokenizers) or tokenizer.model (SentencePiece); it has neither"
            )
        return None
    if backend == "bpe-openai":
        warnings.warn(
            f"bpe-openai encodes tiktoken vocabularies only; {spec!r} uses {kind}", stacklevel=3
        )
    if kind == "tokenizers":
        from wdstream.tokenizers.hf import HFTokenizer

        return HFTokenizer(spec)
    from wdstream.tokenizers.spm import SentencePieceTokenizer

    model = spec if spec.endswith(".model") else os.path.join(spec, "tokenizer.model")
    return SentencePieceTokenizer(model)


def load_tokenizer(spec: str, backend: str = "auto", check_texts: Sequence[str] = ()) -> Tokenizer:
    """Load a tokenizer by name or path, choosing the fastest correct backend.

    Args:
        spec: ``cl100k_base``, ``o200k_base``, any name tiktoken can load, a path to a
            ``.tiktoken`` file, a Hugging Face ``tokenizer.json`` (or a folder holding one,
            with its ``tokenizer_config.json``), or a SentencePiece ``.model`` file.
        backend: for tiktoken encodings, ``auto`` (bpe-openai when it is installed and
            matches tiktoken, else tiktoken), ``tiktoken``, or ``bpe-openai`` (still falls
            back, with a warning, when it is missing or disagrees). Tokenizer files always
            encode with their own library (``auto`` and ``tiktoken`` ask for nothing else;
            ``bpe-openai`` warns).
        check_texts: extra samples (e.g. the first few hundred KB of the input) that
            bpe-openai must encode exactly like tiktoken before it is used.

    Raises:
        TokenizerError: if no source could load ``spec``, listing every source tried, or a
            tokenizer file is missing or unreadable (naming it and the library tried).
        ImportError: a tokenizer file's library is not installed (names the extra).
        ValueError: for an unknown backend.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    from_file = _load_file_tokenizer(spec, backend)
    if from_file is not None:
        return from_file
    base = TiktokenTokenizer(spec, "tiktoken")
    if backend == "tiktoken":
        return base
    try:
        fast = TiktokenTokenizer(spec, "bpe-openai")
    except Exception as exc:  # noqa: BLE001 - ImportError, unsupported encoding, ...
        if backend == "bpe-openai":
            warnings.warn(
                f"bpe-openai unavailable for {spec!r} ({exc}); using tiktoken", stacklevel=2
            )
        return base
    for text in (CHECK_TEXT, *check_texts):
        if fast.encode(text).tolist() != reference_ids(base._enc, text):
            warnings.warn(
                f"bpe-openai ids differ from tiktoken for {spec!r}; using tiktoken", stacklevel=2
            )
            return base
    return fast


def index_tokenizer(recorded: dict[str, Any]) -> Tokenizer:
    """The tokenizer a dataset was packed with (``index.json``'s ``tokenizer``), to decode it.

    Loaded by its recorded name or path and refused when its ranks' hash is not the recorded
    one: a tokenizer file changed since the pack would decode other text, silently.

    Raises:
        TokenizerError: it cannot be loaded, or its hash differs (naming both hashes).
    """
    tok = load_tokenizer(recorded["name"], "tiktoken")
    want = recorded.get("ranks_sha256")
    if want and tok.ranks_sha256 != want:
        raise TokenizerError(
            f"{recorded['name']}: ranks sha256 {tok.ranks_sha256[:16]}... is not the "
            f"{want[:16]}... recorded in index.json (the tokenizer changed since the pack); "
            "decoding with it would show other text"
        )
    return tok
