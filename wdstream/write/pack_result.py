"""What :func:`wdstream.write.pack.pack` returns and what it says: the result, its one-line
summary, the one-shard warning, and the errors for a pack that left turns or documents out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wdstream.errors import InputError
from wdstream.format.index import DatasetIndex
from wdstream.words import count
from wdstream.write.holdout import describe_holdout

__all__ = ["PackResult", "describe", "left_out", "one_shard_warning", "refuse_lost_turns"]


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` did (timings are not part of the dataset)."""

    index: DatasetIndex
    seconds: float
    resumed_shards: int  # shards found committed by an interrupted run
    workers: int
    pool: str
    holdout: DatasetIndex | None = None  # the held-out dataset at OUTPUT/holdout/, if asked for

    @property
    def input_mb_per_s(self) -> float:
        return self.index.stats.get("input_bytes", 0) / 1e6 / max(self.seconds, 1e-9)


def refuse_lost_turns(counts: dict[str, Any]) -> None:
    """Fail a chat pack that left assistant turns without loss (``allow_unlocated``)."""
    turns = counts.get("chat", {}).get("assistant_turns", {})
    if turns.get("unsupervised"):
        raise InputError(
            f"{turns['unsupervised']:,} of {turns['count']:,} assistant turns got no loss (first: "
            f"{turns['examples'][0]}): the chat template's text for them was not found in the "
            "conversation (stats.chat.problems.unlocated, docs/CHAT.md); no index.json written. "
            "Run the same pack with --allow-unlocated to keep them unsupervised (it resumes)"
        )


def left_out(counts: dict[str, Any], seq_len: int) -> str:
    """Why no document was packed, when the document rules left every one out."""
    why = []
    if counts.get("long_documents_dropped"):
        why.append(f"{count(counts['long_documents_dropped'], 'document')} longer than a row "
                   f"of {seq_len + 1} tokens dropped (--long-docs truncate, or a longer "
                   "--seq-len)")  # fmt: skip
    if counts.get("unsupervised_documents_refused"):
        why.append(f"{count(counts['unsupervised_documents_refused'], 'document')} without "
                   "a supervised token refused (--allow-unsupervised)")  # fmt: skip
    return f": {'; '.join(why)}" if why else ""


def describe(result: PackResult) -> str:
    """One-line summary of a pack."""
    idx = result.index
    total_bytes = sum(s.bytes for s in idx.shards)
    skipped = idx.stats.get("records_skipped", 0)
    resumed = result.resumed_shards
    return (
        f"packed {count(idx.total_documents, 'document')}, {count(idx.total_tokens, 'token')} "
        f"into {count(len(idx.shards), 'shard')} ({total_bytes / 1e6:,.1f} MB) in "
        f"{result.seconds:.1f}s: {result.input_mb_per_s:.1f} MB/s input, "
        f"{idx.total_tokens / max(result.seconds, 1e-9):,.0f} tokens/s "
        f"[{idx.tokenizer['name']}/{idx.tokenizer['backend']}, "
        f"{count(result.workers, 'worker')}, {result.pool}]"
        + (f"; {count(skipped, 'bad record')} skipped" if skipped else "")
        + (f"; resumed after {count(resumed, 'shard')}" if resumed else "")
        + (describe_holdout(result.holdout) if result.holdout is not None else "")
    )


def one_shard_warning(result: PackResult) -> str | None:
    """A warning when the pack wrote a single shard, else None.

    Readers that split a dataset by shard (webdataset's ``split_by_node`` and
    ``split_by_worker``) then give all of it to one rank and one worker and leave the rest
    empty; a smaller ``--shard-size`` makes as many shards as ranks x workers.
    """
    shards = result.index.shards
    if len(shards) != 1:
        return None
    return (
        f"the dataset is 1 shard ({shards[0].bytes / 1e6:,.1f} MB): readers that split by "
        "shard (webdataset's split_by_node/split_by_worker) leave every other rank and worker "
        "empty; pass a smaller --shard-size for at least as many shards as ranks x workers"
    )
