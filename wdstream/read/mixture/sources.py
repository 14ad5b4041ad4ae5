"""A mixture's sources: opened from their URLs, checked to share one tokenizer, and each
given its own seed.

Sources may sit on any store (local, ``s3://``, ``http(s)://``) and be packed at different
``seq_len`` (rows are cut at the reader's); their token ids must mean the same, so the
tokenizer name, the hash of its ranks and the EOS id in every ``index.json`` must agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wdstream.read.mixture.spec import MixtureSpec
from wdstream.read.sources.packed import ShardSource

__all__ = ["open_sources", "source_seed"]


def source_seed(seed: int, index: int) -> int:
    """Source ``index``'s own seed, so equal-shaped sources do not shuffle alike."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0])


def _tokenizer_id(src: ShardSource) -> tuple[Any, ...] | None:
    if src.index is None:
        return None  # shard URLs without an index: nothing to compare
    t = src.index.tokenizer
    return (t.get("name"), t.get("ranks_sha256"), src.index.eos_id)


def open_sources(spec: MixtureSpec, **store_options: Any) -> list[ShardSource]:
    """Open every source of ``spec``; they must share the tokenizer.

    Raises:
        ValueError: naming both sources and tokenizers when two differ.
    """
    sources = [ShardSource(url, **store_options) for url in spec.sources.values()]
    names = spec.names
    first = next((i for i, s in enumerate(sources) if _tokenizer_id(s) is not None), None)
    if first is not None:
        ref = _tokenizer_id(sources[first])
        for i, src in enumerate(sources):
            tid = _tokenizer_id(src)
            if tid is not None and tid != ref:
                raise ValueError(
                    f"sources {names[first]!r} and {names[i]!r} were packed with different "
                    f"tokenizers ({_describe(ref)} vs {_describe(tid)}); a mixture's rows "
                    "must share one vocabulary: pack them with the same tokenizer"
                )
    return sources


def _describe(tid: tuple[Any, ...] | None) -> str:
    assert tid is not None
    name, ranks, eos = tid
    return f"{name} (ranks {str(ranks)[:12]}, eos {eos})"
