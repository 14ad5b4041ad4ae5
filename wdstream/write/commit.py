"""The one commit of a dataset: its ``index.json`` published, then its journal removed.

Used by :func:`wdstream.pack` (every engine) and the Ray Data sink. The index is built from
the shards the journal committed, the lock is checked (a pack whose lock was taken away
publishes nothing), ``index.json`` is written (its presence means the dataset is complete),
and only then the journal goes: a pack stopped between the two resumes from the journal
and writes the same ``index.json`` again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from hashlib import sha256
from typing import Any

from wdstream.format.checksum import CHECKSUM_NAME
from wdstream.format.index import INDEX_NAME, DatasetIndex
from wdstream.format.shard_table import TABLE_NAME, build_table
from wdstream.storage import Store
from wdstream.write.journal import Journal
from wdstream.write.lock import OutputLock

__all__ = ["Dataset", "DatasetMeta", "commit_dataset", "commit_datasets", "write_index"]


@dataclass(frozen=True)
class DatasetMeta:
    """What ``index.json`` says about every sample, from the pack's settings."""

    tokenizer: dict[str, Any]  # Tokenizer.info()
    eos_id: int | None
    bos_id: int | None
    dtype: str
    mode: str
    seq_len: int
    loss_mask: str | None = None  # "bit31": stored ids carry a loss mask (format.loss)


# One dataset a pack commits: where it goes, its journal, its meaning and its stats.
Dataset = tuple[Store, Journal, DatasetMeta, dict[str, Any]]


def commit_dataset(
    store: Store, lock: OutputLock, journal: Journal, meta: DatasetMeta, stats: dict[str, Any]
) -> DatasetIndex:
    """Publish ``index.json`` for the shards ``journal`` committed, then remove the journal.

    Raises:
        PackLockedError: the output's lock was taken away while the pack ran.
    """
    return commit_datasets(lock, [(store, journal, meta, stats)])[0]


def commit_datasets(lock: OutputLock, datasets: list[Dataset]) -> list[DatasetIndex]:
    """Publish the ``index.json`` of each dataset a pack wrote (the training one first, then
    a held-out one, :mod:`wdstream.write.holdout`), then remove their journals.

    The indexes are written last to first and the journals removed first to last: a pack
    stopped at any point either resumes (the first dataset's journal is still there, and a
    resumed pack writes the same ``index.json`` files again) or is complete (only a held-out
    dataset's leftover journal may remain, which ``--overwrite`` clears).

    Raises:
        PackLockedError: the output's lock was taken away while the pack ran.
    """
    indexes = [_dataset_index(journal, meta, stats) for _, journal, meta, stats in datasets]
    lock.verify()  # publish nothing if another pack has taken the output meanwhile
    written = [
        write_index(store, index)
        for (store, *_), index in reversed(list(zip(datasets, indexes, strict=True)))
    ]
    for _, journal, _, _ in datasets:
        journal.remove()
    return written[::-1]


def _dataset_index(journal: Journal, meta: DatasetMeta, stats: dict[str, Any]) -> DatasetIndex:
    """The index of the shards ``journal`` committed."""
    return DatasetIndex(
        tokenizer=meta.tokenizer,
        eos_id=meta.eos_id,
        bos_id=meta.bos_id,
        dtype=meta.dtype,
        mode=meta.mode,
        seq_len=meta.seq_len,
        sample_tokens=meta.seq_len + 1 if meta.mode != "docs" else None,
        shards=tuple(journal.entries),
        stats=stats,
        checksum=CHECKSUM_NAME,
        pad_id=meta.eos_id if meta.mode == "bestfit" else None,
        loss_mask=meta.loss_mask,
    )


def write_index(store: Store, index: DatasetIndex) -> DatasetIndex:
    """Write ``index``'s shard table (``index.shards``), then ``index.json`` committing to
    it by length and sha256; returns the index as written (with ``shard_table``).

    The table goes first: ``index.json``'s presence still means the dataset is complete, and
    a pack stopped between the two writes the same table again when it resumes.
    """
    table = build_table(index.shards)
    store.write_bytes(TABLE_NAME, table)
    commitment = {"bytes": len(table), "name": TABLE_NAME, "sha256": sha256(table).hexdigest()}
    index = replace(index, shard_table=commitment)
    store.write_bytes(INDEX_NAME, index.to_json().encode())
    return index
