"""Per-shard sidecar index: where each sample's bytes start, so a reader can seek.

For shard ``NAME.tar`` the writer stores ``NAME.idx``, a msgpack map::

    {"version": 1, "offsets": <bin uint64[n]>, "sizes": <bin uint32[n]>, "tokens": <bin uint32[n]>}

``offsets[k]`` is the byte offset of sample k's *data* (just after its tar header),
``sizes[k]`` its msgpack length and ``tokens[k]`` its token count. Reading samples
``[a, b)`` is then one ranged read of ``offsets[a] .. offsets[b-1] + sizes[b-1]``: O(1) in the
position, which is what makes the resumable cursor cheap. It is ~16 bytes per sample, kept
out of ``index.json`` so the dataset index stays small with millions of samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np

from wdstream.format.tar import BLOCK, padded_size, parse_header

__all__ = ["SIDECAR_VERSION", "ShardSidecar", "scan_tar"]

SIDECAR_VERSION = 1


@dataclass(frozen=True)
class ShardSidecar:
    """Offsets, sizes and token counts of every sample in one shard."""

    offsets: np.ndarray  # uint64, data start of each member
    sizes: np.ndarray  # uint32, msgpack bytes of each member
    tokens: np.ndarray  # uint32, token count of each sample

    def __len__(self) -> int:
        return len(self.offsets)

    def byte_range(self, start: int, stop: int) -> tuple[int, int]:
        """Byte span ``[begin, end)`` covering the data of samples ``[start, stop)``."""
        if not 0 <= start < stop <= len(self):
            raise IndexError(f"sample range [{start}, {stop}) outside shard of {len(self)}")
        return int(self.offsets[start]), int(self.offsets[stop - 1]) + int(self.sizes[stop - 1])

    def to_bytes(self) -> bytes:
        """Serialise to the msgpack sidecar format."""
        return msgpack.packb(
            {
                "version": SIDECAR_VERSION,
                "offsets": self.offsets.astype("<u8").tobytes(),
                "sizes": self.sizes.astype("<u4").tobytes(),
                "tokens": self.tokens.astype("<u4").tobytes(),
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardSidecar:
        """Parse sidecar bytes.

        Raises:
            ValueError: if the bytes are not a sidecar of a known version.
        """
        try:
            obj = msgpack.unpackb(data, raw=False)
            if obj["version"] != SIDECAR_VERSION:
                raise ValueError(f"unsupported sidecar version {obj['version']!r}")
            offsets = np.frombuffer(obj["offsets"], dtype="<u8")
            sizes = np.frombuffer(obj["sizes"], dtype="<u4")
            tokens = np.frombuffer(obj["tokens"], dtype="<u4")
        except (msgpack.UnpackException, KeyError, TypeError) as exc:
            raise ValueError(f"not a wdstream sidecar index: {exc!r}") from exc
        if not len(offsets) == len(sizes) == len(tokens):
            raise ValueError("sidecar arrays have different lengths")
        return cls(offsets=offsets, sizes=sizes, tokens=tokens)


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
