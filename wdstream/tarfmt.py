"""Plain POSIX (ustar) tar members, written deterministically.

A shard is a sequence of ``header (512 B) + data + zero padding to 512 B`` members, closed
by two zero blocks. Headers carry fixed metadata (mtime 0, uid/gid 0, mode 0644) so the
same samples always give byte-identical shards, which is what makes packs reproducible and
resumable. Readers never parse headers on the hot path: the sidecar index stores where
every member's data starts.
"""

from __future__ import annotations

import tarfile

__all__ = ["BLOCK", "END_OF_ARCHIVE", "member_bytes", "padded_size", "parse_header"]

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)


def padded_size(size: int) -> int:
    """Bytes a member's data occupies once padded to a whole tar block."""
    return (size + BLOCK - 1) // BLOCK * BLOCK


def member_bytes(name: str, data: bytes) -> bytes:
    """Return one complete tar member (header, data, padding) for ``name``.

    Raises:
        ValueError: if ``name`` does not fit a ustar header.
    """
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uname = info.gname = ""
    header = info.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")
    return header + data + b"\0" * (padded_size(len(data)) - len(data))


def parse_header(block: bytes) -> tuple[str, int] | None:
    """Return ``(name, size)`` of a ustar header block, or None at the end-of-archive block.

    Raises:
        ValueError: if the block is not a valid tar header.
    """
    if len(block) < BLOCK:
        raise ValueError(f"truncated tar header: {len(block)} of {BLOCK} bytes")
    if block[:BLOCK] == b"\0" * BLOCK:
        return None
    info = tarfile.TarInfo.frombuf(block[:BLOCK], encoding="utf-8", errors="strict")
    return info.name, info.size
