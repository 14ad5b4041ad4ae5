"""Documents of the inputs: JSON Lines records or text, each with its input position.

Every document comes with the :class:`~wdstream.inputs.files.InputPosition` of its record
(file number, record number, byte offset of the record in the decompressed file, and the
counters *before* it), so a pack that was interrupted can restart reading exactly at a
document without re-reading, let alone re-tokenising, what it already packed::

    reader = DocumentReader(expand_inputs(["data/part-{000..002}.jsonl.zst"]))
    for text, pos in reader:          # pos: InputPosition(file=0, record=0, offset=0, ...)
        ...
    DocumentReader(files, start=pos)  # continues at pos's record, same counters

Formats, chosen by file name: ``*.txt`` (optionally ``.gz``/``.zst``) is plain text, one
document per file (or per line with ``lines=True``); ``*.parquet`` and ``*.arrow`` are rows
of a table (:mod:`wdstream.inputs.arrow`, records numbered by row); everything else is JSON
Lines with the text under ``text_key`` (dotted for nested fields). ``-`` reads JSON Lines
(or text lines) from stdin.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from wdstream.errors import InputError
from wdstream.inputs.arrow import arrow_documents, is_arrow
from wdstream.inputs.blocks import BlockParser, LineBlock, ParsedBlock, read_blocks
from wdstream.inputs.compressed import compression, open_binary, truncated
from wdstream.inputs.files import STDIN, InputFile, InputPosition
from wdstream.inputs.lines import (
    DEFAULT_MAX_RECORD_BYTES,
    LongLine,
    bounded_lines,
    check_limit,
    read_bounded,
    skip_line,
    too_long,
)
from wdstream.inputs.parse import RecordDocument, RecordParser

__all__ = ["DocumentReader", "RecordDocument"]

_MAX_LOCATIONS = 10


@dataclass
class DocumentReader:
    """Iterate ``(text, InputPosition)`` over every non-empty document of the inputs, in order.

    Args:
        files: the expanded inputs.
        text_key: JSON field holding the text; dots reach into nested objects.
        lines: for ``.txt`` inputs, one document per line instead of per file.
        on_error: ``"raise"`` (InputError naming file and line) or ``"skip"`` (count it).
        errors: ``"strict"`` (undecodable UTF-8 is an InputError naming the byte offset) or
            ``"replace"``.
        start: resume at this position (its counters are taken over).
        bad_locations: the first skipped-record locations seen before ``start``.
        max_record_bytes: the longest record read (a line with its line end, or a whole
            ``.txt`` document); a longer one is a bad record (an InputError naming file and
            line, or skipped and counted), never held in memory past this many bytes.
        document: JSON records only: what each record's document is (a
            :class:`RecordDocument`, e.g. pre-tokenized ids); None: the text at ``text_key``.

    Attributes:
        empty, bad: empty documents and bad records skipped so far (``start``'s included).
        input_bytes: decompressed bytes read so far (``start``'s included).
        documents: documents this reader yielded.
        lines_read: lines of the file being read so far (its record number after them).
        source_total: bytes of all inputs as stored (compressed size for ``.gz``/``.zst``),
            None when stdin is one of them; see :attr:`source_bytes`.
    """

    files: list[InputFile]
    text_key: str = "text"
    lines: bool = False
    on_error: str = "raise"
    errors: str = "strict"
    start: InputPosition | None = None
    bad_locations: list[str] = field(default_factory=list)
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    document: RecordDocument | None = None

    def __post_init__(self) -> None:
        check_limit(self.max_record_bytes)
        if self.document is not None and (text := [f.path for f in self.files if f.is_text]):
            raise InputError(
                f"{text[0]}: a .txt input holds text, but this pack reads JSON records of "
                "another kind (pre-tokenized ids or conversations): give JSON Lines inputs"
            )
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.errors not in ("strict", "replace"):
            raise ValueError(f"errors must be 'strict' or 'replace', got {self.errors!r}")
        self.parser = RecordParser(self.text_key, self.errors, self.document)
        start = self.start or InputPosition(0, 0, 0, 0, 0, 0)
        self.empty, self.bad, self.input_bytes = start.empty, start.bad, start.input_bytes
        self.documents = 0  # yielded by this reader (not counting those before ``start``)
        self.lines_read = 0
        sizes = [f.size for f in self.files]
        self.source_total = None if None in sizes else sum(s or 0 for s in sizes)
        self._done_bytes = sum(s or 0 for s in sizes[: start.file])  # files finished
        self._file: IO[bytes] | None = None  # the file being read, as stored on disk
        self._next_record = 0  # settle(): the record after the last block settled

    @property
    def source_bytes(self) -> int:
        """Bytes of the inputs read so far as stored, the counterpart of :attr:`source_total`.

        Compressed files count their compressed bytes, so progress against the total is
        linear whatever the compression ratio.
        """
        if self.source_total is None:  # stdin has no size: count what was read instead
            return self.input_bytes
        return self._done_bytes + (self._file.tell() if self._file is not None else 0)

    def _bad(self, where: str, why: str) -> None:
        if self.on_error == "raise":
            raise InputError(f"{where}: {why}")
        self.bad += 1
        if len(self.bad_locations) < _MAX_LOCATIONS:
            self.bad_locations.append(f"{where}: {why}")

    def counted(self, doc: Any, pos: InputPosition) -> Iterator[tuple[Any, InputPosition]]:
        """``(doc, pos)`` when the document holds anything (a document), else nothing (an
        empty one): the one place either is counted, whatever the input kind."""
        if len(doc):
            self.documents += 1
            yield doc, pos
        else:
            self.empty += 1

    def long_record(self, where: str, line: LongLine | int) -> None:
        """A record over :attr:`max_record_bytes` at ``where`` (``path:line``): raised as an
        InputError saying what to do, or (``on_error="skip"``) counted as a bad record."""
        self._bad(where, too_long(line, self.max_record_bytes))

    def decode_bytes(self, data: bytes, path: str, offset: int) -> str:
        """Decode UTF-8 per ``errors``; a failure names ``path`` and the byte offset."""
        try:
            return data.decode("utf-8", self.errors)
        except UnicodeDecodeError as exc:
            raise InputError(
                f"{path}: invalid UTF-8 at byte {offset + exc.start} (use errors='replace' / "
                "--errors replace to substitute U+FFFD)"
            ) from exc

    def text_of(self, line: str, path: str, lineno: int) -> Any:
        """The text field of one JSON record (with :attr:`document`, the record's document),
        or None if it was bad and ``on_error`` skips (:meth:`RecordParser.line` says when a
        record is bad)."""
        doc, why = self.parser.line(line)
        if why is not None:
            self._bad(f"{path}:{lineno}", why)
        return doc

    def document_of(self, obj: Any, path: str, lineno: int) -> Any:
        """The document of one parsed record ``obj`` (a JSON line, a Parquet/Arrow row, a
        record given from Python) at ``path:lineno``: its text field, or with
        :attr:`document` what that makes of it; None if it was bad and ``on_error`` skips."""
        doc, why = self.parser.record(obj)
        if why is not None:
            self._bad(f"{path}:{lineno}", why)
        return doc

    def _without_surrogates(self, text: str, path: str, lineno: int) -> str | None:
        """``text``, unless it holds a lone surrogate: then a bad record, or U+FFFD for it."""
        doc, why = self.parser.checked_text(text)
        if why is not None:
            self._bad(f"{path}:{lineno}", why)
        return doc

    def __iter__(self) -> Iterator[tuple[str, InputPosition]]:
        start = self.start or InputPosition(0, 0, 0, 0, 0, 0)
        for i in range(start.file, len(self.files)):
            resume = start if i == start.file else None
            yield from self._read_file(i, resume)
        self.finished()

    def finished(self) -> None:
        """At the end of the inputs: refuse inputs whose every record was skipped.

        Raises:
            InputError: saying how many were bad and which came first.
        """
        if not self.documents and self.bad and self.start is None:
            raise InputError(self._nothing_left())

    def block_parser(self) -> BlockParser | None:
        """The parser of :meth:`blocks` for a tokenizer worker, when every input is a line
        file (JSON Lines, ``.txt`` with ``lines``); None when one is not (then iterate)."""
        if any(is_arrow(f.path) or (f.is_text and not self.lines) for f in self.files):
            return None
        return BlockParser(self.parser, self.on_error, self.max_record_bytes)

    def blocks(self, block_bytes: int = 1 << 20) -> Iterator[LineBlock]:
        """The inputs as raw blocks of lines (:mod:`wdstream.inputs.blocks`), for a reader
        whose :meth:`block_parser` is not None; number their documents with :meth:`settle`
        in order, then call :meth:`finished`. Counts :attr:`input_bytes` as it reads."""
        start = self.start or InputPosition(0, 0, 0, 0, 0, 0)
        for i in range(start.file, len(self.files)):
            resume = start if i == start.file else None
            yield from self._read_file(i, resume, block_bytes)

    def settle(self, block: tuple[int, int | None], parsed: ParsedBlock) -> list[InputPosition]:
        """The positions of a parsed block's documents, ``block`` being its ``(file,
        record)`` (:class:`LineBlock`'s), counting its lines and its empty and bad records
        as reading them one by one would.

        Raises:
            InputError: the block's bad record (``on_error="raise"``) or invalid UTF-8.
        """
        file, record = block
        base = self._next_record if record is None else record
        self._next_record = base + parsed.lines
        name = self._name(file)
        empty, bad = self.empty, self.bad
        cols = (parsed.lines_before + base, parsed.offsets, parsed.empty_before + empty,
                parsed.bad_before + bad, parsed.input_bytes)  # fmt: skip
        positions = [
            InputPosition(file, r, o, e, b, n)
            for r, o, e, b, n in zip(*(c.tolist() for c in cols), strict=True)
        ]
        self.empty, self.bad = empty + parsed.empty, bad + parsed.bad
        self.documents += len(positions)
        for k, why in parsed.messages[: max(_MAX_LOCATIONS - len(self.bad_locations), 0)]:
            self.bad_locations.append(f"{name}:{base + k + 1}: {why}")
        if parsed.fatal is not None:
            line, why = parsed.fatal
            raise _with_change(
                InputError(why if line is None else f"{name}:{base + line + 1}: {why}"),
                self.files[file],
            )
        return positions

    def _name(self, file: int) -> str:
        path = self.files[file].path
        return "<stdin>" if path == STDIN else path

    def _nothing_left(self) -> str:
        """Why inputs whose every record was skipped give nothing to pack."""
        bad = f"{self.bad} bad record{'s' if self.bad != 1 else ''} skipped with on_error='skip'"
        empty = f", {self.empty} empty" if self.empty else ""
        return (
            f"nothing to pack: every record was {'bad or empty' if empty else 'bad'} ({bad}"
            f"{empty}); the first: " + "; ".join(self.bad_locations[:3])
        )

    def _read_file(
        self, i: int, resume: InputPosition | None, block_bytes: int | None = None
    ) -> Iterator[Any]:
        """Input ``i``'s documents, or with ``block_bytes`` its raw blocks of lines; an
        InputError once it is read if the file changed meanwhile (see
        :meth:`InputFile.changed`), whatever ``on_error`` says: what was read is no version
        of the file."""
        info = self.files[i]
        try:
            yield from self._read_stored(i, resume, block_bytes)
        except InputError as exc:
            told = _with_change(exc, info)
            if told is exc:
                raise
            raise told from exc
        note = info.changed()
        if note is not None:
            raise InputError(note)

    def _read_stored(
        self, i: int, resume: InputPosition | None, block_bytes: int | None
    ) -> Iterator[Any]:
        """:meth:`_read_file` without the check that the file stayed the same."""
        info = self.files[i]
        path = info.path
        name = "<stdin>" if path == STDIN else path
        if compression(path) and info.size == 0:
            # Python's gzip reads an empty file as no data; gzip -d and zstd -d refuse it.
            raise InputError(f"{name}: empty {compression(path)} file (0 bytes, not even a header)")
        try:
            fh, raw = open_binary(path)
        except OSError as exc:
            raise InputError(f"{name}: cannot open ({exc.strerror})") from exc
        self._file = raw
        try:
            if is_arrow(path):  # Parquet / Arrow IPC: rows of record batches
                yield from arrow_documents(self, i, raw, name, resume)
            elif info.is_text and not self.lines:
                yield from self._read_whole(i, fh, name, resume)
            elif block_bytes is not None:
                record, offset = self._resume_at(fh, name, resume)
                first = LineBlock(b"", i, name, record, offset, self.input_bytes, info.is_text)
                skip = self.on_error == "skip"
                for block in read_blocks(fh, first, self.max_record_bytes, skip, block_bytes):
                    self.input_bytes += block.size
                    yield block
            else:
                yield from self._read_lines(i, fh, name, info, resume)
        except EOFError as exc:  # gzip and _ZstdFrames: the compressed data was cut short
            raise InputError(truncated(name, path, fh.tell())) from exc
        except OSError as exc:  # corrupt compressed data, I/O errors
            raise InputError(f"{name}: read failed ({exc})") from exc
        finally:
            self._file = None
            self._done_bytes += info.size or 0
            if path != STDIN:
                fh.close()
                raw.close()

    def _read_whole(
        self, i: int, fh: IO[bytes], name: str, resume: InputPosition | None
    ) -> Iterator[tuple[str, InputPosition]]:
        """The file as one document (``.txt`` without ``lines``)."""
        if resume is not None and resume.record > 0:
            return
        data = read_bounded(fh, self.max_record_bytes, self.on_error == "skip")
        pos = InputPosition(i, 0, 0, self.empty, self.bad, self.input_bytes)
        if isinstance(data, LongLine):  # the document is longer than the limit
            self.input_bytes += data.size
            self.long_record(f"{name}:1", data)
            return
        self.input_bytes += len(data)
        yield from self.counted(self.decode_bytes(data, name, 0), pos)

    def _read_lines(
        self, i: int, fh: IO[bytes], name: str, info: InputFile, resume: InputPosition | None
    ) -> Iterator[tuple[str, InputPosition]]:
        record, offset = self._resume_at(fh, name, resume)
        lines = bounded_lines(fh, self.max_record_bytes, self.on_error == "skip")
        yield from self.line_documents(lines, i, name, info.is_text, record, offset)

    @staticmethod
    def _resume_at(fh: IO[bytes], name: str, resume: InputPosition | None) -> tuple[int, int]:
        """Move ``fh`` to ``resume``'s record; its ``(record, offset)`` (0, 0 without)."""
        if resume is None or resume.record == 0:
            return 0, 0
        if fh.seekable() and not name.endswith((".gz", ".zst")):
            fh.seek(resume.offset)
        else:  # compressed or stdin: skip the consumed lines without parsing them
            skipped = 0
            for _ in range(resume.record):
                skipped += skip_line(fh)
            if skipped != resume.offset:
                raise InputError(f"{name}: input changed since the interrupted pack")
        return resume.record, resume.offset

    def line_documents(
        self,
        lines: Iterable[bytes | LongLine],
        file: int,
        name: str,
        as_text: bool,
        record: int,
        offset: int,
    ) -> Iterator[tuple[str, InputPosition]]:
        """The documents of raw ``lines`` of input ``file``, the first being record
        ``record`` at decompressed byte ``offset``: JSON records (blank lines skipped), or
        with ``as_text`` one document per line. A :class:`LongLine` (from
        :func:`~wdstream.inputs.lines.bounded_lines`) is a bad record. Counts into this
        reader's counters and :attr:`lines_read`; a byte range of a file (the Ray engine's
        pieces) is read through this too, so it yields exactly what the whole file would.
        """
        for raw in lines:
            size = raw.size if isinstance(raw, LongLine) else len(raw)
            pos = InputPosition(file, record, offset, self.empty, self.bad, self.input_bytes)
            record += 1
            self.lines_read = record
            offset += size
            self.input_bytes += size
            if isinstance(raw, LongLine):
                self.long_record(f"{name}:{record}", raw)
                continue
            line = self.decode_bytes(raw, name, pos.offset)
            if pos.offset == 0 and line.startswith("\ufeff"):
                line = line[1:]  # a UTF-8 byte-order mark is not part of the first record
            if as_text:
                text: Any = line.removesuffix("\n").removesuffix("\r")
            elif not line.strip():
                continue  # blank line between JSON records
            else:
                text = self.text_of(line, name, record)
                if text is None:
                    continue
            yield from self.counted(text, pos)


def _with_change(exc: InputError, info: InputFile) -> InputError:
    """``exc``, or where ``info``'s file changed since the pack began, an InputError that
    also says so: its bad record may be one the change made."""
    note = info.changed()
    return exc if note is None else InputError(f"{exc}; {note}")
