"""``wdstream stats``: counts of a packed dataset, its document lengths, what packing did to
documents, and for a dataset with a loss mask the audit of its supervised tokens.

Reads every sample once (through :func:`~wdstream.read.sources.shards.iter_samples`); the
CLI only prints what :func:`dataset_stats` returns.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from wdstream.format.index import DatasetIndex
from wdstream.format.loss import NO_LOSS_BIT
from wdstream.read.sources.shards import iter_samples, read_index
from wdstream.storage import Store, open_store

__all__ = ["dataset_stats"]


def dataset_stats(root: str | Store) -> dict[str, Any]:
    """Counts from the index plus a log2 histogram of document lengths (reads every sample).

    Returns:
        dict with shards, samples, documents, tokens, bytes, ``doc_len_histogram``:
        ``{"2^k..2^(k+1)-1": count}`` by token length (EOS included), and what the mode
        did to documents: ``rows`` (samples of concat/bestfit; None in docs mode),
        ``documents_truncated`` (documents cut into more than one piece: at row edges in
        concat mode, only those longer than a row in bestfit mode) with
        ``documents_truncated_pct``, and ``padding_tokens`` / ``padding_pct`` (bestfit rows'
        padding, as a share of all tokens; 0 in the other modes). A dataset with a loss mask
        adds ``loss_mask`` (:func:`_mask_report`); None otherwise.
    """
    store = root if isinstance(root, Store) else open_store(root)
    index = read_index(store)
    bestfit = index.mode == "bestfit"
    hist: dict[int, int] = {}
    current = pieces = padding = supervised = 0
    lengths: list[int] = []
    cut = 0
    for _, _, smp in iter_samples(store, index):
        if index.loss_mask is not None:
            supervised += int(np.count_nonzero(smp.tokens < NO_LOSS_BIT))
        if bestfit:  # the last piece of a best-fit row is its padding
            padding += smp.doc_lens[-1]
        for j, n in enumerate(index.document_pieces(smp.doc_lens)):
            if j == 0 and smp.cont:
                current += n
                pieces += 1
                continue
            if current:
                lengths.append(current)
                cut += pieces > 1
            current, pieces = n, 1
    if current:
        lengths.append(current)
        cut += pieces > 1
    if lengths:
        buckets = np.floor(np.log2(np.asarray(lengths, dtype=np.float64))).astype(int)
        for b, c in zip(*np.unique(buckets, return_counts=True), strict=True):
            hist[int(b)] = int(c)
    return {
        "shards": len(index.shards),
        "samples": index.total_samples,
        "documents": index.total_documents,
        "tokens": index.total_tokens,
        "bytes": sum(s.bytes for s in index.shards),
        "mode": index.mode,
        "seq_len": index.seq_len,
        "tokenizer": index.tokenizer,
        "doc_len_histogram": {f"{2**b}..{2 ** (b + 1) - 1}": hist[b] for b in sorted(hist)},
        "doc_len_mean": float(np.mean(lengths)) if lengths else math.nan,
        "input_stats": index.stats,
        "rows": None if index.mode == "docs" else index.total_samples,
        "documents_truncated": cut,
        "documents_truncated_pct": 100 * cut / len(lengths) if lengths else 0.0,
        "padding_tokens": padding,
        "padding_pct": 100 * padding / index.total_tokens if index.total_tokens else 0.0,
        "loss_mask": _mask_report(index, supervised) if index.loss_mask is not None else None,
    }


_MASK_COUNTS = (
    "masked_documents",
    "unsupervised_documents_refused",
    "long_documents_dropped",
    "long_documents_truncated",
)


def _mask_report(index: DatasetIndex, supervised: int) -> dict[str, Any]:
    """The audit of a masked dataset: supervised tokens counted in the shards (tokens
    without bit 31) as a share of all tokens, whether that is what ``index.json``'s stats
    say (``index_agrees``; stats written before masks had no count: None), and the
    document counts of the pack (``docs/MASKS.md``)."""
    tokens = index.total_tokens
    said = index.stats.get("supervised_tokens")
    return {
        "supervised_tokens": supervised,
        "unsupervised_tokens": tokens - supervised,
        "supervised_pct": 100 * supervised / tokens if tokens else 0.0,
        "index_supervised_tokens": said,
        "index_agrees": None if said is None else said == supervised,
        **{k: index.stats[k] for k in _MASK_COUNTS if k in index.stats},
    }
