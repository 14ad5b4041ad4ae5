"""Clearing a pack's output: leftover shards of an earlier pack, or everything (--overwrite).

Shards are numbered without gaps, and so are journal segments, so both are found without
listing the store (plain HTTP cannot list).
"""

from __future__ import annotations

from wdstream.format.index import INDEX_NAME
from wdstream.format.provenance import provenance_name
from wdstream.format.shard_table import TABLE_NAME
from wdstream.storage import Store
from wdstream.write.journal import COMMAND_NAME, JOURNAL_NAME, segment_name
from wdstream.write.shards import shard_names

__all__ = ["clear_output", "delete_shards_from", "remove_journal_parts"]


def delete_shards_from(store: Store, name: str, first: int) -> None:
    """Delete shards ``first, first+1, ...`` until one is missing.

    Shards are numbered without gaps, so this finds every leftover without listing the
    store (plain HTTP cannot list).
    """
    i = first
    while True:
        names = (*shard_names(name, i), provenance_name(shard_names(name, i)[0]))
        if not any(store.exists(n) for n in names):
            return
        for n in names:
            store.delete(n)
        i += 1


def clear_output(store: Store, name: str) -> None:
    """Delete a dataset's every part at ``store`` (``--overwrite``): index.json, its shard
    table, an interrupted pack's journal, segments and command, then the shards."""
    store.delete(INDEX_NAME)
    store.delete(TABLE_NAME)
    store.delete(JOURNAL_NAME)
    remove_journal_parts(store)
    delete_shards_from(store, name, 0)


def remove_journal_parts(store: Store) -> None:
    """Delete a journal's segments and command object at ``store``, whose live journal is
    gone: an interrupted pack's being cleared, or the leftovers of a pack stopped while
    removing its journal after publishing ``index.json`` (:meth:`Journal.remove` deletes the
    live journal first), which nothing else would ever remove."""
    k = 0
    while store.exists(segment_name(k)):
        store.delete(segment_name(k))
        k += 1
    store.delete(COMMAND_NAME)
