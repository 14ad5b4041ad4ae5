"""Per-shard sidecar index: where each sample's bytes start, so a reader can seek.

For shard ``NAME.tar`` the writer stores ``NAME.idx``, a msgpack map::

    {"version": 2, "offsets": <bin uint64[n]>, "sizes": <bin uint32[n]>,
     "tokens": <bin uint32[n]>, "crc32c": <bin uint32[n]>, "crc32c_run": <bin uint32[n]>}

``offsets[k]`` is the byte offset of sample k's *data* (just after its tar header),
``sizes[k]`` its msgpack length, ``tokens[k]`` its token count and ``crc32c[k]`` the checksum
of its msgpack bytes (version 1 sidecars have no ``crc32c``: their samples read unchecked).
``crc32c_run[k]`` is the running CRC32C of the shard's bytes from byte 0 to the end of sample
k's data, headers and padding included: a run of samples is then checked with one CRC call
over its bytes, continued from the previous sample's running value (:meth:`run_check`).
Sidecars written before it existed lack the key; their samples are checked one by one. Reading samples
``[a, b)`` is then one ranged read of ``offsets[a] .. offsets[b-1] + sizes[b-1]``: O(1) in the
position, which is what makes the resumable cursor cheap. It is ~16 bytes per sample, kept
out of ``index.json`` so the dataset index stays small with millions of samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import msgpack
import numpy as np

from wdstream.format.tar import BLOCK, padded_size, parse_header

__all__ = ["SIDECAR_VERSION", "ShardSidecar", "scan_tar", "sidecar_name"]

SIDECAR_VERSION = 2
_READABLE_VERSIONS = (1, 2)


def sidecar_name(tar_name: str) -> str:
    """The sidecar object name of shard ``tar_name``: ``x-000001.tar`` -> ``x-000001.idx``."""
    return (tar_name[: -len(".tar")] if tar_name.endswith(".tar") else tar_name) + ".idx"


@dataclass(frozen=True)
class ShardSidecar:
    """Offsets, sizes and token counts of every sample in one shard."""

    offsets: np.ndarray  # uint64, data start of each member
    sizes: np.ndarray  # uint32, msgpack bytes of each member
    tokens: np.ndarray  # uint32, token count of each sample
    crc32c: np.ndarray | None = None  # uint32, checksum of each sample's bytes (None: v1)
    crc32c_run: np.ndarray | None = None  # uint32, running checksum of the shard to each end

    def __len__(self) -> int:
        return len(self.offsets)

    def byte_range(self, start: int, stop: int) -> tuple[int, int]:
        """Byte span ``[begin, end)`` covering the data of samples ``[start, stop)``."""
        if not 0 <= start < stop <= len(self):
            raise IndexError(f"sample range [{start}, {stop}) outside shard of {len(self)}")
        return int(self.offsets[start]), int(self.offsets[stop - 1]) + int(self.sizes[stop - 1])

    @cached_property
    def run_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ends, values)``, int64[n + 1]: for each ``k``, where sample ``k - 1``'s data
        ends and the running CRC32C there (0 and 0 for ``k = 0``), so samples ``[a, b)``
        check as ``crc32c(shard[ends[a]:ends[b]], values[a]) == values[b]`` (vectorised
        :meth:`run_check`, made once per sidecar).

        Raises:
            ValueError: if this sidecar has no running checksums.
        """
        if self.crc32c_run is None:
            raise ValueError("sidecar has no running checksums")
        ends = self.offsets.astype(np.int64) + self.sizes
        zero = np.zeros(1, dtype=np.int64)
        return np.concatenate([zero, ends]), np.concatenate([zero, self.crc32c_run])

    def run_check(self, start: int, stop: int) -> tuple[int, int, int, int]:
        """``(begin, end, seed, expected)`` to check samples ``[start, stop)`` in one call:
        ``crc32c(shard[begin:end], seed) == expected``, where ``[begin, end)`` runs from the
        end of sample ``start - 1``'s data (byte 0 for the first sample) to the end of sample
        ``stop - 1``'s, so it covers the samples' headers and padding too.

        Raises:
            ValueError: if this sidecar has no running checksums.
        """
        ends, values = self.run_bounds
        _, end = self.byte_range(start, stop)
        return int(ends[start]), end, int(values[start]), int(values[stop])

    def to_bytes(self) -> bytes:
        """Serialise to the msgpack sidecar format (version 2 with checksums, else 1)."""
        obj = {
            "version": 1 if self.crc32c is None else SIDECAR_VERSION,
            "offsets": self.offsets.astype("<u8").tobytes(),
            "sizes": self.sizes.astype("<u4").tobytes(),
            "tokens": self.tokens.astype("<u4").tobytes(),
        }
        if self.crc32c is not None:
            obj["crc32c"] = self.crc32c.astype("<u4").tobytes()
            if self.crc32c_run is not None:
                obj["crc32c_run"] = self.crc32c_run.astype("<u4").tobytes()
        return msgpack.packb(obj)

    def check_layout(self, shard_bytes: int | None = None) -> None:
        """Check that the entries describe samples a tar can hold, in order, without overlap.

        Every sample's data must start after its own 512-byte header, after the end of the
        previous sample's padded data, and end before the shard's end-of-archive marker. This
        catches an offset pointing at another sample (which would silently duplicate data)
        even where no sha256 is at hand to compare the sidecar with.

        Raises:
            ValueError: naming the first offending sample and its offset.
        """
        n = len(self)
        if n == 0:
            return
        offs = self.offsets.astype(np.int64)
        ends = offs + ((self.sizes.astype(np.int64) + BLOCK - 1) // BLOCK) * BLOCK
        floor = np.concatenate([[BLOCK], ends[:-1] + BLOCK])
        bad = np.flatnonzero(offs < floor)
        if len(bad):
            k = int(bad[0])
            raise ValueError(
                f"sidecar entry {k}: data offset {int(offs[k])} overlaps the previous sample "
                f"or its header (must be >= {int(floor[k])})"
            )
        if shard_bytes is not None and int(ends[-1]) + 2 * BLOCK > shard_bytes:
            raise ValueError(
                f"sidecar entry {n - 1}: sample ends at byte {int(ends[-1])}, past the end of "
                f"the {shard_bytes}-byte shard"
            )

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardSidecar:
        """Parse sidecar bytes.

        Raises:
            ValueError: if the bytes are not a sidecar of a known version.
        """
        try:
            obj = msgpack.unpackb(data, raw=False)
            version = obj["version"]
            if version not in _READABLE_VERSIONS or isinstance(version, bool):
                raise ValueError(f"unsupported sidecar version {version!r}")
            offsets = np.frombuffer(obj["offsets"], dtype="<u8")
            sizes = np.frombuffer(obj["sizes"], dtype="<u4")
            tokens = np.frombuffer(obj["tokens"], dtype="<u4")
            crcs = np.frombuffer(obj["crc32c"], dtype="<u4") if version >= 2 else None
            run = obj.get("crc32c_run") if version >= 2 else None
            runs = None if run is None else np.frombuffer(run, dtype="<u4")
        except (msgpack.UnpackException, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a wdstream sidecar index: {exc}") from exc
        lengths = {len(a) for a in (offsets, sizes, tokens, crcs, runs) if a is not None}
        if len(lengths) != 1:
            raise ValueError("sidecar arrays have different lengths")
        return cls(offsets=offsets, sizes=sizes, tokens=tokens, crc32c=crcs, crc32c_run=runs)


def scan_tar(data: bytes | memoryview) -> list[tuple[str, int, int]]:
    """List ``(name, data_offset, size)`` of every member of an in-memory tar.

    Used by ``verify`` and by readers of shards that have no sidecar.

    Raises:
        ValueError: naming the byte offset of the first bad header.
    """
    members: list[tuple[str, int, int]] = []
    pos = 0
    while pos < len(data):
        try:
            header = parse_header(bytes(data[pos : pos + BLOCK]))
        except ValueError as exc:
            raise ValueError(f"bad tar header at byte {pos}: {exc}") from exc
        if header is None:
            return members
        name, size = header
        if pos + BLOCK + size > len(data):
            raise ValueError(f"member {name!r} at byte {pos} runs past the end of the shard")
        members.append((name, pos + BLOCK, size))
        pos += BLOCK + padded_size(size)
    raise ValueError(f"tar ends at byte {pos} without an end-of-archive marker")
