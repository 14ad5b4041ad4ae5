"""``wdstream stats``: counts of a packed dataset, its document lengths, what packing did to
documents, and for a dataset with a loss mask the audit of its supervised tokens (for a chat
dataset also per role, and the template's problems: ``docs/CHAT.md``).

Reads every sample once (through :func:`~wdstream.read.sources.shards.iter_samples`); the
CLI only prints what :func:`dataset_stats` returns. :func:`scan_dataset` also keeps the
arrays the counts come from (every document's length, every best-fit row's padding, every
shard's tokens), which ``stats --plot`` draws (:mod:`wdstream.plots`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdstream.format.index import DatasetIndex
from wdstream.format.loss import carries_loss
from wdstream.read.sources.shards import iter_samples, read_index
from wdstream.storage import Store, open_store

__all__ = ["DatasetScan", "dataset_stats", "mask_lines", "scan_dataset"]


@dataclass(frozen=True)
class DatasetScan:
    """What one pass over a dataset's samples found: ``stats`` (:func:`dataset_stats`) and
    the arrays behind it: ``doc_lengths`` (tokens of every document, pieces joined, in
    dataset order), ``row_padding`` (padding tokens of every best-fit row; None in other
    modes) and ``shard_tokens`` (tokens of every shard, from ``index.json``)."""

    stats: dict[str, Any]
    doc_lengths: np.ndarray
    row_padding: np.ndarray | None
    shard_tokens: np.ndarray


def dataset_stats(root: str | Store) -> dict[str, Any]:
    """Counts from the index plus a log2 histogram of document lengths (reads every sample).

    Returns:
        dict with shards, samples, documents, tokens, bytes, ``doc_len_histogram``:
        ``{"2^k..2^(k+1)-1": count}`` by token length (EOS included), and what the mode
        did to documents: ``rows`` (samples of concat/bestfit; None in docs mode),
        ``documents_split`` (documents stored in more than one piece, nothing lost: at row
        edges in concat mode, only those longer than a row in bestfit mode) with
        ``documents_split_pct``, and ``padding_tokens`` / ``padding_pct`` (bestfit rows'
        padding, as a share of all tokens; 0 in the other modes). A dataset with a loss mask
        adds ``loss_mask`` (:func:`_mask_report`); None otherwise.
    """
    return scan_dataset(root).stats


def scan_dataset(root: str | Store) -> DatasetScan:
    """:func:`dataset_stats` with the arrays it counted (:class:`DatasetScan`)."""
    store = root if isinstance(root, Store) else open_store(root)
    index = read_index(store)
    bestfit = index.mode == "bestfit"
    hist: dict[int, int] = {}
    current = pieces = supervised = 0
    lengths: list[int] = []
    pads: list[int] = []
    cut = 0
    for _, _, smp in iter_samples(store, index):
        if index.loss_mask is not None:
            supervised += int(np.count_nonzero(carries_loss(smp.tokens)))
        if bestfit:  # the last piece of a best-fit row is its padding
            pads.append(smp.doc_lens[-1])
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
    doc_lengths = np.asarray(lengths, dtype=np.int64)
    padding = sum(pads)
    if lengths:
        buckets = np.floor(np.log2(doc_lengths.astype(np.float64))).astype(int)
        for b, c in zip(*np.unique(buckets, return_counts=True), strict=True):
            hist[int(b)] = int(c)
    stats: dict[str, Any] = {
        "shards": len(index.shards),
        "samples": index.total_samples,
        "documents": index.total_documents,
        "tokens": index.total_tokens,
        "bytes": int(np.asarray(index.column("bytes"), dtype=np.int64).sum()),
        "mode": index.mode,
        "seq_len": index.seq_len,
        "tokenizer": index.tokenizer,
        "doc_len_histogram": {f"{2**b}..{2 ** (b + 1) - 1}": hist[b] for b in sorted(hist)},
        "doc_len_mean": float(np.mean(doc_lengths)) if lengths else math.nan,
        "input_stats": index.stats,
        "rows": None if index.mode == "docs" else index.total_samples,
        "documents_split": cut,
        "documents_split_pct": 100 * cut / len(lengths) if lengths else 0.0,
        "padding_tokens": padding,
        "padding_pct": 100 * padding / index.total_tokens if index.total_tokens else 0.0,
        "loss_mask": (
            _mask_report(index, supervised, padding) if index.loss_mask is not None else None
        ),
    }
    return DatasetScan(
        stats=stats,
        doc_lengths=doc_lengths,
        row_padding=np.asarray(pads, dtype=np.int64) if bestfit else None,
        shard_tokens=np.asarray(index.column("tokens"), dtype=np.int64),
    )


_MASK_COUNTS = (
    "masked_documents",
    "unsupervised_documents_refused",
    "long_documents_dropped",
    "long_documents_truncated",
)


def _mask_report(index: DatasetIndex, supervised: int, padding: int) -> dict[str, Any]:
    """The audit of a masked dataset: supervised tokens counted in the shards (tokens
    without bit 31) as a share of all tokens, whether that is what ``index.json``'s stats
    say (``index_agrees``; stats written before masks had no count: None), the document
    counts of the pack, and a chat dataset's ``chat`` (:func:`_chat_report`)."""
    tokens = index.total_tokens
    said = index.stats.get("supervised_tokens")
    chat = index.stats.get("chat")
    return {
        "supervised_tokens": supervised,
        "unsupervised_tokens": tokens - supervised,
        "supervised_pct": 100 * supervised / tokens if tokens else 0.0,
        "index_supervised_tokens": said,
        "index_agrees": None if said is None else said == supervised,
        **{k: index.stats[k] for k in _MASK_COUNTS if k in index.stats},
        "chat": None if chat is None else _chat_report(chat, tokens, supervised, padding),
    }


def _chat_report(
    chat: dict[str, Any], tokens: int, supervised: int, padding: int
) -> dict[str, Any]:
    """A chat dataset's audit from ``stats.chat`` (``wdstream.write.chataudit``): per role its
    tokens, supervised tokens, their share of the role's tokens and of all tokens; the
    template's problems by kind (with example locations) and refusals; the assistant turns
    trained and those without loss (``assistant_turns``); and whether the
    roles add up to what the shards hold (``roles_agree``: the roles' supervised tokens to
    the shards' supervised tokens, the roles' tokens and the pack's BOS/EOS to all tokens
    less best-fit padding)."""
    roles = {
        role: {**c, "supervised_pct": 100 * c["supervised"] / c["tokens"] if c["tokens"] else 0.0,
               "tokens_pct": 100 * c["tokens"] / tokens if tokens else 0.0}
        for role, c in chat["roles"].items()
    }  # fmt: skip
    role_tokens = sum(c["tokens"] for c in roles.values()) + chat["added_tokens"]
    return {
        "template_origin": chat["template_origin"],
        "template_sha256": chat["template_sha256"],
        "train_on": chat["train_on"],
        "now": chat["now"],
        "template_kwargs": chat.get("template_kwargs"),
        "roles": roles,
        "added_tokens": chat["added_tokens"],
        "roles_agree": (
            sum(c["supervised"] for c in roles.values()) == supervised
            and role_tokens == tokens - padding
        ),
        "problems": chat["problems"],
        "template_refused": chat["template_refused"],
        "assistant_turns": chat.get("assistant_turns"),  # None: packed before it was counted
    }


_COUNT_NAMES = {
    "masked_documents": "documents with a mask",
    "unsupervised_documents_refused": "documents without a supervised token refused",
    "long_documents_dropped": "documents longer than a row dropped",
    "long_documents_truncated": "documents longer than a row truncated",
}


def mask_lines(mask: dict[str, Any]) -> list[tuple[str, bool]]:
    """``wdstream stats``' lines on a masked dataset's audit (:func:`_mask_report`), each
    with whether it is a warning (for stderr)."""
    lines = [(
        f"loss mask: {mask['supervised_tokens']:,} supervised tokens "
        f"({mask['supervised_pct']:.2f} % of all tokens), {mask['unsupervised_tokens']:,} not",
        False,
    )]  # fmt: skip
    lines += [(f"  {what}: {mask[k]:,}", False) for k, what in _COUNT_NAMES.items() if k in mask]
    if mask["index_agrees"] is False:
        lines.append((f"Warning: index.json says {mask['index_supervised_tokens']:,} supervised "
                      f"tokens, the shards hold {mask['supervised_tokens']:,}", True))  # fmt: skip
    if mask["chat"] is not None:
        lines += _chat_lines(mask["chat"])
    return lines


def _kwargs_text(kwargs: dict[str, Any] | None) -> str:
    """``, template kwargs {...}`` (cut to 120 characters), or nothing when none were given."""
    if not kwargs:
        return ""
    text = json.dumps(kwargs, ensure_ascii=False)
    return f", template kwargs {text if len(text) <= 120 else text[:117] + '...'}"


def _chat_lines(chat: dict[str, Any]) -> list[tuple[str, bool]]:
    lines = [(f"chat: template {chat['template_origin']} (sha256 {chat['template_sha256'][:12]}"
              f"{', now ' + chat['now'] if chat['now'] else ''}), train_on "
              f"{chat['train_on']}{_kwargs_text(chat['template_kwargs'])}", False)]  # fmt: skip
    for role, c in chat["roles"].items():
        lines.append((f"  {role:<9} {c['tokens']:>12,} tokens ({c['tokens_pct']:5.2f} %), "
                      f"{c['supervised']:>12,} supervised ({c['supervised_pct']:6.2f} % of "
                      "them)", False))  # fmt: skip
    lines.append((f"  added by the pack (BOS/EOS): {chat['added_tokens']:,} tokens", False))
    problems = chat["problems"]
    counts = ", ".join(f"{kind} {p['count']:,}" for kind, p in problems.items())
    refused = chat["template_refused"]
    lines.append((f"  template problems: {counts}; conversations the template refused: "
                   f"{refused['count']:,}", False))  # fmt: skip
    for kind, p in problems.items():
        lines += [(f"    {kind} at {where}", False) for where in p["examples"]]
    lines += [(f"    refused at {where}", False) for where in refused["examples"]]
    turns = chat["assistant_turns"]
    if turns is not None:
        lost = turns["unsupervised"]
        lines.append((f"{'Warning: ' if lost else '  '}assistant turns without loss: {lost:,} of "
                      f"{turns['count']:,} trained (train_on {chat['train_on']})", bool(lost)))  # fmt: skip
        lines += [(f"    no loss at {where}", bool(lost)) for where in turns["examples"]]
    if not chat["roles_agree"]:
        lines.append(("Warning: the per-role counts of index.json do not add up to the "
                      "shards' tokens and supervised tokens", True))  # fmt: skip
    return lines
