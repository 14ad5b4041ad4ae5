"""Writes that run out of space, reported by the object they were writing (``pack``'s
output store): ``[Errno 28]`` names no file, and the advice is to free space and rerun."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from wdstream.errors import WdstreamError
from wdstream.storage.base import ForwardingStore

__all__ = ["NamingFullDisk", "naming_full_disk"]


_FULL_DISK = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


@contextmanager
def naming_full_disk(url: str) -> Iterator[None]:
    """Turn a write's ``[Errno 28]`` (which names no file) into an error naming ``url``.

    A pack that ran out of space is resumable like any interrupted one: the journal names
    only complete shards and no object appears half-written, so the advice is to rerun.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno not in _FULL_DISK:
            raise
        raise WdstreamError(
            f"{_FULL_DISK[exc.errno]} while writing {url}: free space and rerun the same "
            "command: it resumes from the last complete shard"
        ) from exc


class NamingFullDisk(ForwardingStore):
    """The output store, with writes that run out of space reported by object name.

    Every write of ``pack`` (shards and sidecars in the writer thread, the journal, the
    index) goes through this, so each names the object it was writing.
    """

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        with naming_full_disk(self.inner.child_url(name)), self.inner.writer(name) as out:
            yield out

    def write_bytes(self, name: str, data: bytes) -> None:
        with naming_full_disk(self.inner.child_url(name)):
            self.inner.write_bytes(name, data)
