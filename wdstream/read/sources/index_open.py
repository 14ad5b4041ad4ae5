"""Opening a dataset's ``index.json`` and, where it has one, its shard table, once per node.

``index.json`` of a dataset with a shard table lists its shards last; a reader reads its
first :data:`HEAD_BYTES`, parses the summary before the list (:mod:`~wdstream.format.
index_head`) and memory-maps the table the summary commits to (length and sha256):

- from the dataset folder itself when it is local;
- from the node cache (``cache_dir/tables/SHA256.shards``) for a remote dataset opened with
  a ``cache_dir``: the first process of the node to open it takes a lock, fetches the table
  once and renames it into place; every other rank and worker maps the same file;
- from memory otherwise (one GET a rank).

An ``index.json`` that fits in the first read is parsed whole, as by earlier versions, and
when it has a table its list must equal the table row for row: a small dataset costs
nothing more, and an edit of either is refused. ``wdstream verify`` compares the two at any
size. Datasets without a table (packed before it) open as they always did.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import stat
import tempfile
import warnings
from dataclasses import fields, replace
from typing import Any

from wdstream.errors import IncompleteDatasetError, IndexValidationError
from wdstream.format.index import INDEX_NAME, JOURNAL_NAME, DatasetIndex, ShardTable
from wdstream.format.index_head import parse_head
from wdstream.format.shard_table import TABLE_NAME, ShardRows
from wdstream.storage import Store
from wdstream.storage.cache import CachedStore
from wdstream.storage.cache_evict import FULL, unlink_quietly
from wdstream.storage.local import LocalStore

__all__ = ["HEAD_BYTES", "MappedRows", "listed_problem", "read_index"]

HEAD_BYTES = 64 << 10  # index.json's summary is a few KB; the list follows it
MAX_HEAD_BYTES = 16 << 20  # a summary longer than this: the file is parsed whole
_HEADER_BYTES = 64  # a table's header: sizes and the CRC32C of the rest
# Keys a summary cannot do without: a head lacking one (keys sorted, say, ``shards`` no longer
# last) is no summary, and the whole file is parsed, as every reader of it would.
_REQUIRED = ("format", "version", "tokenizer", "eos_id", "bos_id", "dtype", "mode", "seq_len",
             "sample_tokens")  # fmt: skip
_KNOWN = frozenset(f.name for f in fields(DatasetIndex)) - {"shards"}


class MappedRows(ShardRows):
    """A table memory-mapped from a local file: a process it is sent to maps the same file
    (and re-checks its CRC32C) instead of receiving a copy of the bytes.

    Whole columns are read through the map (planning, totals: the pages are the node's,
    shared). A single row (a shard a worker opens) is read with ``pread`` instead: a page
    fault on the map would map its neighbours too (fault-around, ~300 KB a fault here), so
    a worker reading 85 rows came to hold 11 MB of the table's pages in its RSS.
    """

    _fd = -1  # until opened: __del__ of a table refused before it was opened closes nothing

    def __init__(
        self,
        path: str,
        where: str,
        size: int,
        check_crc: bool = True,
        header: bytes | None = None,
    ) -> None:
        """``header``: the first bytes of the table as the process that sent this one
        checked it (its sha256); a table replaced since, CRC32C valid or not, is refused."""
        self.path = path
        self._fd = _open_regular(path, where)  # one descriptor: the map and pread agree
        found = os.fstat(self._fd).st_size
        if found != size:
            raise IndexValidationError(f"{where}: {found} bytes, index.json says {size}")
        data = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        super().__init__(data, where, check_crc)
        if header is not None and bytes(data[: len(header)]) != header:
            raise IndexValidationError(
                f"{where}: replaced since the dataset was opened (its header, CRC32C included, "
                "is not the one checked against index.json's sha256)"
            )

    def cell(self, start: int, size: int) -> bytes:
        data = os.pread(self._fd, size, start)
        if len(data) != size:  # cut while open: a short read would read as zeros
            raise IndexValidationError(
                f"{self.where}: cut to {os.fstat(self._fd).st_size} bytes while open"
            )
        return data

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)

    def __reduce__(self) -> tuple[Any, ...]:
        header = bytes(self.data[:_HEADER_BYTES])
        return (_remap, (self.path, self.where, self.size, header))


def _remap(path: str, where: str, size: int, header: bytes) -> ShardRows | _Refused:
    """The table sent to another process, mapped there; a refusal is raised where the table
    is first used: raised while unpickling, it kills a spawned torch worker before torch can
    hand the error back ("DataLoader worker exited unexpectedly")."""
    try:
        return MappedRows(path, where, size, True, header)
    except (IndexValidationError, OSError) as exc:
        return _Refused(exc)


class _Refused:
    """A table that was refused in this process: every use raises that refusal."""

    def __init__(self, exc: Exception) -> None:
        self._exc = exc

    def __getattr__(self, name: str) -> Any:
        raise self._exc

    def __len__(self) -> int:
        raise self._exc

    def __getitem__(self, i: Any) -> Any:
        raise self._exc

    def __iter__(self) -> Any:
        raise self._exc


def _open_regular(path: str, where: str) -> int:
    """A read-only descriptor of the table at ``path``, refusing anything but a regular file:
    opening a FIFO blocks until something writes to it (``stat`` first, so a device is never
    opened; ``O_NONBLOCK`` and ``fstat`` for a FIFO swapped in between)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise IndexValidationError(f"{where}: not a regular file (a FIFO, device or folder)")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IndexValidationError(f"{where}: not a regular file (a FIFO, device or folder)")
    return fd


def read_index(store: Store) -> DatasetIndex:
    """Parse the store's ``index.json`` and map its shard table if it has one.

    Raises:
        IncompleteDatasetError: if there is none; says whether a pack was interrupted there
            (its resume journal is present) and how to finish it.
        IndexValidationError: if it is not a valid, consistent index, or its table is not
            the one it commits to (names file and key).
    """
    where = store.child_url(INDEX_NAME)
    size, summary = HEAD_BYTES, None
    while True:
        try:
            head = bytes(store.read_source_range(INDEX_NAME, 0, size))
        except FileNotFoundError:
            raise _missing(store, where) from None
        whole = len(head) < size
        if whole or size >= MAX_HEAD_BYTES:
            break  # the whole file (or a summary too long to be one): parsed whole
        summary = parse_head(head)
        if summary is not None:
            break
        size *= 8
    if not whole and _is_summary(summary):
        assert summary is not None
        rows = _open_table(store, summary["shard_table"], where)
        return DatasetIndex.from_table(summary, rows, where)
    text = head if whole else store.read(INDEX_NAME)
    index = DatasetIndex.from_json(text, where=where)
    if index.shard_table is None:
        return index
    rows = _open_table(store, index.shard_table, where)
    _same_shards(index, rows, where)
    # from_json checked every rule on these keys and on a list equal to the table row for
    # row: from_table's parse and checks of the same again (~0.2 ms) could only pass.
    return replace(index, shards=ShardTable(rows))


def _is_summary(head: dict[str, Any] | None) -> bool:
    """Whether ``head`` (the keys before the list) commits to a table and holds every
    required key: an index to open from its head and table."""
    return (
        head is not None
        and head.get("shard_table") is not None
        and all(key in head for key in _REQUIRED)
    )


def listed_problem(store: Store, index: DatasetIndex) -> str | None:
    """What is wrong between ``index.json``'s shard list and the shard table ``index``
    was read from (``wdstream verify``: readers of a large index read only the table), or
    a table lying in the folder that index.json does not commit to; None when they agree."""
    where = store.child_url(INDEX_NAME)
    if index.shard_table is None:
        if index.version >= 2 and store.exists(TABLE_NAME):
            return (
                f"{where}: commits to no shard table, but {store.child_url(TABLE_NAME)} "
                "is there (a pack writes both: shard_table was removed from index.json?)"
            )
        return None
    table = index.shards.table if isinstance(index.shards, ShardTable) else None
    assert table is not None
    text = store.read(INDEX_NAME)
    try:
        _same_shards(DatasetIndex.from_json(text, where), table, where)
    except IndexValidationError as exc:
        return str(exc)
    head = parse_head(text)
    if _is_summary(head):  # a reader of a large index.json reads only these keys
        assert head is not None
        late = [key for key in json.loads(text) if key in _KNOWN and key not in head]
        if late:
            return (
                f"{where}: {late[0]}: after the shard list, where a reader of an index.json "
                f"over {HEAD_BYTES >> 10} KiB does not look (a pack writes shards last)"
            )
    return None


def _missing(store: Store, where: str) -> IncompleteDatasetError:
    if store.exists(JOURNAL_NAME):
        return IncompleteDatasetError(
            f"{where} does not exist: a pack into {store.child_url('')} was interrupted "
            f"(its journal {JOURNAL_NAME} is there). Rerun the same `wdstream pack` "
            "command to finish it; the dataset is readable once index.json is written."
        )
    return IncompleteDatasetError(
        f"{where} does not exist: not a packed wdstream dataset (pack one with "
        "`wdstream pack`, or pass shard URLs such as 'data-{000000..000009}.tar')"
    )


def _same_shards(index: DatasetIndex, rows: ShardRows, where: str) -> None:
    """index.json's shard list equals its table, row for row."""
    if len(index.shards) != len(rows):
        raise IndexValidationError(
            f"{where}: shards: {len(index.shards)} listed, {len(rows)} in the shard table "
            f"{TABLE_NAME}"
        )
    for i, entry in enumerate(index.shards):
        row = rows.row(i)
        for key, value in row.items():
            if getattr(entry, key) != value:
                raise IndexValidationError(
                    f"{where}: shards[{i}].{key}: {getattr(entry, key)!r} in index.json, "
                    f"{value!r} in the shard table {TABLE_NAME}"
                )
        if entry.provenance is not None and "provenance" not in row:
            raise IndexValidationError(
                f"{where}: shards[{i}].provenance: in index.json, not in the shard table"
            )


def _commitment(commit: Any, where: str) -> tuple[int, str]:
    """``shard_table``'s length and sha256, checked."""
    ok = (
        type(commit) is dict
        and commit.get("name") == TABLE_NAME
        and type(commit.get("bytes")) is int
        and 64 <= commit["bytes"] < 1 << 48
        and type(commit.get("sha256")) is str
        and len(commit["sha256"]) == 64
        and all(c in "0123456789abcdef" for c in commit["sha256"])
    )
    if not ok:
        raise IndexValidationError(
            f"{where}: shard_table: expected {{'name': {TABLE_NAME!r}, 'bytes': an integer "
            f">= 64, 'sha256': 64 lowercase hex digits}}, got {str(commit)[:200]}"
        )
    return commit["bytes"], commit["sha256"]


def _open_table(store: Store, commit: Any, where: str) -> ShardRows:
    """The table ``commit`` names, checked against its length and sha256 and mapped."""
    size, digest = _commitment(commit, where)
    at = store.child_url(TABLE_NAME)
    if isinstance(store, LocalStore):
        try:
            rows: ShardRows = MappedRows(str(store.root / TABLE_NAME), at, size, False)
        except FileNotFoundError:
            raise IndexValidationError(
                f"{at} does not exist, but {where} names it (shard_table)"
            ) from None
    elif isinstance(store, CachedStore):
        return _cached_table(store, at, size, digest, where)  # checked there
    else:
        rows = ShardRows(_fetch(store, at, size), at, check_crc=False)
    _check_sha(rows, digest, where)
    return rows


def _check_sha(rows: ShardRows, digest: str, where: str) -> None:
    if hashlib.sha256(memoryview(rows.data)).hexdigest() != digest:
        raise IndexValidationError(
            f"{rows.where}: its sha256 is not the one {where} commits to (shard_table.sha256)"
        )
    # The CRC32C too: a table whose bytes and sha256 were both replaced must still be whole.
    rows.verify_crc()


def _fetch(store: Store, at: str, size: int) -> bytes:
    try:
        data = bytes(store.read_source_range(TABLE_NAME, 0, size + 1))
    except FileNotFoundError:
        raise IndexValidationError(f"{at} does not exist, but index.json names it") from None
    if len(data) != size:
        raise IndexValidationError(f"{at}: {len(data)} bytes, index.json says {size}")
    return data


def _cached_table(store: CachedStore, at: str, size: int, digest: str, where: str) -> ShardRows:
    """The table from the node cache, its sha256 and CRC32C checked once: fetched by the
    first process of the node (under a lock, so ranks starting together fetch it once),
    refused before the cache keeps it if it is not the committed one, and mapped by all;
    a cached copy whose sha256 differs is fetched again. Where the cache's disk is full the
    table is fetched and kept in memory (a warning says so), as block writes are skipped:
    a full cache costs the caching, never the run."""
    folder = os.path.join(store.cache_dir, "tables")
    path = os.path.join(folder, f"{digest}.shards")
    try:
        os.makedirs(folder, exist_ok=True)
        lock = open(os.path.join(folder, f"{digest}.lock"), "a+b")  # noqa: SIM115 - with below
    except OSError as exc:
        if exc.errno not in FULL:
            raise
        return _kept(store, at, size, digest, where, path)
    with lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            cached: ShardRows | None = MappedRows(path, at, size, check_crc=False)
        except (FileNotFoundError, IndexValidationError):
            cached = None  # not there, or not a file of its size: fetched and replaced
        if cached is not None:
            if hashlib.sha256(memoryview(cached.data)).hexdigest() == digest:
                cached.verify_crc()
                return cached
            os.unlink(path)  # damaged in the cache: fetched again
        return _kept(store, at, size, digest, where, path)


def _kept(store: Store, at: str, size: int, digest: str, where: str, path: str) -> ShardRows:
    """The table fetched and checked, then kept in the node cache as ``path`` and mapped from
    there; in memory where the cache's disk is full (ENOSPC, EDQUOT), with a warning.

    Raises:
        OSError: naming ``path``, for any other failure to keep it.
    """
    fetched = ShardRows(_fetch(store, at, size), at, check_crc=False)
    _check_sha(fetched, digest, where)
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(fetched.data)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            unlink_quietly(tmp)
        if exc.errno not in FULL:
            raise OSError(
                exc.errno, f"cannot keep the shard table in the node cache ({exc.strerror})", path
            ) from exc
        warnings.warn(f"{path}: the node cache's disk is full; the shard table of {at} is "
                      "kept in memory, not cached", stacklevel=5)  # fmt: skip
        return fetched
    return MappedRows(path, at, size, check_crc=False)
