"""A shard's entry in ``index.json``, and the format's names and version.

Apart from :mod:`wdstream.format.index` (which re-exports them) so that what only writes
shards (:class:`~wdstream.write.shards.ShardWriter`, a Ray worker's shard task) does not
import ``index.json``'s parser and validation rules: a Ray worker process imports its task
code afresh for every pack (docs/RAY.md, "Session 46").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_NAME",
    "JOURNAL_NAME",
    "READABLE_VERSIONS",
    "ShardEntry",
]

FORMAT_NAME = "wdstream"
FORMAT_VERSION = 2  # v2: per-sample CRC32C in the sidecars, members named KEY.mp
READABLE_VERSIONS = (1, 2)
INDEX_NAME = "index.json"
# Present at a dataset root only while a pack runs there or after one was interrupted.
JOURNAL_NAME = ".wdstream-pack.json"


@dataclass(frozen=True)
class ShardEntry:
    """One shard as recorded in ``index.json``."""

    name: str  # tar file name, relative to the dataset root
    sidecar: str  # sidecar index file name, relative to the dataset root
    samples: int
    tokens: int
    documents: int  # documents whose first token is in this shard
    bytes: int
    sha256: str
    sidecar_sha256: str
    # Optional: the shard's provenance table (``NAME-NNNNNN.prov``) and its sha256; absent in
    # datasets packed before provenance (they read the same, without ``explain``).
    provenance: str | None = None
    provenance_sha256: str | None = None
