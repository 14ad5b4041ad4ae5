"""Tokenizer backends loaded from a file: Hugging Face ``tokenizer.json`` and SentencePiece.

:func:`wdstream.tokenizer.load_tokenizer` picks one by the path it is given; tiktoken
encodings live in :mod:`wdstream.tokenizer` itself. Every backend implements
:class:`~wdstream.tokenizers.base.Tokenizer`.
"""
