"""``index.json``: the dataset-level description a reader plans an epoch from.

Written last by the packer (its presence means the dataset is complete). Holds the format
version, the tokenizer (name, backend, hash of its ranks), special ids, the on-disk dtype,
the packing mode and sample length, and per shard its name, sidecar name, counts, size and
sha256. Everything a reader needs to split an epoch into equal parts across ranks and
workers is here, so planning needs no communication and no shard reads.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_NAME",
    "JOURNAL_NAME",
    "READABLE_VERSIONS",
    "DatasetIndex",
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


@dataclass(frozen=True)
class DatasetIndex:
    """The parsed ``index.json`` of a packed dataset."""

    tokenizer: dict[str, Any]  # name, backend, ranks_sha256, n_vocab
    eos_id: int | None
    bos_id: int | None
    dtype: str  # on-disk token dtype: "uint16" or "uint32"
    mode: str  # "concat" (fixed-length samples) or "docs" (one document per sample)
    seq_len: int | None  # training rows the samples were sized for (concat mode)
    sample_tokens: int | None  # tokens in every sample but the dataset's last (concat mode)
    shards: tuple[ShardEntry, ...]
    stats: dict[str, Any] = field(default_factory=dict)  # skipped lines, empty docs, ...
    checksum: str | None = None  # per-sample checksum in the sidecars ("crc32c"; None in v1)
    version: int = FORMAT_VERSION
    format: str = FORMAT_NAME

    @property
    def total_samples(self) -> int:
        """Samples over all shards."""
        return sum(s.samples for s in self.shards)

    @property
    def total_tokens(self) -> int:
        """Tokens over all shards."""
        return sum(s.tokens for s in self.shards)

    @property
    def total_documents(self) -> int:
        """Documents over all shards."""
        return sum(s.documents for s in self.shards)

    def to_json(self) -> str:
        """Serialise with sorted keys, so equal datasets give byte-identical indexes."""
        obj = asdict(self)
        obj["shards"] = [asdict(s) for s in self.shards]
        if self.version < 2:
            del obj["checksum"]  # v1 indexes have no such key
        return json.dumps(obj, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "index.json") -> DatasetIndex:
        """Parse ``index.json`` text.

        Raises:
            ValueError: naming ``where`` if it is not a wdstream index of a known version.
        """
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
            raise ValueError(f"{where}: not a wdstream index")
        if obj.get("version") not in READABLE_VERSIONS or isinstance(obj.get("version"), bool):
            raise ValueError(
                f"{where}: format version {obj.get('version')!r}, this wdstream reads "
                f"versions {', '.join(map(str, READABLE_VERSIONS))}"
            )
        try:
            shards = tuple(ShardEntry(**s) for s in obj.pop("shards"))
            return cls(shards=shards, **obj)
        except TypeError as exc:
            raise ValueError(f"{where}: malformed index ({exc})") from exc
