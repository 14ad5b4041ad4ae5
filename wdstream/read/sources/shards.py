"""Read packed shards through a :class:`Store`: index, sidecars, samples, documents.

Small building blocks shared by ``inspect``/``stats``/``verify``, :func:`documents` and the
reader. Every decoding failure raises :class:`~wdstream.errors.CorruptShardError` naming the
shard and the byte offset::

    store = open_store("data/")
    index = read_index(store)
    sidecar = read_sidecar(store, index.shards[0])
    for sample in read_samples(store, index.shards[0].name, sidecar, 10, 20):
        sample.tokens, sample.doc_lens, sample.cont
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import numpy as np

from wdstream.errors import CorruptShardError, IndexValidationError
from wdstream.format.checksum import sample_checksum
from wdstream.format.index import INDEX_NAME, DatasetIndex, ShardEntry
from wdstream.format.sample import SAMPLE_SUFFIXES, Sample, decode_sample
from wdstream.format.sidecar import ShardSidecar, scan_tar
from wdstream.read.sources.index_open import read_index
from wdstream.storage import Store, open_store

_SAMPLE_MEMBER_SUFFIXES = tuple(SAMPLE_SUFFIXES.values())

__all__ = [
    "decode_span",
    "documents",
    "drop_short_last_sample",
    "infer_mode",
    "iter_samples",
    "parse_sidecar",
    "read_index",
    "read_samples",
    "read_sidecar",
    "sibling_index",
    "sidecar_from_tar",
    "store_sha256",
]


def sibling_index(
    urls: list[tuple[str, str]], store_of: Callable[[str], Store]
) -> tuple[DatasetIndex, list[ShardEntry]] | None:
    """The ``index.json`` beside shards opened by their URLs, so a dataset opened by a glob,
    brace pattern or list keeps its meaning (mode, padding and EOS ids, tokenizer): the
    one index of the folders ``urls`` lie in and each URL's entry in it (whose sidecar
    sha256 then vouches for the shard: one of another pack is refused when its sidecar is
    read), or None when none of the folders has one.

    Raises:
        IndexValidationError: a shard not listed in the index beside it, shards with an index beside
            some but not others, or indexes of different meaning (rows, targets, tokens):
            such shards are refused rather than read under a guessed meaning.
    """
    found: dict[str, DatasetIndex | None] = {}
    for root in dict.fromkeys(r for r, _ in urls):
        store = store_of(root)
        found[root] = read_index(store) if store.exists(INDEX_NAME) else None
    have = [root for root, index in found.items() if index is not None]
    if not have:
        return None
    if len(have) < len(found):
        bare = next(root for root, index in found.items() if index is None)
        raise IndexValidationError(
            f"shards of {have[0]} have an index.json beside them and shards of {bare} have "
            "none: their meaning (mode, padding, EOS) cannot be told for all; open the "
            "dataset roots, or keep every folder's index.json"
        )
    first = found[have[0]]
    assert first is not None
    for root in have:
        index = found[root]
        assert index is not None
        if _meaning(index) != _meaning(first):
            raise IndexValidationError(
                f"the index.json of {root} and of {have[0]} describe datasets of different "
                f"meaning ({_meaning(index)} vs {_meaning(first)}); read them as a mixture"
            )
    listed = {root: {s.name: s for s in index.shards} for root, index in found.items() if index}
    entries = []
    for root, name in urls:
        entry = listed[root].get(name)
        if entry is None:
            raise IndexValidationError(
                f"{root}/{name} is not a shard of the index.json beside it; open the dataset "
                "root, or give only shards that index lists"
            )
        entries.append(entry)
    return first, entries


def _meaning(index: DatasetIndex) -> tuple[object, ...]:
    """What a reader learns from an index besides its shards: rows and targets."""
    return (index.mode, index.seq_len, index.sample_tokens, index.eos_id, index.bos_id,
            index.pad_id, index.dtype, index.tokenizer.get("name"))  # fmt: skip


def infer_mode(counts: list[np.ndarray]) -> tuple[str, int | None]:
    """``(mode, sample_tokens)`` of shards without an index, from their samples' token
    ``counts``: equal-length samples (but a last short one) mean concat packing, which lets
    the plan count tokens arithmetically (a best-fit pack's padded rows look the same:
    shards alone are read as plain rows, see docs/READER.md); anything else is docs."""
    lens = np.concatenate(counts) if counts else np.zeros(0)
    st = int(lens[0]) if len(lens) else 0
    concat = len(lens) > 0 and bool(np.all(lens[:-1] == st)) and 0 < lens[-1] <= st
    return ("concat", st) if concat else ("docs", None)


def drop_short_last_sample(
    samples: np.ndarray, tokens: np.ndarray, mode: str, sample_tokens: int | None
) -> None:
    """Leave a short final concat sample out of the per-shard counts ``samples`` and
    ``tokens`` (in place): see :class:`~wdstream.read.sources.packed.ShardSource`."""
    st = sample_tokens
    if mode != "concat" or not st or not len(samples):
        return
    last = len(samples) - 1
    short = int(tokens[last]) - (int(samples[last]) - 1) * st
    if 0 < short < st:
        samples[last] -= 1
        tokens[last] -= short


def parse_sidecar(
    store: Store, name: str, entry: ShardEntry | None = None, version: int | None = None
) -> tuple[ShardSidecar, str]:
    """Read, parse and check sidecar ``name``; returns it and the sha256 of its bytes (what
    it commits to, for a dataset's identity without an index).

    Every sidecar must describe samples in tar order without overlap. With the shard's
    ``index.json`` entry it must also have the entry's sha256 (so any flipped bit is caught,
    cheaply: sidecars are ~20 bytes per sample), sample and token counts, and fit in the
    entry's byte size. In a dataset of format ``version`` 2 it must carry checksums (a v1
    sidecar there would silently turn the per-sample checks off).

    Raises:
        FileNotFoundError: if there is no such sidecar.
        CorruptShardError: if it does not parse, is inconsistent, or disagrees with
            ``entry`` (names the sidecar and what disagrees).
    """
    where = store.child_url(name)
    known = entry.sidecar_sha256 if entry is not None else None
    data = store.read_by_digest(name, known) if known else store.read(name)  # node cache
    got = hashlib.sha256(data).hexdigest()
    if entry is not None and entry.sidecar_sha256:
        if got != entry.sidecar_sha256:
            raise CorruptShardError(
                f"{where}: sha256 {got[:16]}... differs from index.json's "
                f"{entry.sidecar_sha256[:16]}... (sidecar corrupt or from another pack)"
            )
    try:
        sidecar = ShardSidecar.from_bytes(data)
        sidecar.check_layout(entry.bytes if entry is not None else None)
    except ValueError as exc:
        raise CorruptShardError(f"{where}: {exc}") from exc
    if version is not None and version >= 2 and sidecar.crc32c is None:
        raise CorruptShardError(
            f"{where}: a version-1 sidecar (no per-sample checksums) in a version-{version} dataset"
        )
    if entry is not None:
        if len(sidecar) != entry.samples:
            raise CorruptShardError(
                f"{where}: {len(sidecar)} samples, index.json says {entry.samples}"
            )
        tokens = int(sidecar.tokens.sum(dtype=np.int64))
        if tokens != entry.tokens:
            raise CorruptShardError(f"{where}: {tokens} tokens, index.json says {entry.tokens}")
    return sidecar, got


def read_sidecar(store: Store, shard: ShardEntry, version: int | None = None) -> ShardSidecar:
    """Read the sidecar of an indexed ``shard``, checked against its index entry.

    Raises:
        CorruptShardError: if the sidecar does not parse or disagrees with the index entry.
    """
    return parse_sidecar(store, shard.sidecar, shard, version)[0]


def sidecar_from_tar(data: bytes | memoryview, where: str = "shard") -> ShardSidecar:
    """Build a sidecar by scanning a whole tar (for shards that have none).

    Token counts are left 0 (they need decoding); offsets and sizes are exact.

    Raises:
        CorruptShardError: naming ``where`` and the offset of the first bad header.
    """
    try:
        members = scan_tar(data)
    except ValueError as exc:
        raise CorruptShardError(f"{where}: {exc}") from exc
    members = [m for m in members if m[0].endswith(_SAMPLE_MEMBER_SUFFIXES)]
    return ShardSidecar(
        offsets=np.asarray([m[1] for m in members], dtype=np.uint64),
        sizes=np.asarray([m[2] for m in members], dtype=np.uint32),
        tokens=np.zeros(len(members), dtype=np.uint32),
    )


def read_samples(
    store: Store, name: str, sidecar: ShardSidecar, start: int, stop: int
) -> Iterator[Sample]:
    """Decode samples ``[start, stop)`` of shard ``name`` with one ranged read.

    Raises:
        CorruptShardError: naming the shard, sample and byte offset of a sample that does
            not decode, is cut short, or whose token count disagrees with the sidecar.
    """
    if start >= stop:
        return
    begin, end = sidecar.byte_range(start, stop)
    data = memoryview(store.read_range(name, begin, end))
    yield from decode_span(data, begin, sidecar, start, stop, store.child_url(name))


def decode_span(
    data: memoryview,
    begin: int,
    sidecar: ShardSidecar,
    start: int,
    stop: int,
    where: str,
    verify: bool = True,
) -> Iterator[Sample]:
    """Decode samples ``[start, stop)`` from ``data``, the shard's bytes from offset ``begin``.

    ``verify``: check each sample's CRC32C (when the sidecar has them); False where the
    caller has verified the bytes already or was asked not to (``checksums=False``).

    Raises:
        CorruptShardError: naming ``where``, the sample and its byte offset, as
            :func:`read_samples` does.
    """
    for k in range(start, stop):
        off, size = int(sidecar.offsets[k]), int(sidecar.sizes[k])
        at = f"{where}: sample {k} at byte {off}"
        if off + size - begin > len(data):
            raise CorruptShardError(f"{at}: shard ends early (truncated?)")
        raw = data[off - begin : off - begin + size]
        if verify and sidecar.crc32c is not None and sample_checksum(raw) != int(sidecar.crc32c[k]):
            raise CorruptShardError(f"{at}: checksum mismatch (corrupt bytes)")
        try:
            sample = decode_sample(raw)
        except ValueError as exc:
            raise CorruptShardError(f"{at}: {exc}") from exc
        expected = int(sidecar.tokens[k])
        if expected and len(sample.tokens) != expected:
            raise CorruptShardError(f"{at}: {len(sample.tokens)} tokens, sidecar says {expected}")
        yield sample


def iter_samples(
    store: Store, index: DatasetIndex, chunk: int = 256
) -> Iterator[tuple[ShardEntry, int, Sample]]:
    """Every sample of the dataset in order, as ``(shard, index in shard, sample)``."""
    for shard in index.shards:
        sidecar = read_sidecar(store, shard, index.version)
        for a in range(0, len(sidecar), chunk):
            b = min(a + chunk, len(sidecar))
            for k, sample in enumerate(read_samples(store, shard.name, sidecar, a, b), start=a):
                yield shard, k, sample


def documents(root: str | Store) -> Iterator[np.ndarray]:
    """Yield every document's token ids (EOS included when packed with it), in dataset order.

    Documents split across samples (and shards) are joined using ``cont``; each document is
    yielded exactly once. In a best-fit dataset the order is the rows' (not the input's) and
    each sample's last piece, its padding, is not a document.

    Raises:
        CorruptShardError: if a sample does not decode or a continuation has nothing to continue.
    """
    store = root if isinstance(root, Store) else open_store(root)
    index = read_index(store)
    parts: list[np.ndarray] = []
    for shard, k, sample in iter_samples(store, index):
        pos = 0
        for j, n in enumerate(index.document_pieces(sample.doc_lens)):
            piece = sample.tokens[pos : pos + n]
            pos += n
            if j == 0 and sample.cont:
                if not parts:
                    raise CorruptShardError(
                        f"{store.child_url(shard.name)}: sample {k} continues a document, "
                        "but no document precedes it"
                    )
                parts.append(piece)
                continue
            if parts:
                yield np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
            parts = [piece]
    if parts:
        yield np.concatenate(parts) if len(parts) > 1 else parts[0].copy()


def store_sha256(store: Store, name: str) -> str:
    """sha256 of an object, streamed in large chunks."""
    h = hashlib.sha256()
    for chunk in store.iter_chunks(name):
        h.update(chunk)
    return h.hexdigest()
