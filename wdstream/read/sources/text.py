"""Raw-text files as a reader source: documents with a seekable position, no index needed.

A :class:`TextSource` lists text files (JSON Lines, plain or ``.gz``/``.zst``; ``.txt``, one
document per file; or webdataset tar shards whose samples hold ``KEY.txt`` or ``KEY.json``)
and reads their documents from a *position*, so a reader cursor can point into them::

    source = TextSource("corpus/part-{000..015}.jsonl.zst", tokenizer="cl100k_base")
    for text, byte, record in source.docs(3, byte=0, record=0):
        ...    # byte: where the record starts in the (decompressed) file; record: line / sample

Positions are byte offsets into the decompressed file (the line start for JSON Lines, the
first header of a sample for tar) plus the record number (line or sample index), which
only serves error messages. Plain files seek directly; ``.gz``/``.zst`` files have to be
decompressed from their start to reach an offset (O(file), not O(epoch)). Every byte goes
through :mod:`wdstream.storage`, so local paths, ``s3://`` and ``http(s)://`` work alike
(globs only for local paths; brace patterns everywhere).

Bad JSON lines raise :class:`~wdstream.errors.InputError` naming file and line (the check is
:mod:`wdstream.inputs`' own), or are skipped with ``on_error="skip"``.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Iterator, Sequence
from typing import IO, Any

import braceexpand

from wdstream.errors import InputError
from wdstream.format.tar import BLOCK, padded_size
from wdstream.inputs import DocumentReader, decompressed, expand_inputs
from wdstream.inputs.lines import (
    DEFAULT_MAX_RECORD_BYTES,
    LongLine,
    bounded_lines,
    read_bounded,
)
from wdstream.read.sources.identity import DatasetIdentity, text_identity
from wdstream.read.sources.stores import StoreCache
from wdstream.storage import Store, split_url
from wdstream.tokenizers import Tokenizer, load_tokenizer

__all__ = ["TextSource"]

_BUFFER = 1 << 20
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst")


class _StoreRaw(io.RawIOBase):
    """A seekable read-only file over one object of a :class:`Store` (ranged reads)."""

    def __init__(self, store: Store, name: str) -> None:
        self._store, self._name, self._pos = store, name, 0
        self._size: int | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            if self._size is None:
                self._size = self._store.size(self._name)
            offset += self._size
        elif whence == io.SEEK_CUR:
            offset += self._pos
        self._pos = offset
        return offset

    def readinto(self, buf: Any) -> int:
        data = self._store.read_range(self._name, self._pos, self._pos + len(buf))
        n = len(data)
        memoryview(buf)[:n] = data
        self._pos += n
        return n


def _compression(name: str) -> str | None:
    if name.endswith((".gz", ".tgz")):
        return "gz"
    return "zst" if name.endswith(".zst") else None


def _kind(name: str) -> str:
    if name.endswith(_TAR_SUFFIXES):
        return "tar"
    base = name.removesuffix(".gz").removesuffix(".zst")
    return "txt" if base.endswith(".txt") else "jsonl"


def _split_key(name: str) -> tuple[str, str]:
    """webdataset's sample key and extension: ``a/b.c.txt`` -> ``("a/b", "c.txt")``."""
    folder, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    return posixpath.join(folder, stem) if folder else stem, ext.lower() if dot else ""


class TextSource:
    """Text files read as documents from a byte position; the tokenizer that turns them to ids.

    Args:
        source: a file URL or local path, a brace pattern / glob, or a list of them.
        tokenizer: tokenizer name or ``.tiktoken`` path (or a loaded :class:`Tokenizer`).
        text_key: JSON field holding the text (dots reach into nested objects).
        on_error: ``"raise"`` (InputError naming file and line) or ``"skip"`` bad records.
        eos: append the tokenizer's ``<|endoftext|>`` id to every document.
        max_record_bytes: the longest record (a line, a ``.txt`` file, a tar member's text);
            a longer one is a bad record (``on_error``), never held past this many bytes.
        store_options: passed to :func:`wdstream.storage.open_store`.

    Raises:
        InputError: if a local pattern matches nothing or a file is missing.
        ValueError: for an empty source or a bad option.
    """

    def __init__(
        self,
        source: str | Sequence[str],
        tokenizer: str | Tokenizer,
        text_key: str = "text",
        on_error: str = "raise",
        eos: bool = True,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        **store_options: Any,
    ) -> None:
        self._stores = StoreCache(**store_options)
        # inputs' record parser (JSON, dotted key, record limit, error wording, skip counting).
        self._parser = DocumentReader(
            files=[], text_key=text_key, on_error=on_error, max_record_bytes=max_record_bytes
        )
        self.text_key, self.on_error = text_key, on_error
        self.tokenizer = (
            tokenizer
            if isinstance(tokenizer, Tokenizer)
            else load_tokenizer(tokenizer, backend="tiktoken")
        )
        self.eos_id = self.tokenizer.eos_id if eos else None
        if eos and self.eos_id is None:
            raise ValueError(f"tokenizer {self.tokenizer.name!r} has no <|endoftext|>; eos=False")
        items = [source] if isinstance(source, str) else list(source)
        urls: list[str] = []
        for item in items:
            if "://" in item:
                urls.extend(braceexpand.braceexpand(item))
            else:
                urls.extend(f.path for f in expand_inputs([item]))
        if not urls:
            raise ValueError(f"no input files in {source!r}")
        self.urls = [split_url(u) for u in urls]
        self.kinds = [_kind(n) for _, n in self.urls]
        sizes = [self._store(r).size(n) for r, n in self.urls]
        # By name (not folder) and size: no index commits to the bytes of raw text.
        old = [[f"{r}/{n}", s] for (r, n), s in zip(self.urls, sizes, strict=True)]
        files = [(posixpath.basename(n), s) for (_, n), s in zip(self.urls, sizes, strict=True)]
        self.identity: DatasetIdentity = text_identity(files, old)

    def __len__(self) -> int:
        return len(self.urls)

    def tokenizer_id(self) -> str:
        """Name plus ranks hash: what a saved state must match."""
        return f"{self.tokenizer.name}:{self.tokenizer.ranks_sha256[:16]}:eos={self.eos_id}"

    def _store(self, root: str) -> Store:
        return self._stores.get(root)

    def close(self) -> None:
        """Release the stores' cached file handles / connections."""
        self._stores.close()

    def where(self, f: int) -> str:
        """URL of file ``f``, for messages."""
        return self._stores.url(*self.urls[f])

    def _open(self, f: int, byte: int) -> tuple[IO[bytes], IO[bytes]]:
        """``(decompressed bytes of file f from offset byte, the raw stream)``: close both.

        Compressed data cut short raises EOFError where it ends (a zstd frame that never
        finishes included), so a truncated file is an error, never a silently short file.
        """
        root, name = self.urls[f]
        raw: IO[bytes] = io.BufferedReader(_StoreRaw(self._store(root), name), _BUFFER)
        if _compression(name) is None:
            raw.seek(byte)
            return raw, raw
        dec = decompressed(raw, name)
        # No index into compressed data: reaching ``byte`` means decompressing up to it.
        left = byte
        while left:
            got = len(dec.read(min(left, 4 * _BUFFER)))
            if not got:
                raise InputError(f"{self.where(f)}: shorter than the saved offset {byte}")
            left -= got
        return dec, raw

    def docs(self, f: int, byte: int = 0, record: int = 0) -> Iterator[tuple[str, int, int]]:
        """Yield ``(text, byte, record)`` for every non-empty document of file ``f`` from there.

        Raises:
            InputError: for a bad record (``on_error="raise"``) or an unreadable file, naming
                the file and the line (or tar member / byte offset).
        """
        name = self.where(f)
        try:
            fh, raw = self._open(f, byte)
        except (OSError, EOFError) as exc:
            raise InputError(f"{name}: cannot open ({exc})") from exc
        try:
            kind = self.kinds[f]
            if kind == "jsonl":
                yield from self._jsonl(fh, name, byte, record)
            elif kind == "tar":
                yield from self._tar(fh, name, byte, record)
            elif byte == 0:
                data = read_bounded(fh, self._parser.max_record_bytes, self.on_error == "skip")
                if isinstance(data, LongLine):
                    self._parser.long_record(f"{name}:1", data)
                    return
                text = self._parser.decode_bytes(data, name, 0)
                if text:
                    yield text, 0, 0
        except GeneratorExit:
            # Closed before its end (a loader left mid-epoch), also at interpreter exit, when
            # module globals such as ``tarfile`` may already be None: matched first, so the
            # clause below is never evaluated then ("Exception ignored ... TarError").
            raise
        except (OSError, EOFError, tarfile.TarError) as exc:
            raise InputError(f"{name}: read failed ({exc})") from exc
        finally:
            fh.close()
            raw.close()

    def _jsonl(
        self, fh: IO[bytes], name: str, byte: int, record: int
    ) -> Iterator[tuple[str, int, int]]:
        p = self._parser
        for raw in bounded_lines(fh, p.max_record_bytes, self.on_error == "skip"):
            at, rec = byte, record
            byte += raw.size if isinstance(raw, LongLine) else len(raw)
            record += 1
            if isinstance(raw, LongLine):
                p.long_record(f"{name}:{record}", raw)
                continue
            try:
                line = p.decode_bytes(raw, name, at)
            except InputError:
                if self.on_error == "raise":
                    raise
                p.bad += 1
                continue
            if not line.strip():
                continue
            text = p.text_of(line, name, record)
            if text:
                yield text, at, rec

    def _tar(
        self, fh: IO[bytes], name: str, byte: int, record: int
    ) -> Iterator[tuple[str, int, int]]:
        """Samples grouped by key (webdataset's rule); the text is ``.txt``, else ``.json``."""
        key: str | None = None
        start = byte
        found: dict[str, bytes] = {}
        for member, at, data in self._members(fh, name, byte):
            k, ext = _split_key(member)
            if k != key:
                if key is not None:
                    text = self._sample_text(found, name, key, record)
                    if text:
                        yield text, start, record
                    record += 1
                key, start, found = k, at, {}
            if data is not None:
                found[ext] = data
        if key is not None:
            text = self._sample_text(found, name, key, record)
            if text:
                yield text, start, record

    def _sample_text(self, found: dict[str, bytes], name: str, key: str, record: int) -> str | None:
        where = f"{name} member {key!r} (sample {record})"
        if "txt" in found:
            try:
                return found["txt"].decode("utf-8")
            except UnicodeDecodeError as exc:
                if self.on_error == "raise":
                    raise InputError(f"{where}: invalid UTF-8 at byte {exc.start}") from exc
                self._parser.bad += 1
                return None
        if "json" in found:
            return self._parser.text_of(found["json"].decode("utf-8", "replace"), where, 1)
        return None

    def _members(
        self, fh: IO[bytes], name: str, byte: int
    ) -> Iterator[tuple[str, int, bytes | None]]:
        """``(name, header offset, data)`` of the regular members from ``byte``.

        ``data`` is None for members that hold no text (skipped, seeking when the file is
        not compressed).
        """
        pos = byte
        long_name: str | None = None
        first = pos
        seek = _compression(name) is None
        while True:
            block = fh.read(BLOCK)
            if len(block) < BLOCK or block == b"\0" * BLOCK:
                return
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.TarError as exc:
                raise InputError(f"{name}: bad tar header at byte {pos}: {exc}") from exc
            if long_name is None:
                first = pos
            size = padded_size(info.size)
            pos += BLOCK + size
            meta = info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE)
            regular = info.type in (tarfile.REGTYPE, tarfile.AREGTYPE)
            member = long_name or info.name
            text = regular and _split_key(member)[1] in ("txt", "json")
            if (meta or text) and info.size > self._parser.max_record_bytes:
                if meta:
                    raise InputError(f"{name}: tar header at byte {pos - BLOCK - size} too long")
                # raised (on_error="raise"), or counted and the member passed over unread
                self._parser.long_record(f"{name} member {member!r} at byte {first}", info.size)
                text = False
            if meta or text:
                body = fh.read(size)
                if len(body) < size:
                    raise InputError(f"{name}: member {member!r} at byte {first} is truncated")
                data: bytes | None = body[: info.size]
            else:
                data = None
                if seek:
                    fh.seek(size, io.SEEK_CUR)
                else:
                    while size:
                        size -= len(fh.read(min(size, _BUFFER))) or size
            if info.type == tarfile.GNUTYPE_LONGNAME:
                assert data is not None
                long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            elif info.type == tarfile.XHDTYPE:
                assert data is not None
                long_name = _pax_path(data) or long_name
            else:
                if regular:
                    yield member, first, data
                long_name = None


def _pax_path(data: bytes) -> str | None:
    """The ``path`` record of a pax extended header, if any."""
    for rec in data.split(b"\n"):
        _, _, kv = rec.partition(b" ")
        if kv.startswith(b"path="):
            return kv[5:].decode("utf-8", "surrogateescape")
    return None
