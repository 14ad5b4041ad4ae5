"""Shard names of a shard table as sequences, made one at a time as they are asked for.

A source keeps each shard's ``(root, name)`` and sidecar name; as lists those are ~150
bytes a shard in every process (15 MB at 100,000 shards, copied into each torch worker as
its reference counts are touched). Under a table they are computed from its columns: a
name under the packer's rule is one string format, a listed one a slice of the mapped names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import overload

from wdstream.format.shard_table import ShardRows

__all__ = ["ShardWhere", "TableNames", "TableUrls"]


class TableNames(Sequence[str]):
    """Every shard's value of name key ``key`` (``name``, ``sidecar``) of ``rows``."""

    def __init__(self, rows: ShardRows, key: str) -> None:
        self.rows, self.key = rows, key

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        name = self.rows.name(self.key, range(len(self))[i])
        assert name is not None
        return name

    def __iter__(self) -> Iterator[str]:
        return map(self.__getitem__, range(len(self)))


class TableUrls(Sequence[tuple[str, str]]):
    """``(root, name)`` of every shard of ``rows``, all under one ``root``."""

    def __init__(self, root: str, rows: ShardRows) -> None:
        self.root, self.names = root, TableNames(rows, "name")

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, i: int) -> tuple[str, str]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, str]]: ...
    def __getitem__(self, i: int | slice) -> tuple[str, str] | list[tuple[str, str]]:
        if isinstance(i, slice):
            return [(self.root, n) for n in self.names[i]]
        return self.root, self.names[i]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return ((self.root, n) for n in self.names)


class ShardWhere:
    """A shard's URL, for messages: what a source's reads and sidecars are given in place
    of its bound ``where``, which held the source (a reference cycle through every part it
    was given: a dropped source's stores and mapped table lived until the cyclic collector
    ran, see :mod:`~wdstream.read.weak_calls`)."""

    def __init__(self, url: Callable[[str, str], str], urls: Sequence[tuple[str, str]]) -> None:
        self._url, self._urls = url, urls

    def __call__(self, shard: int) -> str:
        return self._url(*self._urls[shard])
