"""The interface every tokenizer implements, and the file hash that pins a tokenizer file.

A tokenizer crosses process boundaries (pack's worker processes, the reader's torch workers)
as its recipe only: ``__reduce__`` returns the spec (name or path) and, for a file, the
sha256 it had when it was loaded. The receiving process loads it again and refuses a file
whose bytes changed in between, so two processes can never tokenise with different
vocabularies under one ``index.json``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy as np

from wdstream.errors import TokenizerError

__all__ = [
    "MAX_TOKENIZER_FILE_BYTES",
    "Tokenizer",
    "char_spans",
    "open_tokenizer_file",
    "read_pinned",
]

# Larger than any real tokenizer file (the largest vocabularies' tokenizer.json are ~35 MB):
# a file past it is not one, and reading it whole would take the machine's memory.
MAX_TOKENIZER_FILE_BYTES = 1 << 30


class Tokenizer(ABC):
    """A loaded tokenizer; picklable as its recipe (see the module docstring).

    Attributes:
        spec: what was asked for (name or path), enough to load it again.
        name: the encoding's name, or the path of the tokenizer file.
        backend: the library actually encoding (``tiktoken``, ``bpe-openai``, ``tokenizers``,
            ``sentencepiece``).
        n_vocab: ids are ``< n_vocab``.
        eos_id: the end-of-document id (None if the tokenizer has none).
        bos_id: the beginning-of-document id from the tokenizer's own configuration (None if
            it names none; ``pack --bos`` then falls back to ``eos_id``).
    """

    spec: str
    name: str
    backend: str
    n_vocab: int
    eos_id: int | None
    bos_id: int | None = None

    @property
    @abstractmethod
    def ranks_sha256(self) -> str:
        """sha256 of the vocabulary (tiktoken: canonical ranks; files: the file's bytes)."""

    @abstractmethod
    def __reduce__(self) -> tuple[Any, ...]:
        """The recipe that loads this tokenizer again in another process (never its data)."""

    def info(self) -> dict[str, Any]:
        """The dict recorded in ``index.json``: name, backend, ranks_sha256, n_vocab."""
        return {
            "name": self.name,
            "backend": self.backend,
            "ranks_sha256": self.ranks_sha256,
            "n_vocab": self.n_vocab,
        }

    @abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` as ``uint32``; special-token text is encoded as ordinary text."""

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of every text (``uint32`` arrays), in order, on the calling thread."""
        return [self.encode(t) for t in texts]

    @abstractmethod
    def encode_ordinary_batch(self, texts: Sequence[str], num_threads: int) -> list[list[int]]:
        """Token ids of every text, in order, using up to ``num_threads`` threads."""

    def special_texts(self) -> frozenset[str]:
        """The texts :meth:`encode_chat` turns into special tokens (e.g. ``<|endoftext|>``)."""
        return frozenset()

    @abstractmethod
    def encode_chat(
        self, text: str, as_text: Sequence[tuple[int, int]] = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of a rendered chat ``text`` and each token's character span in it.

        Unlike :meth:`encode`, the text of the tokenizer's special tokens is recognised (a
        chat template writes ``<|im_end|>`` to mean that token), and nothing is added around
        the text (no BOS/EOS): the ids ``transformers``' ``apply_chat_template(tokenize=True)``
        gives, which encodes the rendered chat with ``add_special_tokens=False``.

        Args:
            text: the rendered chat.
            as_text: ``[start, end)`` spans of ``text``, each exactly one special token's
                text, that are *not* that token: a message spelled it out, so it is
                tokenised as ordinary text together with the text around it (the text
                between two of the template's special tokens is tokenised as one piece, as
                the tokenizer would tokenise it with no special tokens at all).

        Returns:
            ``(ids, spans)``: ``int64`` ids, and an ``int64`` array of shape ``(n, 2)`` of
            each token's ``[start, end)`` character offsets in ``text``. Tokens that share a
            character (a multi-byte character split by byte-level BPE) both cover it; a token
            that stands for no text (SentencePiece's dummy prefix) has ``start == end``.

        Raises:
            ValueError: ``as_text`` is given and this tokenizer cannot keep those spans text
                while tokenising the rest as it would (the message says why).
        """

    @abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of ``ids``; bytes that are not valid UTF-8 become U+FFFD."""

    @abstractmethod
    def id_to_text(self, token: int) -> str:
        """Readable form of one id (special tokens by name)."""


def char_spans(text: str, byte_starts: np.ndarray, byte_ends: np.ndarray) -> np.ndarray:
    """Character ``[start, end)`` spans in ``text`` of tokens given by UTF-8 byte spans.

    A token that starts inside a character starts at that character; one that ends inside a
    character ends after it, so both tokens that split a character cover it. An empty byte
    span stays empty. Returns an ``int64`` array of shape ``(n, 2)``.
    """
    raw = text.encode("utf-8")
    starts = np.asarray(byte_starts, dtype=np.int64)
    ends = np.asarray(byte_ends, dtype=np.int64)
    if len(raw) != len(text):  # not ASCII: one character may be several bytes
        lead = (np.frombuffer(raw, dtype=np.uint8) & 0xC0) != 0x80
        char_of_byte = np.empty(len(raw) + 1, dtype=np.int64)
        np.cumsum(lead, out=char_of_byte[:-1])
        char_of_byte[:-1] -= 1
        char_of_byte[-1] = len(text)
        last = char_of_byte[np.maximum(ends - 1, 0)] + 1
        starts, ends = char_of_byte[starts], np.where(ends > starts, last, char_of_byte[starts])
    return np.stack([starts, ends], axis=1) if len(starts) else np.zeros((0, 2), np.int64)


def open_tokenizer_file(path: str) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file of at most
    :data:`MAX_TOKENIZER_FILE_BYTES`: a FIFO's read would wait forever for a writer, a
    device's (``/dev/zero``) never end. Opened with ``O_NONBLOCK`` (a FIFO swapped in after
    the ``stat`` cannot block ``open``), checked again with ``fstat``.

    Raises:
        OSError: naming ``path``: it cannot be opened, is not a regular file, or is too large.
    """
    _require_tokenizer_file(path, os.stat(path))  # a device is never even opened
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        _require_tokenizer_file(path, os.fstat(fd))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _require_tokenizer_file(path: str, st: os.stat_result) -> None:
    """Raise an OSError naming ``path`` unless ``st`` is a regular file of a tokenizer's size."""
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "a directory, not a tokenizer file", path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or socket)", path)
    if st.st_size > MAX_TOKENIZER_FILE_BYTES:
        raise OSError(errno.EFBIG, f"{st.st_size:,} bytes, larger than any tokenizer file "
                      f"(at most {MAX_TOKENIZER_FILE_BYTES:,})", path)  # fmt: skip


def read_pinned(path: str, expected: str | None) -> tuple[bytes, str]:
    """Read a tokenizer file (:func:`open_tokenizer_file`); return its bytes and their sha256.

    The hash is of the very bytes that get parsed, so a file replaced while it is read cannot
    slip through under the old hash.

    Raises:
        OSError: the file cannot be read, or is no tokenizer file (:func:`open_tokenizer_file`).
        TokenizerError: ``expected`` is given and is not the file's sha256 (the file changed
            since the tokenizer was first loaded).
    """
    with open_tokenizer_file(path) as f:
        raw = f.read(MAX_TOKENIZER_FILE_BYTES + 1)
    if len(raw) > MAX_TOKENIZER_FILE_BYTES:  # grew after the check
        raise OSError(errno.EFBIG, "grew past the largest tokenizer file while read", path)
    actual = hashlib.sha256(raw).hexdigest()
    if expected is not None and expected != actual:
        raise TokenizerError(
            f"tokenizer file {path} changed since it was loaded (sha256 {expected[:16]}... "
            f"then, {actual[:16]}... now); every process must tokenise with the same file: "
            "restore the file, or start again with the new one"
        )
    return raw, actual
