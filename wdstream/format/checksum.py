"""Per-sample checksums (format v2): CRC32C of each sample's msgpack bytes.

The writer stores one CRC32C per sample in the shard's sidecar; the reader recomputes it for
every sample it reads, on the hot path, and refuses a mismatch naming shard, sample and byte
offset. CRC32C was chosen over a cryptographic hash and over xxhash because it detects every
1- and 2-bit error and every burst up to 32 bits in messages of our size, runs in hardware
(SSE4.2 / ARMv8 CRC instructions, ~1 us per 8 KB sample including the Python call here) and
the ``crc32c`` package is a small, well-kept C extension. Whole-shard integrity is still the
sha256 in ``index.json`` (checked by ``wdstream verify``).
"""

from __future__ import annotations

import crc32c
import numpy as np

__all__ = ["CHECKSUM_NAME", "first_bad_sample", "sample_checksum"]

CHECKSUM_NAME = "crc32c"


def sample_checksum(data: bytes | memoryview) -> int:
    """CRC32C of one sample's msgpack bytes."""
    return int(crc32c.crc32c(data))


def first_bad_sample(
    data: memoryview, offsets: np.ndarray, sizes: np.ndarray, expected: np.ndarray
) -> int | None:
    """Index of the first sample whose bytes do not match its stored checksum, else None.

    Args:
        data: a buffer holding the samples.
        offsets: each sample's start in ``data``.
        sizes: each sample's length.
        expected: each sample's stored CRC32C.
    """
    crc = crc32c.crc32c
    spans = zip(offsets.tolist(), sizes.tolist(), expected.tolist(), strict=True)
    for i, (o, n, want) in enumerate(spans):
        # The GIL is released during each sum (mode 1), so a read-ahead thread checking a
        # window runs beside the training loop instead of stalling it.
        if crc(data[o : o + n], 0, 1) != want:
            return i
    return None
