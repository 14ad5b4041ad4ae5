"""The shard size of a pack that was given none: chosen from the input's size when known.

A reader that splits a dataset by shard (webdataset's ``split_by_node``/``split_by_worker``,
and every tool that copies or verifies shard by shard) needs at least ranks x workers shards;
a fixed 256 MB default gave every pack under ~256 MB one shard. The rule (``docs/PACK.md``)::

    shard bytes = clamp(ceil(input bytes / 128), 1 MB, 256 MB)    input size known (files)
    shard bytes = 256 MB                                           unknown (stdin, records)

Text packs to about half its size in uint16 ids (4 bytes of text a token, 2 bytes an id),
so 128 parts of the input make about 64 shards, enough for 8 ranks x 8 workers, until the
input reaches 32 GB; past that shards are 256 MB and their number grows with the input.
Compressed inputs (``.gz``, ``.zst``) are counted by their compressed size, which gives
smaller shards and more of them, never fewer. An explicit ``shard_size`` always wins.

The size is a pure function of the input files' sizes, which the resume journal's
fingerprint already records, and the chosen size is itself in the fingerprint
(``shard_bytes``): a resumed pack writes shards of the same size.
"""

from __future__ import annotations

from wdstream.write.shards import parse_size

__all__ = [
    "AUTO_SHARD_PARTS",
    "DEFAULT_SHARD_BYTES",
    "MIN_AUTO_SHARD_BYTES",
    "choose_shard_bytes",
]

DEFAULT_SHARD_BYTES = 256_000_000  # "256MB": the largest chosen size, and the unknown-size one
MIN_AUTO_SHARD_BYTES = 1_000_000  # below this a shard costs more in requests than it holds
AUTO_SHARD_PARTS = 128  # parts of the input one shard holds at most (about 64 shards of ids)


def choose_shard_bytes(shard_size: str | int | None, input_bytes: int | None) -> int:
    """The maximum tar size of a pack's shards.

    Args:
        shard_size: what the caller asked for (``"256MB"``, ``"1GiB"``, bytes), or None:
            choose from ``input_bytes``.
        input_bytes: the inputs' total size on disk, or None where it is unknown (stdin,
            records from Python).

    Raises:
        ValueError: ``shard_size`` is not a size (see :func:`parse_size`).
    """
    if shard_size is not None:
        return parse_size(shard_size)
    if input_bytes is None:
        return DEFAULT_SHARD_BYTES
    share = -(-input_bytes // AUTO_SHARD_PARTS)
    return min(max(share, MIN_AUTO_SHARD_BYTES), DEFAULT_SHARD_BYTES)
