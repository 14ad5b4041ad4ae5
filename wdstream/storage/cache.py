"""A node-local cache of remote ranged reads, shared by every worker and rank of a node.

``CachedStore(inner, cache_dir, limit)`` serves ``read_range`` from fixed, aligned blocks
of each object kept as files under ``cache_dir``; a missing run of blocks is one ranged GET
to ``inner``. Epoch 2 then reads local disk::

    object data-000003.tar   |  block 0  |  block 1  |  block 2  | ...   (CACHE_BLOCK_BYTES each)
    read_range(5 MB, 9 MB)          [=======|===]                 -> blocks 1 and 2
    cache_dir/<sha of root>/data-000003.tar.00000001.blk          (data, then a trailer)

The folder is named by a hash of the root's full identity (its URL *with* the query string,
the endpoint), the block size and the block format's version, so ``?ds=web`` and
``?ds=code`` never share blocks and blocks of an older format are never read (they age out
through eviction). A name in a sub-folder (``sub/data.tar``) is quoted into one flat file
name (``sub%2Fdata.tar``), so no folder is needed and eviction sees every block.

Why blocks, not whole shards: the reader takes a window's samples from lanes spread across
shards of ~256 MB; caching a whole shard on first touch would make epoch 1 fetch all of
every shard a lane touches before its first batch, while aligned blocks fetch (about) what
is read, and read-ahead stays sequential inside a lane. Blocks are files (not one sparse
file per shard) so that every write is a whole-file atomic rename and eviction is ``unlink``.

Safe under concurrent processes: a block is written to a private temporary name and renamed
into place, so a reader never sees a partial block; two processes that miss the same block
both fetch it and the second rename replaces identical bytes. Eviction (least recently used
by file mtime, touched on every hit) runs in whichever process has written enough since its
last sweep, under an ``fcntl`` lock so only one sweeps at a time; a block deleted under a
reader is just a miss.

Every block file ends with a trailer: a magic, the CRC32C and the length of its data. The
CRC32C is seeded with the block's binding (a hash of the object's identity and the block's
index), so a block copied over another, or one of another object or dataset, fails like a
flipped bit. A block whose trailer does not match (bit rot, a truncated file, a foreign or
swapped file, an older format) is deleted and fetched again, with a warning naming the file
and counted in ``dropped``; a cached range is never served unverified. The reader's per-sample
CRC32C then checks the bytes once more. Objects are assumed immutable (shards are): a
dataset packed again over the same URL needs its cache folder cleared; until then its stale
blocks fail the reader's per-sample checks (an error, never silent data).

Whole-object reads (``read``: ``index.json``, sidecars) and everything else pass through to
the inner store: they are small, and ``index.json`` must be fresh.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import struct
import threading
import warnings
from collections import OrderedDict
from urllib.parse import quote

from wdstream.format.checksum import crc32c
from wdstream.storage.base import ForwardingStore, Store
from wdstream.storage.cache_evict import BLOCK_SUFFIX, FULL, sweep, unlink_quietly
from wdstream.storage.private_read import read_private

__all__ = ["CACHE_BLOCK_BYTES", "CachedStore", "parse_cache_limit"]

CACHE_BLOCK_BYTES = 4 << 20  # bytes per cached block: a few samples' worth of GET latency amortised
_FORMAT = 2  # version of the block files: part of the folder's key and of the trailer
_MAGIC = b"WDSBLK02"
_TRAILER = struct.Struct("<8sIQ")  # magic, CRC32C (seeded with the binding) of the data, length
_MAX_NAME = 200  # longer quoted names become a hash (file names stop at 255 bytes)
_KEPT = 16  # verified blocks a process keeps in its own memory (at most 16 x 4 MiB: 64 MiB)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


def parse_cache_limit(limit: str | int) -> int:
    """``"50GB"`` -> 50_000_000_000, ``"2GiB"`` -> 2**31, ``4096`` -> 4096.

    Raises:
        ValueError: not a positive size.
    """
    if isinstance(limit, int) and not isinstance(limit, bool):
        value = limit
    else:
        text = str(limit).strip().upper().replace(" ", "")
        num = text.rstrip("KMGTIB")
        try:
            value = int(float(num) * _UNITS[text[len(num) :]])
        except (KeyError, ValueError):
            raise ValueError(
                f"cache_limit: not a size: {limit!r} (use e.g. 50GB, 512MiB or bytes)"
            ) from None
    if value <= 0:
        raise ValueError(f"cache_limit must be positive, got {limit!r}")
    return value


class CachedStore(ForwardingStore):
    """``inner``'s ranged reads through a bounded block cache in ``cache_dir``.

    Args:
        inner: the remote store whose reads are cached.
        cache_dir: local folder shared by the node's processes (created if missing).
        limit: bytes the cache may hold (``"50GB"`` strings or ints); a process sweeps once
            it has written ``limit / 16`` (at most 256 MB) since its last sweep, so the
            folder can exceed ``limit`` by that much per process between sweeps.
        block: block size in bytes.

    Attributes:
        hits, misses: blocks served from the cache / fetched, in this process.
        dropped: cached blocks that failed their trailer check and were fetched again.
        forgotten: blocks dropped by :meth:`forget_range` (bytes that failed a reader's
            checksums), fetched again on the next read.
    """

    def __init__(
        self,
        inner: Store,
        cache_dir: str,
        limit: str | int = "50GB",
        block: int = CACHE_BLOCK_BYTES,
    ) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        super().__init__(inner)
        self.limit = parse_cache_limit(limit)
        self.block = block
        self.cache_dir = os.path.abspath(cache_dir)
        root = f"{_FORMAT}\0{inner.identity('')}\0{block}"
        root_key = hashlib.sha256(root.encode()).hexdigest()[:16]
        self._dir = os.path.join(self.cache_dir, root_key)
        try:
            os.makedirs(self._dir, exist_ok=True)
        except OSError as exc:
            if exc.errno not in FULL:
                raise OSError(
                    exc.errno, f"cannot create the cache folder ({exc.strerror}); "
                    "give a writable cache_dir", self._dir
                ) from exc  # fmt: skip
            # Full: as for a block, nothing is cached until there is room (see _write).
            warnings.warn(f"cache folder {self._dir} cannot be made: the disk is full; reads "
                          "are not cached until there is room", stacklevel=2)  # fmt: skip
        self._sweep_every = min(self.limit // 16 + 1, 256 << 20)
        self._written = self._sweep_every  # sweep once at the first write: start bounded
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, int], memoryview] = OrderedDict()
        self._seeds: dict[str, bytes] = {}  # name -> hash of its identity (see _seed)
        self.hits = self.misses = self.dropped = self.forgotten = 0

    def read_by_digest(self, name: str, sha256: str) -> bytes:
        """``name`` from ``cache_dir/objects/SHA256`` when a copy with that digest is there,
        else fetched whole and kept there when it has that digest (written to a private
        name and renamed into place: concurrent processes never see a partial copy). Kept
        by content, so two datasets holding one sidecar share it; eviction leaves them
        (~20 bytes a sample: the blocks of the shards they describe dominate)."""
        path = os.path.join(self.cache_dir, "objects", sha256)
        try:  # O_NONBLOCK and fstat: a FIFO or device put there is a miss, never waited on
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            fd = -1
        if fd >= 0:
            with open(fd, "rb") as f:
                regular = stat.S_ISREG(os.fstat(fd).st_mode)
                data = f.read() if regular else b""
            if regular and hashlib.sha256(data).hexdigest() == sha256:
                self.hits += 1
                return data
            self.dropped += 1  # replaced below by the fetched copy
        data = self.inner.read(name)
        self.misses += 1
        if hashlib.sha256(data).hexdigest() == sha256:
            self._write(path, (data,), "copy of " + name)  # makes the folder
        return data

    # -- the cached path ----------------------------------------------------------------
    def read_range(self, name: str, start: int, end: int) -> bytes:
        return bytes(self.read_range_view(name, start, end))

    def read_range_view(self, name: str, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)``: a view into one kept block when the range lies in one,
        else the blocks joined; missing runs of blocks are fetched with one GET each."""
        if start < 0 or end < start:
            raise ValueError(f"bad byte range [{start}, {end}) of {self.child_url(name)}")
        if end == start:
            return memoryview(b"")
        first, last = start // self.block, (end - 1) // self.block
        blocks: list[memoryview | bytes] = []
        k = first
        while k <= last:
            data = self._cached(name, k)
            if data is None:
                fetched = self._fetch(name, k, self._missing_run(name, k, last))
                blocks += fetched
                k += len(fetched)
                if not fetched or len(fetched[-1]) < self.block:
                    break  # the object ends here
                continue
            blocks.append(data)
            k += 1
            if len(data) < self.block:
                break  # a short block is the object's last
        offset = start - first * self.block
        if len(blocks) == 1:
            return memoryview(blocks[0])[offset : offset + (end - start)]
        # Join only the bytes asked for: joining the whole blocks around a 1-2 MB range
        # copied 8 MB, under the GIL, for every range that crosses a block boundary.
        parts, left = [], end - start
        for block in blocks:
            part = memoryview(block)[offset : offset + left]
            parts.append(part)
            left -= len(part)
            offset = 0
        return memoryview(b"".join(parts))

    def holds_range(self, name: str, start: int, end: int) -> bool:
        """Whether every block of ``[start, end)`` is kept in this process, verified: a read
        of it is a slice of memory. A block that is only on disk still costs a read and a
        4 MB checksum, which the reader's fetch threads overlap (the sum drops the GIL)."""
        first, last = start // self.block, max(end - 1, start) // self.block
        with self._lock:
            return all((name, k) in self._kept for k in range(first, last + 1))

    def forget_range(self, name: str, start: int, end: int) -> list[str]:
        """Forget and delete the blocks of ``[start, end)``: their bytes failed a reader's
        checksums although their trailers passed (damage after the check); the next read
        fetches them again. Returns the block files deleted."""
        first, last = start // self.block, max(end - 1, start) // self.block
        gone = []
        for k in range(first, last + 1):
            with self._lock:
                self._kept.pop((name, k), None)
            path = self._path(name, k)
            if unlink_quietly(path):
                gone.append(path)
        with self._lock:
            self.forgotten += len(gone)
        return gone

    def _path(self, name: str, k: int) -> str:
        flat = quote(name, safe="-_.~")  # sub/x.tar -> sub%2Fx.tar: one flat folder
        if len(flat) > _MAX_NAME:
            flat = hashlib.sha256(name.encode()).hexdigest()
        return os.path.join(self._dir, f"{flat}.{k:08d}{BLOCK_SUFFIX}")

    def _seed(self, name: str, k: int) -> int:
        """The CRC32C seed that binds block ``k`` to its object: the checksum of the hash of
        the object's full identity and of the block's index. A block file moved or copied
        to another name, index, object or dataset fails its trailer."""
        digest = self._seeds.get(name)
        if digest is None:
            ident = f"{self.inner.identity(name)}\0{self.block}"
            digest = self._seeds[name] = hashlib.sha256(ident.encode()).digest()
        return crc32c(digest + k.to_bytes(8, "little"))

    def _cached(self, name: str, k: int) -> memoryview | None:
        """Block ``k`` of ``name`` from the cache, verified, or None (then it is fetched).

        A block is checked once per process, when it is read (into the process's memory,
        never mapped: :mod:`wdstream.storage.private_read`); it is then kept (up to ``_KEPT``
        of them), so the hot path is a slice of memory, not a file read and a checksum per
        sample. A block file unlinked, replaced or cut short meanwhile changes nothing here.
        """
        key = (name, k)
        with self._lock:
            view = self._kept.get(key)
            if view is not None:
                self._kept.move_to_end(key)
                self.hits += 1
                return view
        view = self._load(self._path(name, k), self._seed(name, k))
        if view is None:
            return None
        with self._lock:
            self._kept[key] = view
            while len(self._kept) > _KEPT:
                self._kept.popitem(last=False)
            self.hits += 1
        return view

    def _load(self, path: str, seed: int) -> memoryview | None:
        """Read a block file and check its trailer against ``seed`` (its binding); None if
        absent (a damaged, foreign or swapped one is dropped)."""
        try:  # O_NONBLOCK and fstat: a FIFO put in its place is dropped, never waited on
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                regular = stat.S_ISREG(os.fstat(fd).st_mode)
                raw = read_private(fd) if regular else memoryview(b"")  # not mapped: see there
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot read the node cache's block ({exc.strerror})", path
            ) from exc
        n = len(raw) - _TRAILER.size
        if n < 0 or _TRAILER.unpack_from(raw, n) != (_MAGIC, crc32c(raw[:n], seed), n):
            self._drop(path)
            return None
        try:
            os.utime(path)  # the LRU clock: last read by some process
        except OSError:
            pass  # evicted meanwhile, or another user's file: the touch is best-effort
        return raw[:n]

    def _drop(self, path: str) -> None:
        warnings.warn(
            f"cache block {path} failed its checksum (damaged, cut short, another object's or "
            "block's, or an older format); deleted and fetched again",
            stacklevel=4,
        )
        with self._lock:
            self.dropped += 1
        unlink_quietly(path)

    def _missing_run(self, name: str, k: int, last: int) -> int:
        """How many blocks from ``k`` (at most to ``last``) are absent: one GET for all."""
        n = 1
        while k + n <= last and not os.path.exists(self._path(name, k + n)):
            n += 1
        return n

    def _fetch(self, name: str, k: int, n: int) -> list[bytes]:
        """Fetch blocks ``k .. k+n-1`` in one ranged read, store them, return them."""
        data = self.inner.read_range(name, k * self.block, (k + n) * self.block)
        blocks = [data[i : i + self.block] for i in range(0, len(data), self.block)]
        for j, blk in enumerate(blocks):
            self._store(name, k + j, blk)
        with self._lock:
            self.misses += len(blocks)
        return blocks

    def _store(self, name: str, k: int, data: bytes) -> None:
        trailer = _TRAILER.pack(_MAGIC, crc32c(data, self._seed(name, k)), len(data))
        if not self._write(self._path(name, k), (data, trailer), "block"):
            return
        with self._lock:
            self._written += len(data) + _TRAILER.size
            sweep = self._written >= self._sweep_every
            if sweep:
                self._written = 0
        if sweep:
            self.evict()

    def _write(self, path: str, parts: tuple[bytes, ...], what: str) -> bool:
        """Write ``parts`` to ``path`` through a private name renamed into place (readers
        never see a partial file); False when the disk is full, or the folder was removed
        again as it was made anew: that costs the cache, never the read, the bytes are in hand.

        Raises:
            OSError: naming ``path``, for any other failure.
        """
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            try:
                _write_file(tmp, path, parts)
            except FileNotFoundError:  # its folder was removed (the cache cleared meanwhile)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                _write_file(tmp, path, parts)
        except OSError as exc:
            unlink_quietly(tmp)
            if exc.errno in (*FULL, errno.ENOENT):
                why = "was removed meanwhile" if exc.errno == errno.ENOENT else "is full"
                warnings.warn(f"cache folder {self._dir} {why}; {what} not cached", stacklevel=5)
                return False
            raise OSError(
                exc.errno, f"cannot write the node cache's {what} ({exc.strerror})", path
            ) from exc
        return True

    # -- eviction -------------------------------------------------------------------------
    def evict(self) -> int:
        """Delete least recently used blocks until the folder holds at most ``limit`` bytes
        (down to 90% of it): :func:`~wdstream.storage.cache_evict.sweep`. Returns how many
        bytes were freed; 0 when another process is sweeping the same folder."""
        return sweep(self.cache_dir, self.limit)


def _write_file(tmp: str, path: str, parts: tuple[bytes, ...]) -> None:
    """``parts`` written as ``tmp``, then renamed to ``path``."""
    with open(tmp, "wb") as f:
        for part in parts:
            f.write(part)
    os.replace(tmp, path)
