"""The sample builder interface, and the one factory every engine builds samples with.

A sample builder turns tokenised documents, in input order, into samples (concat: fixed
length; docs: one document each; bestfit: rows of whole documents). The local engine feeds
it token ids; the Ray driver and sink feed it token *indices* (``int64``, -1 for padding)
and ship each sample's indices to a shard task. Both resume through
:meth:`SampleBuilder.resume`, so no engine knows how a builder resumes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from wdstream.tokenizers import Tokenizer
from wdstream.write.bestfit import BestFitSampleBuilder
from wdstream.write.samples import ConcatSampleBuilder, DocsSampleBuilder, PackedSample

__all__ = [
    "MODES",
    "SampleBuilder",
    "check_mode",
    "check_token_id",
    "sample_builder",
    "special_ids",
]

MODES = ("concat", "docs", "bestfit")


class SampleBuilder(Protocol):
    """Cuts tokenised documents into samples; implemented by the three modes' builders."""

    # Whether every sample is one consecutive slice of the documents' concatenated tokens
    # (concat, docs), which lets the Ray driver ship a sample's tokens as one run.
    in_order: bool

    def add(
        self, tokens: np.ndarray, lens: Sequence[int] | np.ndarray, positions: Sequence[Any]
    ) -> Iterator[PackedSample]:
        """Take documents (their tokens concatenated, their lengths and input positions) and
        yield the samples completed so far."""
        ...

    def flush(self) -> Iterator[PackedSample]:
        """Yield the samples still held, at the end of the input."""
        ...

    def resume(
        self, tokens: np.ndarray, lens: np.ndarray, emitted: int
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Before the first :meth:`add` of a resumed pack: ``tokens``/``lens`` start at the
        journal's recorded document, of which ``emitted`` (tokens, or rows for best-fit) are
        in committed shards. Returns what is left to add and how many leading documents
        were dropped whole (their positions go too)."""
        ...


def check_mode(mode: str, seq_len: int, eos: bool) -> None:
    """Refuse a mode, row length or EOS choice no sample builder can honour.

    Raises:
        ValueError: naming the value.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be 'concat', 'docs' or 'bestfit', got {mode!r}")
    if mode == "bestfit" and not eos:
        raise ValueError(
            "mode 'bestfit' needs eos=True: readers tell documents and padding apart by "
            "the EOS that ends every document"
        )
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")


def sample_builder(
    mode: str,
    seq_len: int,
    bestfit_buffer: int,
    bos_id: int | None,
    eos_id: int | None,
    dtype: np.dtype,
    pad: int,
) -> SampleBuilder:
    """The sample builder of ``mode``: every engine builds samples with it (the Ray engine
    and sink over token indices in ``int64``, with -1 for padding)."""
    if mode == "concat":
        return ConcatSampleBuilder(seq_len + 1, dtype)
    if mode == "bestfit":
        # No row may end in a lone BOS that reads as padding (wdstream.read.batches.rows).
        head = 2 if bos_id is not None and bos_id == eos_id else 1
        return BestFitSampleBuilder(seq_len + 1, dtype, bestfit_buffer, pad, head)
    return DocsSampleBuilder(dtype)


def special_ids(
    tok: Tokenizer, eos: bool, bos: bool, bos_id: int | None
) -> tuple[int | None, int | None]:
    """``(eos_id, bos_id)`` added to every document (None: not added); giving ``bos_id``
    implies ``bos``, whose default is the tokenizer's own BOS, else its EOS.

    Raises:
        ValueError: an id is asked for and the tokenizer has none.
    """
    eos_id = tok.eos_id if eos else None
    if eos and eos_id is None:
        raise ValueError(f"tokenizer {tok.name!r} has no EOS token; pass eos=False")
    if not (bos or bos_id is not None):
        return eos_id, None
    if bos_id is None:
        bos_id = tok.bos_id if tok.bos_id is not None else tok.eos_id
    if bos_id is None:
        raise ValueError(f"tokenizer {tok.name!r} has no BOS or EOS token; give bos_id")
    check_token_id("bos_id (--bos-id)", bos_id, tok)
    if eos_id is not None:
        check_token_id("eos_id (the tokenizer's EOS)", eos_id, tok)
    return eos_id, bos_id


def check_token_id(key: str, value: object, tok: Tokenizer) -> None:
    """Refuse an id the pack would add (BOS, EOS, and so best-fit padding) that is not a
    token of ``tok``: an id past the vocabulary would be stored, and one of 2**31 or more
    read back as the loss bit (negative in the reader's rows).

    Raises:
        ValueError: naming ``key``, the value and the vocabulary.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < tok.n_vocab:
        raise ValueError(
            f"{key}: {value!r} is not a token of tokenizer {tok.name!r} (ids 0 .. "
            f"{tok.n_vocab - 1}): every id a pack writes is one"
        )
