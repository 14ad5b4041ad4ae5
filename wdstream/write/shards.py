"""Assemble samples into tar shards and write them through a :class:`Store` in the background.

A shard is built in memory (it is bounded by ``--shard-size``), hashed, and handed to one
background thread that writes the provenance table (when asked for), the sidecar, then the
tar (each atomically, via ``store.writer``) and then calls ``on_commit`` -- all in shard
order, so the resume journal only ever names shards that are completely written. Once one
write fails, no later shard is written or committed: the journal never names a shard with a
gap before it. At most ``max_in_flight`` finished shards wait for that thread; tokenisation
keeps running while a shard uploads.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from wdstream.format.checksum import running_checksum, sample_checksum
from wdstream.format.entry import FORMAT_VERSION, ShardEntry
from wdstream.format.provenance import ShardProvenance, provenance_name
from wdstream.format.sample import SAMPLE_SUFFIXES, encode_sample
from wdstream.format.sidecar import ShardSidecar, sidecar_name
from wdstream.format.tar import BLOCK, END_OF_ARCHIVE, member_bytes, member_size
from wdstream.storage import Store

__all__ = [
    "ShardWriter",
    "doc_tokens_after",
    "parse_size",
    "sample_member",
    "sample_member_size",
    "shard_names",
    "starts_new_shard",
]

_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9,
          "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}  # fmt: skip


_WRITE_CHUNK = 8 << 20  # bytes per store write: large for object stores, bounded copies


def parse_size(text: str | int) -> int:
    """``"256MB"`` -> 256_000_000, ``"1GiB"`` -> 2**30, ``4096`` -> 4096.

    Raises:
        ValueError: for anything else.
    """
    if isinstance(text, int):
        return text
    s = text.strip().upper().replace(" ", "")
    num = s.rstrip("KMGIB")
    unit = s[len(num) :]
    try:
        value = float(num) * _UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 512KB, 256MB, 1GiB)") from None
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return int(value)


def shard_names(name: str, i: int) -> tuple[str, str]:
    """``(tar, sidecar)`` object names of shard ``i``."""
    tar = f"{name}-{i:06d}.tar"
    return tar, sidecar_name(tar)


def sample_member(index: int, data: bytes, suffix: str = SAMPLE_SUFFIXES[FORMAT_VERSION]) -> bytes:
    """The tar member of sample number ``index`` (global) holding the encoded ``data``."""
    return member_bytes(_sample_name(index, suffix), data)


def sample_member_size(
    index: int, data_size: int, suffix: str = SAMPLE_SUFFIXES[FORMAT_VERSION]
) -> int:
    """``len(sample_member(index, data))`` for ``data_size`` bytes of encoded sample."""
    return member_size(_sample_name(index, suffix), data_size)


def _sample_name(index: int, suffix: str) -> str:
    return f"{index:012d}{suffix}"


def starts_new_shard(
    samples: int, size: int, member: int, shard_bytes: int, shard_samples: int | None
) -> bool:
    """Whether a sample member of ``member`` bytes opens a new shard after ``samples`` of
    ``size`` bytes: the one cut rule, shared with engines that lay shards out ahead."""
    return samples > 0 and (
        size + member + len(END_OF_ARCHIVE) > shard_bytes
        or (shard_samples is not None and samples >= shard_samples)
    )


def doc_tokens_after(offset: int, doc_lens: Sequence[int], cont: bool) -> int:
    """Tokens of a sample's last document that are packed up to its end, given ``offset``:
    those of its first document packed before it (what provenance counts a piece from)."""
    last = int(doc_lens[-1])
    return offset + last if cont and len(doc_lens) == 1 else last


class ShardWriter:
    """Collects encoded samples into shards of at most ``shard_bytes`` / ``shard_samples``.

    Args:
        store: where shards go.
        name: shard name prefix.
        shard_bytes: tar size limit (header, data, padding and end marker included); a single
            sample larger than this gets a shard of its own.
        shard_samples: optional sample-count limit.
        first_shard, first_sample: numbering to continue from (resume).
        on_commit: called in the writer thread, in order, after each shard is written, with
            ``(entry, state)``: the index entry and the ``state`` passed to :meth:`add`
            with the shard's last sample.
        max_in_flight: finished shards allowed to wait for the background writer.
        version: format version to write (1 only to produce test data for old readers).
        provenance: the input file names; when given, every shard gets a provenance table
            (``NAME-NNNNNN.prov``, :mod:`wdstream.format.provenance`) and :meth:`add` needs
            each sample's ``starts``.
        first_doc: global number of the next document to start (resume).
        doc_offset: tokens of the open document already in earlier shards (resume inside
            a document).
    """

    def __init__(
        self,
        store: Store,
        name: str,
        shard_bytes: int,
        shard_samples: int | None = None,
        first_shard: int = 0,
        first_sample: int = 0,
        on_commit: Callable[[ShardEntry, Any], None] | None = None,
        max_in_flight: int = 2,
        version: int = FORMAT_VERSION,
        provenance: Sequence[str] | None = None,
        first_doc: int = 0,
        doc_offset: int = 0,
    ) -> None:
        if version not in SAMPLE_SUFFIXES:
            raise ValueError(
                f"format version must be one of {list(SAMPLE_SUFFIXES)}, got {version!r}"
            )
        self.store, self.name = store, name
        self.shard_bytes, self.shard_samples = shard_bytes, shard_samples
        self.next_shard, self.next_sample = first_shard, first_sample
        self.on_commit = on_commit
        self._members: list[bytes] = []
        self._offsets: list[int] = []
        self._sizes: list[int] = []
        self._tokens: list[int] = []
        self._crcs: list[int] | None = [] if version >= 2 else None
        self._runs: list[int] = []  # running CRC32C of the shard to each sample's data end
        self._run = 0  # running CRC32C of the shard's members so far
        self._suffix = SAMPLE_SUFFIXES[version]
        self._size = 0
        self._docs = 0
        self._state: Any = None
        self._inputs = provenance
        self._next_doc, self._doc_tokens = first_doc, doc_offset
        self._shard_doc = first_doc  # global number of the current shard's first document
        self._doc_files: list[int] = []
        self._doc_lines: list[int] = []
        self._sample_doc: list[int] = []
        self._sample_off: list[int] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="wdstream-shard-writer")
        self._futures: list[Future[None]] = []
        self._slots = threading.Semaphore(max_in_flight)
        self._failed: BaseException | None = None
        self.bytes_written = 0

    def add(
        self,
        tokens: np.ndarray,
        doc_lens: list[int],
        cont: bool,
        new_docs: int,
        state: Any,
        starts: Sequence[Any] = (),
        offset: int | None = None,
    ) -> None:
        """Append one sample; ``state`` is what the journal needs if the shard ends here;
        ``starts``: the input :class:`~wdstream.inputs.InputPosition` of each of the
        ``new_docs`` documents that start in it (used with ``provenance``); ``offset``: its
        first piece's token offset in its document when the sample builder knows it (best-fit rows,
        whose trailing padding piece is not a document), else counted here."""
        data = encode_sample(tokens, doc_lens, cont)
        member = sample_member(self.next_sample, data, self._suffix)
        if starts_new_shard(
            len(self._members), self._size, len(member), self.shard_bytes, self.shard_samples
        ):
            self._finish_shard()
        self._offsets.append(self._size + BLOCK)
        self._sizes.append(len(data))
        self._tokens.append(len(tokens))
        if self._crcs is not None:
            self._crcs.append(sample_checksum(data))
            view, data_end = memoryview(member), BLOCK + len(data)
            self._runs.append(running_checksum(view[:data_end], self._run))
            self._run = running_checksum(view[data_end:], self._runs[-1])
        self._members.append(member)
        self._size += len(member)
        self._docs += new_docs
        self._state = state
        self.next_sample += 1
        if self._inputs is not None:
            self._track(doc_lens, cont, new_docs, starts, offset)

    def _track(
        self,
        doc_lens: list[int],
        cont: bool,
        new_docs: int,
        starts: Sequence[Any],
        known: int | None,
    ) -> None:
        """Provenance of one sample: its first piece's document and offset, its new documents."""
        if len(starts) != new_docs:
            raise ValueError(f"{new_docs} documents start in the sample, got {len(starts)} starts")
        counted = self._doc_tokens if known is None else known
        first, offset = (self._next_doc - 1, counted) if cont else (self._next_doc, 0)
        self._sample_doc.append(first)
        self._sample_off.append(offset)
        for p in starts:  # InputPosition: (file, record, ...); lines are 1-based like messages
            self._doc_files.append(p[0])
            self._doc_lines.append(p[1] + 1)
        self._next_doc += new_docs
        self._doc_tokens = doc_tokens_after(offset, doc_lens, cont)

    def _finish_shard(self) -> None:
        tar_name, idx_name = shard_names(self.name, self.next_shard)
        self._members.append(END_OF_ARCHIVE)
        members = self._members
        sidecar = ShardSidecar(
            offsets=np.asarray(self._offsets, dtype=np.uint64),
            sizes=np.asarray(self._sizes, dtype=np.uint32),
            tokens=np.asarray(self._tokens, dtype=np.uint32),
            crc32c=None if self._crcs is None else np.asarray(self._crcs, dtype=np.uint32),
            crc32c_run=None if self._crcs is None else np.asarray(self._runs, dtype=np.uint32),
        ).to_bytes()
        prov = None
        if self._inputs is not None:
            prov = ShardProvenance.build(
                self._shard_doc, self._inputs, self._doc_files, self._doc_lines,
                self._sample_doc, self._sample_off,
            ).to_bytes()  # fmt: skip
            self._shard_doc = self._next_doc
            self._doc_files, self._doc_lines, self._sample_doc, self._sample_off = [], [], [], []
        entry = ShardEntry(
            name=tar_name,
            sidecar=idx_name,
            samples=len(self._sizes),
            tokens=int(sum(self._tokens)),
            documents=self._docs,
            bytes=self._size + len(END_OF_ARCHIVE),
            sha256="",
            sidecar_sha256=hashlib.sha256(sidecar).hexdigest(),
            provenance=None if prov is None else provenance_name(tar_name),
            provenance_sha256=None if prov is None else hashlib.sha256(prov).hexdigest(),
        )
        state = self._state
        self._members, self._offsets, self._sizes, self._tokens = [], [], [], []
        self._crcs = None if self._crcs is None else []
        self._runs, self._run = [], 0
        self._size = self._docs = 0
        self.next_shard += 1
        self._raise_failed()
        self._slots.acquire()
        self._futures.append(self._pool.submit(self._write, members, sidecar, prov, entry, state))

    def _write(
        self,
        members: list[bytes],
        sidecar: bytes,
        prov: bytes | None,
        entry: ShardEntry,
        state: Any,
    ) -> None:
        try:
            if self._failed is not None:
                # An earlier shard is missing: writing and committing this one would let the
                # journal skip past the gap (a rerun would then publish an index without it).
                raise RuntimeError(f"{entry.name} not written: an earlier shard failed") from (
                    self._failed
                )
            # Stream the members (no joined copy of the shard) and hash them on the way, off
            # the packing thread.
            if prov is not None and entry.provenance is not None:
                self.store.write_bytes(entry.provenance, prov)
            self.store.write_bytes(entry.sidecar, sidecar)
            h = hashlib.sha256()
            with self.store.writer(entry.name) as out:
                group: list[bytes] = []
                size = 0
                for i, m in enumerate(members):
                    group.append(m)
                    size += len(m)
                    if size >= _WRITE_CHUNK or i == len(members) - 1:
                        chunk = b"".join(group)
                        h.update(chunk)
                        out.write(chunk)
                        group, size = [], 0
            entry = ShardEntry(**{**entry.__dict__, "sha256": h.hexdigest()})
            self.bytes_written += entry.bytes
            if self.on_commit is not None:
                self.on_commit(entry, state)
        except BaseException as exc:
            if self._failed is None:
                self._failed = exc
            raise
        finally:
            self._slots.release()

    def _raise_failed(self) -> None:
        done = [f for f in self._futures if f.done()]
        self._futures = [f for f in self._futures if not f.done()]
        for f in done:
            f.result()  # re-raises a failed write here, in the packing thread

    def close(self) -> None:
        """Write the last, partly filled shard and wait for every write; re-raise failures."""
        try:
            if self._members:
                self._finish_shard()
            for f in self._futures:
                f.result()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def abort(self) -> None:
        """Stop without writing the partial shard (shards already queued still finish)."""
        self._members = []
        self._pool.shutdown(wait=True, cancel_futures=True)
