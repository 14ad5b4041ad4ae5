"""Byte flips at chosen places of a shard, judged by a decoder of our own (session 44).

Session 43 moved the local token reads' ids pass before the CRC32C pass
(``IdLimit.admits_samples`` run by a ``look`` hook inside ``CheckedRanges.read``, on bytes not
verified yet; docs/READER.md "Checks at 0 workers"). This class flips one byte (XOR with a
random non-zero mask) at places picked per sample: its tar header, its msgpack head (map,
keys, dtype, the tokens' bin length), its token bytes (low and high bytes, so ids leave the
vocabulary), its last byte, the tar padding after it, and the sidecar (offsets, sizes, CRCs),
in a copy of a dataset of 40 samples a shard, and reads one epoch at 0 and 2 workers
(``on_corrupt`` raise) and at 0 workers with ``on_corrupt="mask"``.

Oracles outside the code under test: the pristine copy's rows; tarfile + msgpack over the
flipped shard against the pristine one (which samples' bytes differ); a CRC32C written here
(table-driven, Castagnoli) that says whether the sidecar's checksum of each such sample still
holds (it must not: the flip is covered). Outcomes: every sample whose bytes the flip changed
is read in an epoch, so with ``raise`` the read must fail with a CorruptShardError naming the
shard and that sample's byte offset (a flip between samples: any CorruptShardError naming the
shard; in the sidecar: any WdstreamError naming it, or the clean rows); with ``mask`` every
row must be the clean run's or masked whole, and a changed sample must mask at least one.
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from faultlib.common import Attempt, labelled, read_rows
from wdstream.errors import CorruptShardError, WdstreamError
from wdstream.format.sidecar import ShardSidecar
from wdstream.testing import write_synthetic_dataset


def _table() -> list[int]:
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return out


_CRC = _table()


def crc32c(data: bytes) -> int:
    """CRC32C (Castagnoli), bit-reflected, as RFC 3720 defines it."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _members(tar: bytes) -> list[tuple[int, int, bytes]]:
    """(offset_data, size, data) of each member, by tarfile."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return [(m.offset_data, m.size, t.extractfile(m).read()) for m in t.getmembers()]  # type: ignore[union-attr]


def _places(tar: bytes, sidecar_size: int, rng: random.Random) -> list[tuple[str, str, int]]:
    """(what, file kind, byte) for the flips of one shard."""
    out: list[tuple[str, str, int]] = []
    members = _members(tar)
    for k in sorted(rng.sample(range(len(members)), 6)):
        off, size, data = members[k]
        tokens = data.find(b"tokens")  # the key, then the bin header and the ids
        out += [
            (f"sample {k} tar header", "tar", off - 512 + rng.randrange(512)),
            (f"sample {k} msgpack head", "tar", off + rng.randrange(max(1, tokens))),
            (f"sample {k} bin length", "tar", off + tokens + 7 + rng.randrange(2)),
            (f"sample {k} token low byte", "tar", off + size - 4 * rng.randrange(1, 33)),
            (f"sample {k} token high byte", "tar", off + size - 4 * rng.randrange(1, 33) + 3),
            (f"sample {k} last byte", "tar", off + size - 1),
            (f"sample {k} padding", "tar", off + size + rng.randrange(max(1, -size % 512))),
        ]
    out += [("sidecar", "idx", rng.randrange(sidecar_size)) for _ in range(6)]
    return out


def _changed(clean: bytes, bad: bytes, sidecar: ShardSidecar) -> list[int]:
    """Samples (by the sidecar's offsets) whose bytes differ, each checked with our CRC32C
    to fail its sidecar checksum (else the flip is not covered: raised as an error here)."""
    out = []
    for k, (off, size) in enumerate(
        zip(sidecar.offsets.tolist(), sidecar.sizes.tolist(), strict=True)
    ):
        if clean[off : off + size] != bad[off : off + size]:
            assert sidecar.crc32c is not None
            if crc32c(bad[off : off + size]) == int(sidecar.crc32c[k]):
                raise AssertionError(f"sample {k}: the flip keeps its CRC32C")
            msgpack.unpackb(clean[off : off + size])  # the clean one decodes
            out.append(k)
    return out


def _judge(dst: Path, name: str, changed: list[int], offsets: list[int], kind: str,
           want: np.ndarray, read: dict[str, Any]) -> str:  # fmt: skip
    mask = read.get("on_corrupt") == "mask"
    try:
        got = read_rows(str(dst), **read)
    except WdstreamError as exc:
        said = str(exc)
        if mask:  # more rows masked than max_quarantined allows: refused (READER.md)
            clear = "max_quarantined" in said and (kind == "idx" or changed)
            return "clear error" if clear else f"crash: on_corrupt='mask' raised: {said}"[:300]
        if kind == "idx":
            return "clear error" if name.split(".")[0] in said else f"crash: {said}"[:300]
        if not isinstance(exc, CorruptShardError) or name not in said:
            return f"crash: not a CorruptShardError naming {name}: {type(exc).__name__}: {said}"[
                :300
            ]
        if changed:
            m = re.search(r"at byte (\d+)", said)
            if m is None or int(m.group(1)) not in [offsets[k] for k in changed]:
                return f"crash: names no changed sample ({changed}): {said}"[:300]
        return "clear error"
    if got.shape != want.shape:
        return f"silent wrong: {got.shape} rows, clean {want.shape}"
    same = (got == want).all(axis=1)
    masked = (got[:, :-1] == 0).all(axis=1) & (got[:, -1] == -100)
    if not (same | masked).all():
        return "silent wrong: a row neither the clean run's nor masked whole"
    if changed and not masked.any():
        return f"silent wrong: samples {changed} changed, read, and neither refused nor masked"
    if kind == "tar" and not changed and not mask and masked.any():
        return "silent wrong: rows masked without on_corrupt='mask'"
    return "handled"


def _flip(root: Path, dst: Path, shard: dict, what: str, kind: str, at: int, xor: int,
          read: dict[str, Any], want: np.ndarray) -> Attempt:  # fmt: skip
    """The attempt: byte ``at`` of the shard's ``kind`` file XORed with ``xor`` in a copy."""
    name = shard["name"] if kind == "tar" else shard["sidecar"]

    def attempt() -> str:
        tar = (root / shard["name"]).read_bytes()
        sidecar = ShardSidecar.from_bytes((root / shard["sidecar"]).read_bytes())
        shutil.copytree(root, dst)
        data = bytearray((dst / name).read_bytes())
        data[at] ^= xor
        (dst / name).write_bytes(bytes(data))
        changed = _changed(tar, bytes(data), sidecar) if kind == "tar" else []
        offsets = sidecar.offsets.tolist()
        how = f"{read['num_workers']} workers, {read.get('on_corrupt', 'raise')}"
        label = f"{what} (byte {at} ^ {xor:#x}, {how})"
        return labelled(label, _judge(dst, name, changed, offsets, kind, want, read))

    return attempt


def flips_decoded(work: Path, scale: float) -> Iterator[Attempt]:
    root = work / "flips-decoded-clean"
    if not root.exists():
        lens = [33 * k for k in (1, 2, 3, 5, 7, 2)] * 10  # 200 full samples: none short
        write_synthetic_dataset(str(root), doc_lens=lens, sample_tokens=33, samples_per_shard=40)
    shards = json.loads((root / "index.json").read_text())["shards"]
    base: dict[str, Any] = dict(seq_len=32, batch_size=2, shuffle=True, seed=3, epochs=1)
    want = read_rows(str(root), **base, num_workers=0)
    # Every sample is one row, and an epoch reads every row (the oracle counts on it).
    assert len(want) == sum(s["samples"] for s in shards), (len(want), shards)
    rng = random.Random(4343)
    reads = [dict(base, num_workers=0), dict(base, num_workers=2),
             dict(base, num_workers=0, on_corrupt="mask")]  # fmt: skip
    n = 0
    for shard in rng.sample(shards, max(1, min(len(shards), round(3 * scale)))):
        tar = (root / shard["name"]).read_bytes()
        size = (root / shard["sidecar"]).stat().st_size
        for what, kind, at in _places(tar, size, rng):
            n += 1
            read, xor, dst = (
                reads[n % len(reads)],
                rng.randrange(1, 256),
                work / f"flips-decoded-{n}",
            )
            yield _flip(root, dst, shard, what, kind, at, xor, read, want)
