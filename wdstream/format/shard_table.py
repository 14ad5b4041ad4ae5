"""The shard table (``index.shards``): every shard's counts and hashes as fixed-width columns.

``index.json`` lists every shard as a JSON object (~430 bytes a shard); at 1,000,000 shards
that is 430 MB that every rank would fetch and every process would parse into ~1 KB of
Python objects a shard. The table holds the same facts as little-endian fixed-width
columns, ~100 bytes a shard, that a reader memory-maps: the node's processes share its
pages, and no process turns a column into Python objects (``docs/FORMAT.md``, "The shard
table")::

    header    64 bytes: magic "WDSHARDS", version, flags, shard count n, name prefix
              length, CRC32C of everything after the header, names section length
    prefix    the name rule's NAME (UTF-8, padded to 8 bytes): shard i is NAME-{i:06d}.tar
    counts    samples, tokens, documents, bytes: 4 columns of uint64[n]
    hashes    sha256, sidecar_sha256[, provenance_sha256]: columns of 32 bytes x n
    names     (only when the names follow no rule) per name key: uint64[n + 1] offsets,
              then the UTF-8 names joined, padded to 8 bytes

``index.json`` commits to the table by its length and sha256 (``shard_table``), so a reader
trusts it exactly as much as the JSON; the CRC32C lets a process that maps a file another
process already checked (a torch worker, a second rank on the node) re-check it for ~1 ms
per 10 MB without hashing it again.
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from wdstream.errors import IndexValidationError
from wdstream.format.checksum import crc32c

__all__ = ["TABLE_NAME", "TABLE_VERSION", "ShardRows", "build_table"]

TABLE_NAME = "index.shards"
TABLE_VERSION = 1
MAGIC = b"WDSHARDS"
_HEADER = struct.Struct("<8sIIQIIQ24x")  # magic version flags n prefix crc names_bytes
_PROVENANCE = 1  # flag: provenance columns present
_LISTED = 2  # flag: names listed (else NAME-{i:06d} from the prefix)
COUNTS = ("samples", "tokens", "documents", "bytes")
_HASHES = ("sha256", "sidecar_sha256", "provenance_sha256")
_SUFFIX = {"name": ".tar", "sidecar": ".idx", "provenance": ".prov"}
_MAX_SHARDS = 1 << 40


def _pad8(n: int) -> int:
    return -n % 8


def build_table(entries: Sequence[Any]) -> bytes:
    """The table of ``entries`` (objects with :class:`~wdstream.format.index.ShardEntry`'s
    attributes, in shard order): the bytes a pack writes as ``index.shards``."""
    n = len(entries)
    provenance = n > 0 and all(e.provenance is not None for e in entries)
    names = {k: [getattr(e, k) for e in entries] for k in (*_SUFFIX,) if k != "provenance"}
    if provenance:
        names["provenance"] = [e.provenance for e in entries]
    prefix = _name_rule(names)
    parts: list[bytes] = []
    if prefix is not None:
        raw = prefix.encode()
        parts.append(raw + bytes(_pad8(len(raw))))
    for key in COUNTS:
        parts.append(np.array([getattr(e, key) for e in entries], dtype="<u8").tobytes())
    for key in _HASHES[: 3 if provenance else 2]:
        parts.append(bytes.fromhex("".join(getattr(e, key) for e in entries)))
    names_bytes = 0
    if prefix is None:
        for column in names.values():
            blob = "".join(column).encode()
            lengths = [len(s.encode()) for s in column]
            offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype("<u8")
            section = offsets.tobytes() + blob + bytes(_pad8(len(blob)))
            parts.append(section)
            names_bytes += len(section)
    body = b"".join(parts)
    flags = (_PROVENANCE if provenance else 0) | (_LISTED if prefix is None else 0)
    prefix_len = 0 if prefix is None else len(prefix.encode())
    header = _HEADER.pack(MAGIC, TABLE_VERSION, flags, n, prefix_len, crc32c(body), names_bytes)
    return header + body


def _name_rule(names: dict[str, list[str]]) -> str | None:
    """NAME when shard i of every name key is ``NAME-{i:06d}`` and the key's suffix (the
    packer's names), else None."""
    first = names["name"][0] if names["name"] else ""
    if not first.endswith("-000000.tar"):
        return None
    prefix = first[: -len("-000000.tar")]
    for key, column in names.items():
        form = prefix.replace("%", "%%") + "-%06d" + _SUFFIX[key]
        if column != [form % i for i in range(len(column))]:
            return None
    return prefix


class ShardRows(Sequence[dict[str, Any]]):
    """A shard table read from its bytes (usually a read-only memory map): columns as
    numpy views of the bytes, rows and names made only when asked for.

    Raises (on construction):
        IndexValidationError: the bytes are not a table of this version, its sizes do not
            add up, or its CRC32C fails (naming ``where``).
    """

    def __init__(self, data: Any, where: str, check_crc: bool = True) -> None:
        self.where = where
        self.data = data
        view = memoryview(data)
        self.size = len(view)
        if self.size < _HEADER.size:
            raise self._error(f"{self.size} bytes, shorter than the {_HEADER.size}-byte header")
        magic, version, flags, n, prefix_len, crc, names_bytes = _HEADER.unpack_from(view)
        if magic != MAGIC:
            raise self._error(f"not a shard table (magic {magic!r}, expected {MAGIC!r})")
        if version != TABLE_VERSION or flags & ~(_PROVENANCE | _LISTED):
            raise self._error(
                f"table version {version} (flags {flags}); this wdstream reads version "
                f"{TABLE_VERSION}"
            )
        if not 0 < n < _MAX_SHARDS or bool(flags & _LISTED) == bool(prefix_len):
            raise self._error(f"{n} shards with a name prefix of {prefix_len} bytes")
        self.n = n
        self.provenance = bool(flags & _PROVENANCE)
        at = _HEADER.size
        self.prefix: str | None = None
        if prefix_len:
            try:
                self.prefix = bytes(view[at : at + prefix_len]).decode()
            except UnicodeDecodeError:
                raise self._error("its name prefix is not UTF-8") from None
            at += prefix_len + _pad8(prefix_len)
        hashes = 3 if self.provenance else 2
        expected = at + n * (8 * len(COUNTS) + 32 * hashes) + names_bytes
        if self.size != expected:
            raise self._error(f"{self.size} bytes, its header says {expected}")
        self._crc = crc
        if check_crc:
            self.verify_crc()
        self.counts: dict[str, np.ndarray] = {}
        self._starts: dict[str, int] = {}  # where each fixed-width column begins
        for key in COUNTS:
            self._starts[key] = at
            self.counts[key] = np.frombuffer(data, dtype="<u8", count=n, offset=at)
            at += 8 * n
        self.hashes: dict[str, np.ndarray] = {}
        for key in _HASHES[:hashes]:
            self._starts[key] = at
            self.hashes[key] = np.frombuffer(data, dtype=np.uint8, count=32 * n, offset=at)
            at += 32 * n
        self._names: dict[str, tuple[np.ndarray, memoryview]] = {}
        if self.prefix is None:
            for key in _SUFFIX:
                if key == "provenance" and not self.provenance:
                    continue
                offsets = np.frombuffer(data, dtype="<u8", count=n + 1, offset=at)
                at += 8 * (n + 1)
                end = int(offsets[-1])
                if end > self.size - at or (offsets[1:] < offsets[:-1]).any():  # as uint64
                    raise self._error(f"its {key} offsets run past the names")
                self._names[key] = (offsets, view[at : at + end])
                at += end + _pad8(end)
            if at != self.size:
                raise self._error(f"its names end at byte {at} of {self.size}")

    def verify_crc(self) -> None:
        """Raise unless everything after the header has the header's CRC32C (a table
        parsed without the check, then vouched for by its sha256, is checked here)."""
        if crc32c(memoryview(self.data)[_HEADER.size :]) != self._crc:
            raise self._error("its CRC32C does not match its bytes (damaged)")

    def _error(self, problem: str) -> IndexValidationError:
        return IndexValidationError(f"{self.where}: {problem}")

    def __len__(self) -> int:
        return self.n

    def name(self, key: str, i: int) -> str | None:
        """Shard ``i``'s value of name key ``key`` (``name``, ``sidecar``, ``provenance``)."""
        if key == "provenance" and not self.provenance:
            return None
        if self.prefix is not None:
            return f"{self.prefix}-{i:06d}{_SUFFIX[key]}"
        offsets, blob = self._names[key]
        try:
            return bytes(blob[int(offsets[i]) : int(offsets[i + 1])]).decode()
        except UnicodeDecodeError:
            raise self._error(f"shards[{i}].{key} is not UTF-8") from None

    def hex_column(self, key: str) -> list[str | None]:
        """Every shard's hash ``key`` as hex, in one pass over the column."""
        column = self.hashes.get(key)
        if column is None:
            return [None] * self.n
        text = binascii.hexlify(column.tobytes()).decode()
        return [text[64 * i : 64 * i + 64] for i in range(self.n)]

    def name_column(self, key: str) -> list[str | None]:
        """Every shard's value of name key ``key``."""
        return [self.name(key, i) for i in range(self.n)]

    def cell(self, start: int, size: int) -> bytes:
        """``size`` bytes of the table from byte ``start`` (a subclass reading a file may
        read them without touching the map: see ``MappedRows``)."""
        return bytes(memoryview(self.data)[start : start + size])

    def row(self, i: int) -> dict[str, Any]:
        """Shard ``i`` as the dict ``index.json`` lists (without absent provenance keys):
        7 small reads of fixed-width cells, through :meth:`cell`."""
        row: dict[str, Any] = {"name": self.name("name", i), "sidecar": self.name("sidecar", i)}
        for key in COUNTS:
            row[key] = int.from_bytes(self.cell(self._starts[key] + 8 * i, 8), "little")
        for key in _HASHES:
            if key in self.hashes:
                row[key] = self.cell(self._starts[key] + 32 * i, 32).hex()
        if self.provenance:
            row["provenance"] = self.name("provenance", i)
        return row

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(i, slice):
            return [self.row(k) for k in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.row(i % self.n)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return map(self.row, range(self.n))
