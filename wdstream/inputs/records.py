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

import itertools
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from wdstream.errors import InputError
from wdstream.inputs.arrow import arrow_documents, is_arrow
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

__all__ = ["DocumentReader", "RecordDocument"]

_MAX_LOCATIONS = 10
_MAX_KEYS = 8  # keys an error lists when the text field is missing
# A lone UTF-16 surrogate comes from a \uD800-\uDFFF escape in the JSON (UTF-8 decoding never
# yields one); UTF-8 cannot encode it, so no tokenizer takes it.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


def _json_problem(exc: json.JSONDecodeError, line: str) -> str:
    """json's complaint about a one-line record, placed by column or as the line's end."""
    what = exc.msg.removesuffix(" at")  # "Invalid control character at" would read "at at"
    if exc.pos < len(line.rstrip()):
        return f"{what} at column {exc.pos + 1}"
    if what == "Invalid control character":  # the newline, inside a string
        return "a string is not closed before the end of the line"
    # json counts the trailing newline as a line break, so its column would be on line 2.
    return f"{what} at the end of the line"


def _keys_found(obj: Any, owner: str) -> str:
    """What ``owner`` holds instead of the text field, for the error message."""
    if not isinstance(obj, dict):
        return f"{owner} is a JSON {_JSON_TYPES.get(type(obj), 'number')}, not an object"
    if not obj:
        return f"{owner} is an empty object"
    shown = ", ".join(_clip(repr(k)) for k in itertools.islice(obj, _MAX_KEYS))
    if len(obj) <= _MAX_KEYS:
        return f"{owner} has keys {shown}"
    return f"{owner} has {len(obj)} keys: {shown} and {len(obj) - _MAX_KEYS} more"


def _clip(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


class RecordDocument(Protocol):
    """Turns one parsed JSON record into the document a pack's encoder takes (pre-tokenized
    ids and mask, a conversation, ...), instead of the text under ``text_key``.

    Raises ValueError saying what is wrong with a record; the reader makes that a bad
    record naming file and line. The document needs a ``len()`` (0: an empty document,
    skipped and counted like empty text).
    """

    def __call__(self, record: Any) -> Any: ...


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
        self._keys = self.text_key.split(".")
        start = self.start or InputPosition(0, 0, 0, 0, 0, 0)
        self.empty, self.bad, self.input_bytes = start.empty, start.bad, start.input_bytes
        self.documents = 0  # yielded by this reader (not counting those before ``start``)
        self.lines_read = 0
        sizes = [f.size for f in self.files]
        self.source_total = None if None in sizes else sum(s or 0 for s in sizes)
        self._done_bytes = sum(s or 0 for s in sizes[: start.file])  # files finished
        self._file: IO[bytes] | None = None  # the file being read, as stored on disk

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
        or None if it was bad and ``on_error`` skips.

        A record is bad when it is not JSON Python can load (malformed, nested deeper than
        the recursion limit, an integer longer than Python's digit limit), has no text field,
        or the field is not a string or holds a lone surrogate; with :attr:`document`, when
        that refuses it.
        """
        try:
            obj: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            self._bad(f"{path}:{lineno}", f"malformed JSON ({_json_problem(exc, line)})")
            return None
        except RecursionError:
            self._bad(
                f"{path}:{lineno}", "JSON nested too deeply to parse (Python's recursion limit)"
            )
            return None
        except ValueError:  # the only other one json raises: an integer over the digit limit
            limit = sys.get_int_max_str_digits()
            self._bad(
                f"{path}:{lineno}", f"JSON integer longer than Python's limit of {limit:,} digits"
            )
            return None
        return self.document_of(obj, path, lineno)

    def document_of(self, obj: Any, path: str, lineno: int) -> Any:
        """The document of one parsed record ``obj`` (a JSON line, a Parquet/Arrow row, a
        record given from Python) at ``path:lineno``: its text field, or with
        :attr:`document` what that makes of it; None if it was bad and ``on_error`` skips."""
        if self.document is not None:
            try:
                return self.document(obj)
            except ValueError as exc:
                self._bad(f"{path}:{lineno}", str(exc))
                return None
        for depth, key in enumerate(self._keys):
            if not isinstance(obj, dict) or key not in obj:
                owner = repr(".".join(self._keys[:depth])) if depth else "the record"
                self._bad(
                    f"{path}:{lineno}",
                    f"no text field {self.text_key!r} ({_keys_found(obj, owner)})",
                )
                return None
            obj = obj[key]
        if not isinstance(obj, str):
            self._bad(
                f"{path}:{lineno}",
                f"text field {self.text_key!r} is {type(obj).__name__}, not a string",
            )
            return None
        if not obj.isascii():  # O(1), and ASCII text cannot hold a surrogate
            return self._without_surrogates(obj, path, lineno)
        return obj

    def _without_surrogates(self, text: str, path: str, lineno: int) -> str | None:
        """``text``, unless it holds a lone surrogate: then a bad record, or U+FFFD for it."""
        try:
            text.encode("utf-8")  # several times faster than a regex search for one
        except UnicodeEncodeError as exc:
            if self.errors == "replace":
                return _SURROGATE.sub("\ufffd", text)
            self._bad(
                f"{path}:{lineno}",
                f"text field {self.text_key!r} holds a lone surrogate "
                f"\\u{ord(text[exc.start]):04x} at character {exc.start} (half of a UTF-16 pair, "
                "not text UTF-8 can encode; use errors='replace' / --errors replace to "
                "substitute U+FFFD)",
            )
            return None
        return text

    def __iter__(self) -> Iterator[tuple[str, InputPosition]]:
        start = self.start or InputPosition(0, 0, 0, 0, 0, 0)
        for i in range(start.file, len(self.files)):
            resume = start if i == start.file else None
            yield from self._read_file(i, resume)
        if not self.documents and self.bad and self.start is None:
            raise InputError(self._nothing_left())

    def _nothing_left(self) -> str:
        """Why inputs whose every record was skipped give nothing to pack."""
        bad = f"{self.bad} bad record{'s' if self.bad != 1 else ''} skipped with on_error='skip'"
        empty = f", {self.empty} empty" if self.empty else ""
        return (
            f"nothing to pack: every record was {'bad or empty' if empty else 'bad'} ({bad}"
            f"{empty}); the first: " + "; ".join(self.bad_locations[:3])
        )

    def _read_file(
        self, i: int, resume: InputPosition | None
    ) -> Iterator[tuple[str, InputPosition]]:
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
        record, offset = 0, 0
        if resume is not None and resume.record > 0:
            record, offset = resume.record, resume.offset
            if fh.seekable() and not name.endswith((".gz", ".zst")):
                fh.seek(offset)
            else:  # compressed or stdin: skip the consumed lines without parsing them
                skipped = 0
                for _ in range(record):
                    skipped += skip_line(fh)
                if skipped != offset:
                    raise InputError(f"{name}: input changed since the interrupted pack")
        lines = bounded_lines(fh, self.max_record_bytes, self.on_error == "skip")
        yield from self.line_documents(lines, i, name, info.is_text, record, offset)

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
