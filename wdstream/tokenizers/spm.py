"""SentencePiece ``.model`` files; BOS/EOS are the model's own ``bos_id``/``eos_id``.

SentencePiece never turns control-symbol text (``<s>``, ``</s>``) in a document into those
ids, so documents are encoded as ordinary text, as with every other backend.

Rendered chat text (:meth:`SentencePieceTokenizer.encode_chat`) must turn the ``<s>`` a chat
template writes into the BOS id, as ``transformers`` does: the text is cut at the text of
every control and unknown piece (``<s>``, ``</s>``, ``<unk>``, ``<pad>``...), those become
their ids, and each piece of text between them is encoded by SentencePiece on its own (so
each gets SentencePiece's own start-of-text handling, e.g. its dummy-prefix ``▁``, which has
no characters: an empty span). User-defined symbols are recognised by SentencePiece itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from wdstream.errors import TokenizerError
from wdstream.tokenizers.base import Tokenizer, char_spans, read_pinned

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
        self._controls: re.Pattern[str] | None = None  # made on first encode_chat
        self._control_texts: frozenset[str] = frozenset()

    def _control_pattern(self) -> re.Pattern[str]:
        """A regex matching the text of every control and unknown piece, longest first."""
        if self._controls is None:
            sp = self._sp
            texts = {
                sp.id_to_piece(i)
                for i in range(sp.get_piece_size())
                if sp.is_control(i) or sp.is_unknown(i)
            }
            texts.discard("")
            self._control_texts = frozenset(texts)
            alternatives = sorted(texts, key=len, reverse=True)
            self._controls = re.compile("|".join(map(re.escape, alternatives)) or "(?!)")
        return self._controls

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

    def special_texts(self) -> frozenset[str]:
        """The text of every control and unknown piece (``<s>``, ``</s>``, ``<unk>``)."""
        self._control_pattern()
        return self._control_texts

    def encode_chat(
        self, text: str, as_text: Sequence[tuple[int, int]] = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """Ids of a rendered chat with control-piece text turned into those ids (but in
        ``as_text``: there it is text, encoded with the piece around it), and each token's
        character span (see the module docstring and :meth:`Tokenizer.encode_chat`)."""
        literal = {start for start, _ in as_text}
        ids: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        at = 0  # byte offset in the UTF-8 text of the piece being encoded
        pos = 0
        for match in self._control_pattern().finditer(text):
            if match.start() in literal:
                continue
            at = self._encode_piece(text[pos : match.start()], at, ids, starts, ends)
            width = len(match.group().encode("utf-8"))
            ids.append(int(self._sp.piece_to_id(match.group())))
            starts.append(at)
            ends.append(at + width)
            at += width
            pos = match.end()
        self._encode_piece(text[pos:], at, ids, starts, ends)
        spans = char_spans(text, np.array(starts, np.int64), np.array(ends, np.int64))
        return np.array(ids, dtype=np.int64), spans

    def _encode_piece(
        self, piece: str, at: int, ids: list[int], starts: list[int], ends: list[int]
    ) -> int:
        """Append the pieces of ``piece`` (which starts at byte ``at``) with their byte spans;
        return the byte offset after it."""
        if piece:
            # sentencepiece < 0.2.1 has the immutable proto; later ones only the proto.
            to_proto = getattr(self._sp, "encode_as_immutable_proto", None)
            proto = to_proto(piece) if to_proto else self._sp.encode_as_proto(piece)
            for p in proto.pieces:
                ids.append(p.id)
                starts.append(at + p.begin)
                ends.append(at + p.end)
        return at + len(piece.encode("utf-8"))

    def encode_ordinary_batch(self, texts: Sequence[str], num_threads: int) -> list[list[int]]:
        ids: list[list[int]] = self._sp.encode(list(texts), out_type=int, num_threads=num_threads)
        return ids

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._sp.decode([int(i) for i in ids]))

    def id_to_text(self, token: int) -> str:
        return str(self._sp.id_to_piece(int(token)))
