"""Per-sample checksums (format v2): CRC32C of each sample's msgpack bytes.

The writer stores one CRC32C per sample in the shard's sidecar; the reader recomputes it for
every sample it reads, on the hot path, and refuses a mismatch naming shard, sample and byte
offset. CRC32C was chosen over a cryptographic hash and over xxhash because it detects every
1- and 2-bit error and every burst up to 32 bits in messages of our size, runs in hardware
(carry-less multiplication: PCLMULQDQ/VPCLMULQDQ on x86, PMULL on ARM). The sums come from
the ``fastcrc`` package (its CRC-32/ISCSI is CRC32C; Rust, on the ``crc-fast`` crate): 0.40 us
per cached 8 KB sample with the Python call, against 0.66-0.74 us for the ``crc32c`` package,
and about twice its rate on long runs (``docs/FORMAT.md``). Whole-shard integrity is still the
sha256 in ``index.json`` (checked by ``wdstream verify``).

Sidecars also store the shard's running CRC32C at the end of every sample's data, so a reader
checks a run of samples it read with one call over the run's bytes (the GIL released once:
``fastcrc`` releases it for 16 KiB and more), not one call per sample: against a busy
training loop in the same process, per-sample hand-offs between threads cost more than the
sums. The per-sample values then only name the bad sample once a run fails. A torch worker
of several, which copies scattered samples of each window, instead checks each sample
against its per-sample value right after copying it (``read/order/window_data.py``,
``copy_rows``), in its own thread, on cached bytes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from fastcrc.crc32 import iscsi as crc32c

from wdstream.format.sidecar import ShardSidecar

__all__ = [
    "CHECKSUM_NAME",
    "crc32c",
    "Corruption",
    "find_corruption",
    "first_bad_sample",
    "running_checksum",
    "sample_checksum",
    "spot_check",
]

CHECKSUM_NAME = "crc32c"
# crc32c(data, seed=None) -> int: CRC32C of a bytes-like ``data``, continued from ``seed`` (the
# running value of the bytes before it). Holds the GIL below 16 KiB, releases it above.


def sample_checksum(data: bytes | memoryview) -> int:
    """CRC32C of one sample's msgpack bytes."""
    return crc32c(data)


def running_checksum(data: bytes | memoryview, seed: int = 0) -> int:
    """CRC32C of ``data`` continued from ``seed``, the running value of the bytes before it."""
    return crc32c(data, seed)


class Corruption(NamedTuple):
    """Where a read's bytes fail their checksums: ``sample`` (None: between samples, in the
    tar headers or padding) and the shard byte offset where the bad bytes begin."""

    sample: int | None
    byte: int


def find_corruption(
    buf: memoryview,
    begin: int,
    sidecar: ShardSidecar,
    start: int,
    stop: int,
    check: np.ndarray | None = None,
) -> Corruption | None:
    """Check samples ``[start, stop)`` read into ``buf`` (shard bytes from ``begin``).

    With running checksums in the sidecar each run of consecutive samples (of those
    ``check`` marks; all by default) is one CRC call, and ``buf`` must begin where
    :meth:`ShardSidecar.run_check` says for ``start``; the per-sample values only name the
    culprit. Without them each sample is checked (only those ``check`` marks).

    Returns:
        None when every checked byte matches, else where the corruption is.
    """
    if sidecar.crc32c is None:
        return None
    if sidecar.crc32c_run is not None:
        failed = _first_failed_run(buf, begin, sidecar, start, stop, check)
        if failed is None:
            return None
        start, stop, check = failed[0], failed[1], None  # name the culprit inside the run
    offs = sidecar.offsets[start:stop].astype(np.int64) - begin
    sizes, crcs = sidecar.sizes[start:stop], sidecar.crc32c[start:stop]
    which = None if check is None else np.flatnonzero(check)
    if which is not None:
        offs, sizes, crcs = offs[which], sizes[which], crcs[which]
    bad = first_bad_sample(buf, offs, sizes, crcs)
    if bad is not None:
        at = start + (bad if which is None else int(which[bad]))
        return Corruption(at, int(sidecar.offsets[at]))
    if sidecar.crc32c_run is not None:
        return Corruption(None, sidecar.run_check(start, stop)[0])
    return None


def _first_failed_run(
    buf: memoryview,
    begin: int,
    sidecar: ShardSidecar,
    start: int,
    stop: int,
    check: np.ndarray | None,
) -> tuple[int, int] | None:
    """The first run of consecutive samples (those ``check`` marks, all by default) of
    ``[start, stop)`` whose bytes fail the sidecar's running checksums, as ``(first, stop)``."""
    if check is None:  # one run: scalars, no arrays (a 0-worker window read, ~10 us less)
        lo, hi, seed, want = sidecar.run_check(start, stop)
        return None if crc32c(buf[lo - begin : hi - begin], seed) == want else (start, stop)
    # Where the mask flips: run starts and ends alternate.
    flips = np.flatnonzero(np.diff(check, prepend=False, append=False)) + start
    firsts, stops = flips[0::2], flips[1::2]
    ends, values = sidecar.run_bounds
    runs = zip(
        (ends[firsts] - begin).tolist(), (ends[stops] - begin).tolist(),
        values[firsts].tolist(), values[stops].tolist(), strict=True,
    )  # fmt: skip
    for k, (lo, hi, seed, want) in enumerate(runs):
        # One call per run; the GIL is released for long runs.
        if crc32c(buf[lo:hi], seed) != want:
            return int(firsts[k]), int(stops[k])
    return None


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
    spans = zip(offsets.tolist(), sizes.tolist(), expected.tolist(), strict=True)
    for i, (o, n, want) in enumerate(spans):
        if crc32c(data[o : o + n]) != want:
            return i
    return None


def spot_check(
    buf: memoryview, begin: int, sidecar: ShardSidecar, start: int, stop: int
) -> Corruption | None:
    """Check only the first and the last sample of ``[start, stop)`` read into ``buf``
    (shard bytes from ``begin``): the check that stays on with ``checksums=False``. Two
    samples per ranged read cost little, and a server (or a cache) that answers with another
    object's bytes, or a sidecar that is not its shard's, fails it: the bytes at both ends
    would have to match this shard's checksums by chance."""
    if sidecar.crc32c is None or stop <= start:
        return None
    for at in sorted({start, stop - 1}):
        o, n = int(sidecar.offsets[at]) - begin, int(sidecar.sizes[at])
        if crc32c(buf[o : o + n]) != int(sidecar.crc32c[at]):
            return Corruption(at, int(sidecar.offsets[at]))
    return None
