"""Local-filesystem store: atomic writes by ``rename``, ranged reads from cached ``mmap``s.

Only regular files are read: a FIFO in place of a shard would block ``open()`` forever
(until some process opens its write end), and a device or a directory is never a shard.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from wdstream.storage.base import Store

__all__ = ["LocalStore", "PARTIAL_SUFFIX"]

# Half-written objects live under a hidden name with this suffix until renamed into place.
PARTIAL_SUFFIX = ".partial"

# Shards kept mapped at once in a process, over every LocalStore in it (each map holds a
# descriptor): enough for the lanes of a few sources' windows and their read-ahead, and far
# below the usual limit of 1024 open files however many shards, sources or Loaders there are.
_MAPPED_FILES = 256


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _require_regular(path: Path, mode: int) -> None:
    """Raise an OSError naming ``path`` and what it is, unless it is a regular file."""
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), f"file type {stat.S_IFMT(mode):o}")
    code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL  # EISDIR: IsADirectoryError
    raise OSError(
        code, f"not a regular file but {kind}; shards and indexes must be files", str(path)
    )


def _open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, refusing anything but a regular file.

    ``stat`` first, so a device is never even opened (opening some has side effects); then
    ``O_NONBLOCK``, so a FIFO swapped in after the ``stat`` cannot block ``open()``, and
    ``fstat`` of the opened descriptor to catch that swap. Regular files ignore
    ``O_NONBLOCK``.
    """
    _require_regular(path, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        _require_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unmap(mapped: mmap.mmap) -> None:
    try:
        mapped.close()
    except BufferError:
        pass  # token views still point into it; it is unmapped when they are freed


def _map_file(path: Path) -> mmap.mmap | None:
    """A read-only map of the whole regular file at ``path`` (None if it is empty)."""
    with open(_open_regular(path), "rb") as f:  # the map has its own descriptor
        size = os.fstat(f.fileno()).st_size
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None


class _MappedFiles:
    """The files mapped in this process, least recently read first, over every LocalStore.

    One bound for the process, not one per store: a mixture of many local sources, or
    Loaders dropped but not yet collected (their objects form reference cycles, freed only
    by the cyclic collector), would otherwise hold 64 descriptors each until the process
    ran out of them (or past 1023, where ``select()`` fails). A key is a store's own token
    and a file name, so two stores over the same folder never share a map (a store made
    after a repack sees the new files).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit  # maps kept; a map still viewed stays until its views are freed
        self._maps: OrderedDict[tuple[object, str], mmap.mmap | None] = OrderedDict()
        self._lock = threading.Lock()
        self._dropped: deque[object] = deque()  # owners whose maps are still to be unmapped

    def view(self, owner: object, root: Path, name: str, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)`` of the file ``name`` under ``root`` (cut at its end) as a
        view of its map; taken under the lock, so a map another thread evicts is never read
        closed."""
        key = (owner, name)
        with self._lock:
            self._unmap_dropped()
            if key in self._maps:
                self._maps.move_to_end(key)
                mapped = self._maps[key]
            else:
                mapped = self._maps[key] = _map_file(root / name)
                while len(self._maps) > self.limit:
                    old = self._maps.popitem(last=False)[1]
                    if old is not None:
                        _unmap(old)
            if mapped is None:
                return memoryview(b"")
            return memoryview(mapped)[start : min(end, len(mapped))]

    def drop(self, owner: object) -> None:
        """Unmap every file ``owner`` mapped: now, or at the next read if the lock is held.

        Never waits for the lock: a store is closed from ``__del__`` too, which the cyclic
        collector may run inside :meth:`view` on the very thread holding it.
        """
        self._dropped.append(owner)
        if self._lock.acquire(blocking=False):
            try:
                self._unmap_dropped()
            finally:
                self._lock.release()

    def _unmap_dropped(self) -> None:
        """Unmap the files of the owners dropped so far (the lock held)."""
        while self._dropped:
            owner = self._dropped.popleft()
            for key in [key for key in self._maps if key[0] is owner]:
                mapped = self._maps.pop(key)
                if mapped is not None:
                    _unmap(mapped)

    def after_fork(self) -> None:
        """In a forked child: a lock another thread held at the fork would never be freed."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._maps)


_MAPPED = _MappedFiles(_MAPPED_FILES)
os.register_at_fork(after_in_child=_MAPPED.after_fork)


class LocalStore(Store):
    """Objects are files directly under ``root``."""

    def __init__(self, root: str | os.PathLike[str], create: bool = False) -> None:
        self.root = Path(root)
        self.url = str(self.root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        self._token = object()  # this store's maps in the process-wide _MAPPED

    def _path(self, name: str) -> Path:
        return self.root / name

    def read(self, name: str) -> bytes:
        with open(_open_regular(self._path(name)), "rb") as f:
            return f.read()

    def read_range(self, name: str, start: int, end: int) -> bytes:
        return bytes(self.read_range_view(name, start, end))

    def read_range_view(self, name: str, start: int, end: int) -> memoryview:
        """A view of the shard's map: shards are immutable once visible, so one map serves
        every ranged read of a shard without reopening it (reopening per sample is what
        makes some peers slow) and without copying bytes out of the page cache first."""
        return _MAPPED.view(self._token, self.root, name, start, end)

    def size(self, name: str) -> int:
        path = self._path(name)
        info = path.stat()
        _require_regular(path, info.st_mode)
        return info.st_size

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

    def create_if_absent(self, name: str, data: bytes) -> None:
        """Write ``name`` complete under a temporary name, then hard-link it into place: the
        link fails, atomically, when ``name`` exists."""
        final = self._path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = final.with_name(f".{final.name}.{os.getpid()}{PARTIAL_SUFFIX}")
        try:
            with open(partial, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(partial, final)
            except FileExistsError:
                pass  # someone else's: the caller reads it back
        finally:
            partial.unlink(missing_ok=True)

    def lock_path(self, name: str) -> Path:
        return self._path(name)

    def remove_partials(self) -> int:
        """Delete leftovers of interrupted writes; returns how many were removed."""
        if not self.root.is_dir():
            return 0
        leftovers = [p for p in self.root.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
        for p in leftovers:
            p.unlink(missing_ok=True)
        return len(leftovers)

    def close(self) -> None:
        _MAPPED.drop(self._token)

    def __del__(self) -> None:
        # A store dropped unclosed (``open_store`` in a script) gives its maps back too,
        # not when 256 newer ones push them out; ``drop`` never waits (the collector).
        try:
            self.close()
        except Exception:  # noqa: S110 - interpreter shutdown: the module's LRU is gone
            pass

    def __getstate__(self) -> dict[str, object]:
        # Maps do not travel to a spawned DataLoader worker; it maps what it reads itself.
        return {"root": self.root, "url": self.url}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._token = object()
