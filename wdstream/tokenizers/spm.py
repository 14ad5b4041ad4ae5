"""SentencePiece ``.model`` files; BOS/EOS are the model's own ``bos_id``/``eos_id``.

SentencePiece never turns control-symbol text (``<s>``, ``</s>``) in a document into those
ids, so documents are encoded as ordinary text, as with every other backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wdstream.errors import TokenizerError
from wdstream.tokenizers.base import Tokenizer, read_pinned

__all__ = ["SentencePieceTokenizer"]


def _import_sentencepiece() -> Any:
    try:
        import sentencepiece
    except ImportError as exc:
        raise ImportError(
            "reading a SentencePiece .model file needs the 'sentencepiece' package "
            f"({exc}); install it with: pip install 'wdstream[hf]'"
        ) from exc
    return sentencepiece


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model file.

    Args:
        spec: path to the ``.model`` file.
        expect_sha256: refuse the file unless its sha256 is this (set when the tokenizer is
            loaded again in a worker process).

    Raises:
        ImportError: ``sentencepiece`` is not installed (names the extra).
        TokenizerError: the file is missing, not a model, or changed since it was loaded.
    """

    backend = "sentencepiece"

    def __init__(self, spec: str, expect_sha256: str | None = None) -> None:
        sentencepiece = _import_sentencepiece()
        self.spec = spec
        self.name = spec
        try:
            raw, self._sha256 = read_pinned(spec, expect_sha256)
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=raw)
        except (OSError, RuntimeError) as exc:
            raise TokenizerError(
                f"cannot load SentencePiece model {spec}: {type(exc).__name__}: {exc}"
            ) from exc
        self.n_vocab = int(self._sp.get_piece_size())
        self.bos_id = self._id_or_none(self._sp.bos_id())
        self.eos_id = self._id_or_none(self._sp.eos_id())

    @staticmethod
    def _id_or_none(token: int) -> int | None:
        return None if token < 0 else int(token)  # SentencePiece says -1 for "disabled"

    @property
    def ranks_sha256(self) -> str:
        """sha256 of the ``.model`` file's bytes."""
        return self._sha256

    def __reduce__(self) -> tuple[Any, ...]:
        return (SentencePieceTokenizer, (self.spec, self._sha256))

    def encode(self, text: str) -> np.ndarray:
        return np.array(self._sp.encode(text, out_type=int), dtype=np.uint32)

    def encode_ordinary_batch(self, texts: Sequence[str], num_threads: int) -> list[list[int]]:
        ids: list[list[int]] = self._sp.encode(list(texts), out_type=int, num_threads=num_threads)
        return ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._sp.decode([int(i) for i in ids]))

    def id_to_text(self, token: int) -> str:
        return str(self._sp.id_to_piece(int(token)))
