"""The source interface: one dataset a reader's sequence is built over.

Two kinds implement it: a packed dataset (:class:`~wdstream.read.sources.packed.ShardSource`:
``index.json``, sidecars, ranged and checked sample reads) and raw text files tokenised on the
fly (:class:`~wdstream.read.sources.text.TextSource`: seekable document positions). What
else a sequence needs of its kind of source it asks of that kind's own class.
"""

from __future__ import annotations

from typing import Protocol

from wdstream.read.sources.identity import DatasetIdentity

__all__ = ["Source"]


class Source(Protocol):
    """One dataset, as a reader sees it."""

    @property
    def identity(self) -> DatasetIdentity:
        """What a saved state names this dataset by: its content (``identity.py``)."""

    def __len__(self) -> int:
        """Shards (packed) or files (text)."""

    def where(self, i: int) -> str:
        """The URL of shard or file ``i``, for messages."""

    def close(self) -> None:
        """Release open files, mappings and connections."""
