"""The node cache's eviction: least recently used blocks deleted down to 90 % of the limit.

Every process that has written enough since its last sweep calls :func:`sweep`; an ``fcntl``
lock on ``cache_dir/.evict.lock`` (non-blocking) lets one sweep at a time, the others skip
theirs. The sweep lists every block of every dataset in the folder (mtime is the LRU clock:
a process touches a block when it reads it) and deletes temporary files a killed writer
left. A folder full, or removed meanwhile (a cache cleared while read), ends a sweep quietly:
eviction never fails a read.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

__all__ = ["BLOCK_SUFFIX", "FULL", "sweep", "unlink_quietly"]

BLOCK_SUFFIX = ".blk"
FULL = (errno.ENOSPC, errno.EDQUOT)  # a full disk or quota: the cache is skipped, not the read
_LOCK_NAME = ".evict.lock"
_STALE_TMP_S = 3600.0  # temporary files older than this were left by a killed process


def sweep(cache_dir: str, limit: int) -> int:
    """Delete least recently used blocks under ``cache_dir`` until it holds at most ``limit``
    bytes (down to 90% of it, so sweeps are rare). Returns how many bytes were freed; 0 when
    another process holds the sweep lock (it is sweeping the same folder)."""
    lock_path = os.path.join(cache_dir, _LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if exc.errno not in (*FULL, errno.ENOENT):
            raise
        return 0  # the folder is full or was removed meanwhile: no sweep this time
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0
        entries, total = _scan(cache_dir)
        if total <= limit:
            return 0
        freed, target = 0, total - int(limit * 0.9)
        for _, size, path in sorted(entries):
            if freed >= target:
                break
            try:
                os.unlink(path)
                freed += size
            except OSError:
                pass  # gone meanwhile, or not ours to delete: the sweep goes on
        return freed
    finally:
        os.close(fd)  # releases the lock


def _scan(cache_dir: str) -> tuple[list[tuple[float, int, str]], int]:
    """Every block under ``cache_dir`` (all roots) as (mtime, size, path), and the total;
    deletes temporary files a killed process left behind."""
    entries: list[tuple[float, int, str]] = []
    now = time.time()
    for root in _subdirs(cache_dir):
        try:
            listed = list(os.scandir(root))
        except FileNotFoundError:
            continue  # removed meanwhile
        for entry in listed:
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            if entry.name.endswith(BLOCK_SUFFIX):
                entries.append((st.st_mtime, st.st_size, entry.path))
            elif entry.name.endswith(".tmp") and now - st.st_mtime > _STALE_TMP_S:
                unlink_quietly(entry.path)
    return entries, sum(e[1] for e in entries)


def _subdirs(folder: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(folder) if e.is_dir()]
    except FileNotFoundError:
        return []


def unlink_quietly(path: str) -> bool:
    """Delete ``path`` if it is there; whether it was."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
