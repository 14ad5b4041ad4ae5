"""What a packed shard's reader says about damaged bytes, and how it reads a shard that has
no sidecar: the wording of checksum failures (shard, sample, byte offset, the node cache's
blocks), and a sidecar rebuilt from the tar itself."""

from __future__ import annotations

import hashlib

import numpy as np

from wdstream.errors import CorruptShardError
from wdstream.format.checksum import Corruption
from wdstream.format.sample import Sample, decode_sample
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.sources.shards import sidecar_from_tar

__all__ = ["corruption_message", "decoded", "scanned_sidecar"]


def corruption_message(where: str, bad: Corruption, cached: list[str]) -> str:
    """The error for bytes of shard ``where`` that failed their checksums; ``cached``: the
    node cache's block files they were read from (dropped), which are then named as the
    suspects."""
    via = f"; read through the node cache, blocks {', '.join(cached)} (dropped)" if cached else ""
    if bad.sample is None:
        return (
            f"{where}: bytes from {bad.byte} between samples (tar headers or "
            f"padding) fail the running checksum (corrupt bytes{via}; `wdstream verify` "
            "scans the whole shard)"
        )
    return (
        f"{where}: sample {bad.sample} at byte {bad.byte}: checksum mismatch (corrupt bytes{via})"
    )


def decoded(where: str, data: bytes | memoryview, offset: int) -> Sample:
    """The sample in ``data`` (at byte ``offset`` of shard ``where``).

    Raises:
        CorruptShardError: the bytes are not a sample, naming the shard and offset.
    """
    try:
        return decode_sample(data)
    except ValueError as exc:
        raise CorruptShardError(f"{where}: sample at byte {offset}: {exc}") from exc


def scanned_sidecar(data: bytes, where: str) -> tuple[ShardSidecar, str]:
    """A sidecar for a shard that has none, built by reading its whole tar ``data`` once;
    returns it and the tar's sha256."""
    found = sidecar_from_tar(data, where)
    spans = zip(found.offsets.tolist(), found.sizes.tolist(), strict=True)
    ntok = [len(decoded(where, data[o : o + n], o).tokens) for o, n in spans]
    sha = hashlib.sha256(data).hexdigest()
    return ShardSidecar(found.offsets, found.sizes, np.array(ntok, dtype="<u4")), sha
