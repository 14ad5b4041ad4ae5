"""Input documents for ``pack``: expand paths/globs/braces, read records, track the position.

Every document comes with the :class:`Position` of its record (file number, record number,
byte offset of the record in the decompressed file, and the counters *before* it), so a pack
that was interrupted can restart reading exactly at a document without re-reading, let alone
re-tokenising, what it already packed::

    reader = DocumentReader(expand_inputs(["data/part-{000..002}.jsonl.zst"]))
    for text, pos in reader:          # pos: Position(file=0, record=0, offset=0, ...)
        ...
    DocumentReader(files, start=pos)  # continues at pos's record, same counters

Formats, chosen by file name: ``*.txt`` (optionally ``.gz``/``.zst``) is plain text, one
document per file (or per line with ``lines=True``); everything else is JSON Lines with the
text under ``text_key`` (dotted for nested fields). ``-`` reads JSON Lines (or text lines)
from stdin.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

from braceexpand import braceexpand

from wdstream.errors import InputError

__all__ = ["INPUT_SUFFIXES", "DocumentReader", "InputFile", "Position", "expand_inputs"]

INPUT_SUFFIXES = (
    ".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst",
    ".txt", ".txt.gz", ".txt.zst",
)  # fmt: skip
STDIN = "-"
_MAX_LOCATIONS = 10


@dataclass(frozen=True)
class InputFile:
    """One input file (or stdin) and what identifies its content for the resume journal."""

    path: str
    size: int | None = None
    mtime_ns: int | None = None

    @property
    def is_text(self) -> bool:
        return self.path.removesuffix(".gz").removesuffix(".zst").endswith(".txt")

    def fingerprint(self) -> list[Any]:
        return [self.path, self.size, self.mtime_ns]


class Position(NamedTuple):
    """Where a record starts, plus the reader's counters before it (for exact resume)."""

    file: int  # index into the expanded input list
    record: int  # 0-based line (or document) number within the file
    offset: int  # byte offset of the record in the decompressed file
    empty: int  # empty documents skipped before this record
    bad: int  # malformed records skipped before this record
    input_bytes: int  # input bytes read before this record


def _expand_dir(path: str) -> list[str]:
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        files.extend(
            os.path.join(dirpath, f)
            for f in filenames
            if not f.startswith(".") and f.endswith(INPUT_SUFFIXES)
        )
    return sorted(files)


def _expand_one(pattern: str) -> list[str]:
    if pattern == STDIN:
        return [STDIN]
    found: list[str] = []
    for item in braceexpand(pattern):
        if glob.has_magic(item):
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise InputError(f"{item}: no file matches this pattern")
        else:
            matches = [item]
        for m in matches:
            found.extend(_expand_dir(m) if os.path.isdir(m) else [m])
    return found


def expand_inputs(patterns: list[str] | tuple[str, ...]) -> list[InputFile]:
    """Expand paths, directories (recursively), globs and ``{a..b}`` braces into files.

    Arguments keep their order; what one argument expands to is sorted (braces in their
    own numeric order), and a file named twice is read once.

    Raises:
        InputError: for a missing file, an empty pattern match, or a directory with no inputs.
    """
    files: list[InputFile] = []
    seen: set[str] = set()
    for pattern in patterns:
        expanded = _expand_one(pattern)
        if not expanded:
            raise InputError(f"{pattern}: no input files ({', '.join(INPUT_SUFFIXES)}) found")
        for p in expanded:
            if p in seen:
                continue
            seen.add(p)
            if p == STDIN:
                files.append(InputFile(STDIN))
                continue
            try:
                st = os.stat(p)
            except OSError as exc:
                raise InputError(f"{p}: cannot read input ({exc.strerror})") from exc
            files.append(InputFile(p, st.st_size, st.st_mtime_ns))
    if not files:
        raise InputError("no input files given")
    return files


def _open_binary(path: str) -> IO[bytes]:
    if path == STDIN:
        return sys.stdin.buffer
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if path.endswith(".zst"):
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(reader, buffer_size=1 << 20)
    return raw


@dataclass
class DocumentReader:
    """Iterate ``(text, Position)`` over every non-empty document of the inputs, in order.

    Args:
        files: the expanded inputs.
        text_key: JSON field holding the text; dots reach into nested objects.
        lines: for ``.txt`` inputs, one document per line instead of per file.
        on_error: ``"raise"`` (InputError naming file and line) or ``"skip"`` (count it).
        errors: ``"strict"`` (undecodable UTF-8 is an InputError naming the byte offset) or
            ``"replace"``.
        start: resume at this position (its counters are taken over).
        bad_locations: the first skipped-record locations seen before ``start``.
    """

    files: list[InputFile]
    text_key: str = "text"
    lines: bool = False
    on_error: str = "raise"
    errors: str = "strict"
    start: Position | None = None
    bad_locations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.errors not in ("strict", "replace"):
            raise ValueError(f"errors must be 'strict' or 'replace', got {self.errors!r}")
        self._keys = self.text_key.split(".")
        start = self.start or Position(0, 0, 0, 0, 0, 0)
        self.empty, self.bad, self.input_bytes = start.empty, start.bad, start.input_bytes
        self.records = 0

    def _bad(self, where: str, why: str) -> None:
        if self.on_error == "raise":
            raise InputError(f"{where}: {why}")
        self.bad += 1
        if len(self.bad_locations) < _MAX_LOCATIONS:
            self.bad_locations.append(f"{where}: {why}")

    def decode_bytes(self, data: bytes, path: str, offset: int) -> str:
        """Decode UTF-8 per ``errors``; a failure names ``path`` and the byte offset."""
        try:
            return data.decode("utf-8", self.errors)
        except UnicodeDecodeError as exc:
            raise InputError(
                f"{path}: invalid UTF-8 at byte {offset + exc.start} (use errors='replace' / "
                "--errors replace to substitute U+FFFD)"
            ) from exc

    def text_of(self, line: str, path: str, lineno: int) -> str | None:
        """The text field of one JSON record, or None if it was bad and ``on_error`` skips."""
        try:
            obj: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            self._bad(f"{path}:{lineno}", f"malformed JSON ({exc.msg} at column {exc.colno})")
            return None
        for key in self._keys:
            if not isinstance(obj, dict) or key not in obj:
                self._bad(f"{path}:{lineno}", f"no text field {self.text_key!r}")
                return None
            obj = obj[key]
        if not isinstance(obj, str):
            self._bad(
                f"{path}:{lineno}",
                f"text field {self.text_key!r} is {type(obj).__name__}, not a string",
            )
            return None
        return obj

    def __iter__(self) -> Iterator[tuple[str, Position]]:
        start = self.start or Position(0, 0, 0, 0, 0, 0)
        for i in range(start.file, len(self.files)):
            resume = start if i == start.file else None
            yield from self._read_file(i, resume)

    def _read_file(self, i: int, resume: Position | None) -> Iterator[tuple[str, Position]]:
        info = self.files[i]
        path = info.path
        name = "<stdin>" if path == STDIN else path
        try:
            fh = _open_binary(path)
        except OSError as exc:
            raise InputError(f"{name}: cannot open ({exc.strerror})") from exc
        try:
            if info.is_text and not self.lines:
                if resume is not None and resume.record > 0:
                    return
                data = fh.read()
                pos = Position(i, 0, 0, self.empty, self.bad, self.input_bytes)
                self.input_bytes += len(data)
                text = self.decode_bytes(data, name, 0)
                if text:
                    yield text, pos
                else:
                    self.empty += 1
                return
            yield from self._read_lines(i, fh, name, info, resume)
        except (OSError, EOFError) as exc:  # truncated gzip/zstd, I/O errors
            raise InputError(f"{name}: read failed ({exc})") from exc
        finally:
            if path != STDIN:
                fh.close()

    def _read_lines(
        self, i: int, fh: IO[bytes], name: str, info: InputFile, resume: Position | None
    ) -> Iterator[tuple[str, Position]]:
        record, offset = 0, 0
        if resume is not None and resume.record > 0:
            record, offset = resume.record, resume.offset
            if fh.seekable() and not name.endswith((".gz", ".zst")):
                fh.seek(offset)
            else:  # compressed or stdin: skip the consumed lines without parsing them
                skipped = 0
                for _ in range(record):
                    skipped += len(fh.readline())
                if skipped != offset:
                    raise InputError(f"{name}: input changed since the interrupted pack")
        as_text = info.is_text
        for raw in fh:
            pos = Position(i, record, offset, self.empty, self.bad, self.input_bytes)
            record += 1
            offset += len(raw)
            self.input_bytes += len(raw)
            line = self.decode_bytes(raw, name, pos.offset)
            if pos.offset == 0 and line.startswith("\ufeff"):
                line = line[1:]  # a UTF-8 byte-order mark is not part of the first record
            if as_text:
                text: str | None = line.removesuffix("\n").removesuffix("\r")
            elif not line.strip():
                continue  # blank line between JSON records
            else:
                text = self.text_of(line, name, record)
                if text is None:
                    continue
            if text:
                yield text, pos
            else:
                self.empty += 1
