"""Load any tokenizer offline: a tiktoken encoding (and the faster bpe-openai backend), a
Hugging Face ``tokenizer.json`` or a SentencePiece ``.model`` file.

A path ending in ``.json`` (or a folder holding ``tokenizer.json``) loads with Hugging Face
``tokenizers`` (:mod:`wdstream.tokenizers.hf`), one ending in ``.model`` (or a folder
holding ``tokenizer.model``) with SentencePiece (:mod:`wdstream.tokenizers.spm`); both are
the ``hf`` extra. Their ``ranks_sha256`` is the sha256 of the file, checked again whenever
the tokenizer is loaded in another process. Anything else is a tiktoken encoding
(:mod:`wdstream.tokenizers.tiktoken`).

What pins a tokenizer (``index.json``'s ``tokenizer``, checked by :func:`index_tokenizer`):
the bytes of every file the loader reads, each hashed whole:

* Hugging Face: ``ranks_sha256``, the sha256 of ``tokenizer.json``; ``config_sha256``, of the
  ``tokenizer_config.json`` beside it when there is one (BOS/EOS come from it). A folder's
  other files are not read (its chat template's text is recorded whole in ``stats.chat``).
* SentencePiece: ``ranks_sha256``, the sha256 of the ``.model`` file.
* tiktoken, by name (``cl100k_base``, no path) or a ``.tiktoken`` file: ``ranks_sha256``, the
  sha256 of the ranks in canonical ``.tiktoken`` form, whatever file or package held them.

The path is recorded as given (``name``); a relative one is found again from the pack's
working directory (``stats.pack_cwd``, recorded when an input or the tokenizer is relative).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

from wdstream.errors import TokenizerError
from wdstream.tokenizers.base import Tokenizer
from wdstream.tokenizers.tiktoken import BACKENDS, CHECK_TEXT, TiktokenTokenizer, reference_ids

__all__ = ["index_tokenizer", "load_tokenizer", "tokenizer_file_kind"]


def tokenizer_file_kind(spec: str) -> str | None:
    """``"tokenizers"`` or ``"sentencepiece"`` when ``spec`` names such a file, else None."""
    from wdstream.tokenizers.hf import hf_tokenizer_file

    if hf_tokenizer_file(spec) is not None:
        return "tokenizers"
    if spec.endswith(".model") or os.path.isfile(os.path.join(spec, "tokenizer.model")):
        return "sentencepiece"
    return None


def _load_file_tokenizer(spec: str, backend: str) -> Tokenizer | None:
    """A Hugging Face or SentencePiece tokenizer when ``spec`` names one, else None."""
    kind = tokenizer_file_kind(spec)
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


def index_tokenizer(
    recorded: dict[str, Any], pack_cwd: str | None = None, given: str | None = None
) -> Tokenizer:
    """The tokenizer a dataset was packed with (``index.json``'s ``tokenizer``), to decode it.

    Found as the inputs are: its recorded name (the path as given to pack) joined to the
    pack's working directory (``stats.pack_cwd``) when it is a relative path that lies
    there, else as recorded (a tiktoken encoding's name, an absolute path, or a relative one
    from the current directory: datasets packed before ``pack_cwd`` covered the tokenizer);
    ``given`` (``--tokenizer``) instead, when the dataset moved away from it. Either way it
    is refused unless its hashes are the recorded ones (``ranks_sha256``, and
    ``config_sha256`` where recorded, see the module docstring): another tokenizer, or a
    file changed since the pack, would decode other text, silently.

    Raises:
        TokenizerError: it cannot be loaded (naming where it was looked for) or its hashes
            differ (naming both).
    """
    name = str(recorded["name"])
    where = given if given is not None else _recorded_path(name, pack_cwd)
    try:
        tok = load_tokenizer(where, "tiktoken")
    except TokenizerError as exc:
        packed = f", packed in {pack_cwd}" if pack_cwd else ""
        raise TokenizerError(
            f"cannot load the dataset's tokenizer {name!r} (index.json{packed}) from {where!r}: "
            f"{exc}; give it with --tokenizer PATH (Python: tokenizer=)"
        ) from exc
    for key, mine in (("ranks_sha256", tok.ranks_sha256), ("config_sha256", _config_sha(tok))):
        want = recorded.get(key)
        if want and mine != want:
            raise TokenizerError(
                f"{where}: {key} {_short(mine)} is not the {_short(want)} recorded in "
                f"index.json for its tokenizer {name!r} (another tokenizer, or one changed since "
                "the pack); decoding with it would show other text"
            )
    return tok


def _recorded_path(name: str, pack_cwd: str | None) -> str:
    """``name`` joined to ``pack_cwd`` when it is a relative path lying there, else ``name``."""
    if pack_cwd and not os.path.isabs(name) and "://" not in name:
        joined = os.path.join(pack_cwd, name)
        if os.path.exists(joined):
            return joined
    return name


def _short(digest: str) -> str:
    return f"{digest[:16]}..." if digest else "none"


def _config_sha(tok: Tokenizer) -> str:
    """sha256 of the ``tokenizer_config.json`` a Hugging Face tokenizer read ("": none)."""
    return str(getattr(tok, "config_sha256", ""))
