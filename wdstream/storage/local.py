"""Local-filesystem store: atomic writes by ``rename``; ranged reads by ``pread`` or ``mmap``."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from wdstream.storage.base import Store

__all__ = ["LocalStore", "PARTIAL_SUFFIX"]

# Half-written objects live under a hidden name with this suffix until renamed into place.
PARTIAL_SUFFIX = ".partial"


class LocalStore(Store):
    """Objects are files directly under ``root``."""

    def __init__(self, root: str | os.PathLike[str], create: bool = False) -> None:
        self.root = Path(root)
        self.url = str(self.root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        self._fds: dict[str, int] = {}
        self._maps: dict[str, mmap.mmap] = {}

    def _path(self, name: str) -> Path:
        return self.root / name

    def _fd(self, name: str) -> int:
        # Shards are immutable once visible, so one cached descriptor per file serves every
        # ranged read; reopening per sample is what makes some peers slow.
        fd = self._fds.get(name)
        if fd is None:
            fd = os.open(self._path(name), os.O_RDONLY)
            self._fds[name] = fd
        return fd

    def read(self, name: str) -> bytes:
        return self._path(name).read_bytes()

    def read_range(self, name: str, start: int, end: int) -> bytes:
        return os.pread(self._fd(name), end - start, start)

    def read_range_view(self, name: str, start: int, end: int) -> memoryview:
        # Shards are immutable once visible, so a read-only map of the whole file serves
        # every window without copying the bytes out of the page cache first.
        mapped = self._maps.get(name)
        if mapped is None:
            if os.fstat(self._fd(name)).st_size == 0:
                return memoryview(b"")
            mapped = self._maps[name] = mmap.mmap(self._fd(name), 0, access=mmap.ACCESS_READ)
        return memoryview(mapped)[start : min(end, len(mapped))]

    def size(self, name: str) -> int:
        return self._path(name).stat().st_size

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def list(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if p.is_file() and not p.name.startswith(".")
        )

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        final = self._path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.with_name(f".{final.name}.{os.getpid()}{PARTIAL_SUFFIX}")
        try:
            with open(partial, "wb") as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, final)
        finally:
            partial.unlink(missing_ok=True)

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def remove_partials(self) -> int:
        """Delete leftovers of interrupted writes; returns how many were removed."""
        if not self.root.is_dir():
            return 0
        leftovers = [p for p in self.root.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
        for p in leftovers:
            p.unlink(missing_ok=True)
        return len(leftovers)

    def close(self) -> None:
        for mapped in self._maps.values():
            try:
                mapped.close()
            except BufferError:
                pass  # token views still point into it; it is unmapped when they are freed
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __getstate__(self) -> dict[str, object]:
        # Descriptors do not survive a fork/spawn into DataLoader workers; reopen there.
        return {"root": self.root, "url": self.url, "_fds": {}, "_maps": {}}
