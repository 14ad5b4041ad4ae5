"""Tokenizers: one :class:`~wdstream.tokenizers.base.Tokenizer` interface, one file per backend.

:func:`~wdstream.tokenizers.load.load_tokenizer` picks the backend by the name or path it is
given: tiktoken encodings (:mod:`wdstream.tokenizers.tiktoken`, with the bpe-openai
backend), Hugging Face ``tokenizer.json`` (:mod:`wdstream.tokenizers.hf`) and SentencePiece
``.model`` files (:mod:`wdstream.tokenizers.spm`).
"""

from wdstream.tokenizers.base import Tokenizer
from wdstream.tokenizers.load import index_tokenizer, load_tokenizer

__all__ = ["Tokenizer", "index_tokenizer", "load_tokenizer"]
