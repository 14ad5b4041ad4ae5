"""Raw blocks of lines: how a pack reads line files without parsing them in its own process.

The packing process is serial, so every byte it touches caps the whole pack. For line files
(JSON Lines, and ``.txt`` with ``lines``) it only reads ~1 MB blocks cut after a newline
(:func:`read_blocks`); the tokenizer workers split, decode and parse them
(:meth:`BlockParser.parse`, with the same :class:`~wdstream.inputs.parse.RecordParser` as a
reader in one process) and return, beside the documents, what the reader needs to number
them: each document's record, byte offset and input bytes before it, the empty and bad
records before it in the block, the bad records' messages, and the error that stops the pack
(:class:`ParsedBlock`). The reader then counts them in input order
(:meth:`~wdstream.inputs.records.DocumentReader.settle`), so positions, counters, skipped
locations and error messages are exactly those of reading line by line::

    packing process:  read_blocks -> LineBlock(data, file, record, offset, ...) --+
    tokenizer worker: BlockParser.parse -> ParsedBlock + the documents' tokens <--+
    packing process:  DocumentReader.settle(file, parsed) -> InputPositions

A line longer than ``max_record_bytes`` is refused as :func:`~wdstream.inputs.lines.bounded_lines`
refuses it: within a block by the worker, and one with no newline within the limit by the
reader, which never holds more than the limit and a block of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

import numpy as np

from wdstream.inputs.lines import LongLine, skip_line, too_long
from wdstream.inputs.parse import RecordParser

__all__ = ["BlockParser", "LineBlock", "ParsedBlock", "read_blocks"]

_MAX_MESSAGES = 10  # bad records' messages a block returns (the reader keeps the first 10)
# Blocks whose lines average fewer bytes are sorted first (BlockParser.parse): JSON Lines of
# real records average hundreds of bytes and take the plain path unchanged.
_SPARSE_LINE_BYTES = 64
_NOT_BLANK = np.ones(256, dtype=bool)
_NOT_BLANK[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = False  # what str.strip() strips, in ASCII


class LineBlock(NamedTuple):
    """Whole lines of input ``file`` (``data`` then ``tail``, ending after a newline or at
    the end of the file), starting at decompressed byte ``offset`` with ``input_bytes``
    read before it; ``record``: its first line's record number (0-based) when the reader
    knows it (a file's first block), None when it follows the block before (counting the
    lines of every block is left to the workers). ``long``: instead of data, one line
    longer than the limit, ``(size, exact)`` as :class:`~wdstream.inputs.lines.LongLine`."""

    data: bytes
    file: int
    name: str
    record: int | None
    offset: int
    input_bytes: int
    as_text: bool
    tail: bytes = b""
    long: tuple[int, bool] | None = None

    @property
    def size(self) -> int:
        """Input bytes the block stands for."""
        return self.long[0] if self.long is not None else len(self.data) + len(self.tail)


class ParsedBlock(NamedTuple):
    """What :meth:`BlockParser.parse` found in a block: the documents and, per document
    (int64 arrays), its line in the block, byte offset, input bytes before it, and the
    empty and bad records before it in the block; the block's lines, empty and bad records;
    the first bad records' ``(line in the block, why)``; and ``fatal``, the error that
    stops the pack: ``(line, why)`` for a bad record with ``on_error="raise"``, ``(None,
    message)`` for invalid UTF-8 with ``errors="strict"``; None if none."""

    docs: list[Any]
    lines_before: np.ndarray
    offsets: np.ndarray
    input_bytes: np.ndarray
    empty_before: np.ndarray
    bad_before: np.ndarray
    lines: int
    empty: int
    bad: int
    messages: list[tuple[int, str]]
    fatal: tuple[int | None, str] | None

    def without_docs(self) -> ParsedBlock:
        """This, without the documents (they stay in the worker that tokenised them)."""
        return self._replace(docs=[])


def read_blocks(
    fh: IO[bytes], first: LineBlock, limit: int, skip_long: bool, block_bytes: int
) -> Iterator[LineBlock]:
    """The rest of ``fh`` as blocks of about ``block_bytes`` (the last line read on to its
    end), the first at ``first``'s file, record, offset and input bytes.

    A line longer than ``limit`` that does not end within the block comes as a block of its
    own with ``long`` set: read to its end and counted (``skip_long``), or, as the reader
    stops there, last. Nothing is copied here but the bytes read.
    """
    at = first
    while data := fh.read(block_bytes):
        tail = b""
        if data[-1] != 10:  # the last line goes on past the block: read it to its end
            start = data.rfind(b"\n") + 1
            have = len(data) - start
            tail = fh.readline(limit - have + 1) if have <= limit else b""
            if have + len(tail) > limit:  # too long: never hold more than the limit of it
                if start:
                    yield at._replace(data=data[:start])
                    at = at._replace(record=None, offset=at.offset + start,
                                     input_bytes=at.input_bytes + start)  # fmt: skip
                if not skip_long:
                    yield at._replace(data=b"", long=(limit + 1, tail.endswith(b"\n")))
                    return
                size = have + len(tail) + (0 if tail.endswith(b"\n") else skip_line(fh))
                yield at._replace(data=b"", long=(size, True))
                at = at._replace(record=None, offset=at.offset + size,
                                 input_bytes=at.input_bytes + size)  # fmt: skip
                continue
        block = at._replace(data=data, tail=tail)
        yield block
        at = at._replace(record=None, offset=at.offset + block.size,
                         input_bytes=at.input_bytes + block.size)  # fmt: skip


@dataclass(frozen=True)
class BlockParser:
    """Parses :class:`LineBlock`\\ s as a :class:`~wdstream.inputs.records.DocumentReader`
    with these options reads lines (picklable: it crosses to the tokenizer workers)."""

    parser: RecordParser
    on_error: str
    max_record_bytes: int

    def parse(self, block: LineBlock) -> ParsedBlock:
        """The documents of ``block`` and how to number and count them (see the module).

        A block of short lines on average (under :data:`_SPARSE_LINE_BYTES`) is first
        sorted with numpy: lines of whitespace only (blank between JSON records, or an
        empty ``.txt`` line) are counted in bulk, never decoded one by one, so a
        decompression bomb of newlines costs its decompression and little more (a GiB of
        them parsed line by line took ~20 minutes). Every other line is parsed as before,
        so both ways give the same documents, positions, counters and errors.
        """
        out = _Parsed(block, self.on_error == "raise")
        if block.long is not None:
            out.lines = 1
            out.refuse(0, too_long(LongLine(*block.long), self.max_record_bytes))
            return out.result()
        data = block.data + block.tail if block.tail else block.data
        arr = np.frombuffer(data, dtype=np.uint8)
        if _all_blank(arr, block.as_text, self.max_record_bytes):  # blank JSON lines only
            out.lines = int(np.count_nonzero(arr == 10)) + (data[-1:] not in (b"", b"\n"))
            return out.result()
        ends = np.flatnonzero(arr == 10) + 1
        if data and (not len(ends) or ends[-1] != len(data)):
            ends = np.append(ends, len(data))  # the file's last line, without a newline
        starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
        pieces: list[str] | None = None
        skipped = None
        lines: np.ndarray | range
        if len(ends) and len(data) < _SPARSE_LINE_BYTES * len(ends):
            lines, skipped = self._busy_lines(arr, starts, ends, block.as_text)
        else:
            lines = range(len(ends))
            try:
                pieces = data.decode("utf-8", self.parser.errors).split("\n")
            except UnicodeDecodeError:  # find the line and byte below, after the lines before
                pieces = None
        added = 0  # skipped empty lines (.txt) counted so far
        numbers = lines.tolist() if isinstance(lines, np.ndarray) else lines
        for k, a, b in zip(numbers, starts[lines].tolist(), ends[lines].tolist(), strict=True):
            if skipped is not None:  # the empty .txt lines skipped before this one
                out.empty += int(skipped[k]) - added
                added = int(skipped[k])
            newline = data[b - 1] == 10
            if b - a > self.max_record_bytes:
                exact = not out.raising or (b - a == self.max_record_bytes + 1 and newline)
                size = b - a if not out.raising else self.max_record_bytes + 1
                out.refuse(k, too_long(LongLine(size, exact), self.max_record_bytes))
            elif pieces is not None:
                self._line(out, k, a, pieces[k], newline, block)
            else:
                try:
                    line = data[a:b].decode("utf-8", self.parser.errors)
                except UnicodeDecodeError as exc:
                    out.fatal = (
                        None,
                        (
                            f"{block.name}: invalid UTF-8 at byte {block.offset + a + exc.start} "
                            "(use errors='replace' / --errors replace to substitute U+FFFD)"
                        ),
                    )
                    return out.result()
                self._line(out, k, a, line.removesuffix("\n"), newline, block)
            out.lines = k + 1
            if out.fatal is not None:
                return out.result()
        out.lines = int(len(ends))
        if skipped is not None:
            out.empty += int(skipped[-1]) - added
        return out.result()

    def _busy_lines(
        self, arr: np.ndarray, starts: np.ndarray, ends: np.ndarray, as_text: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """The lines to parse one by one (int64 indices), and per line the empty ``.txt``
        lines skipped at or before it (cumulative; JSON's blank lines count as nothing).

        JSON: a line of whitespace only (``str.strip`` strips it all: tab, newline, VT,
        FF, CR, 0x1C-0x1F, space) is blank and skipped. ``.txt``: a line that is ``\\n``,
        ``\\r\\n``, ``\\r`` or nothing is an empty document. Any other line (a byte-order
        mark, Unicode spaces, text) is parsed as usual, and so is any line over the record
        limit, blank or not (it is refused).
        """
        long = ends - starts > self.max_record_bytes
        if as_text:
            newline = arr[ends - 1] == 10
            body = ends - starts - newline
            cr = (body > 0) & (arr[np.maximum(starts + body - 1, 0)] == 13)
            empty = (body - cr == 0) & ~long
            return np.flatnonzero(~empty), np.cumsum(empty)
        seen = np.concatenate(([0], np.cumsum(_NOT_BLANK[arr], dtype=np.int64)))
        busy = (seen[ends] - seen[starts] > 0) | long
        return np.flatnonzero(busy), np.zeros(len(ends), dtype=np.int64)

    def _line(
        self, out: _Parsed, k: int, start: int, line: str, newline: bool, block: LineBlock
    ) -> None:
        """One decoded line (without its newline) at byte ``start`` of the block."""
        if block.offset + start == 0 and line.startswith("\ufeff"):
            line = line[1:]  # a UTF-8 byte-order mark is not part of the first record
        if block.as_text:
            out.document(k, start, line.removesuffix("\r"))
            return
        if not line.strip():
            return  # blank line between JSON records
        doc, why = self.parser.line(line)
        if why is not None and newline:  # json's message places errors against the newline
            doc, why = self.parser.line(line + "\n")
        if why is not None:
            out.refuse(k, why)
        else:
            out.document(k, start, doc)


def _all_blank(arr: np.ndarray, as_text: bool, limit: int) -> bool:
    """Whether a JSON block is whitespace only, no line of it over ``limit`` (two passes
    over the bytes, the second only when every byte is at most a space)."""
    if as_text or not len(arr) or len(arr) > limit or arr.max() > 32:
        return False
    return not _NOT_BLANK[arr].any()


class _Parsed:
    """A :class:`ParsedBlock` being gathered, line by line."""

    def __init__(self, block: LineBlock, raising: bool) -> None:
        self.block, self.raising = block, raising
        self.docs: list[Any] = []
        self.meta: list[tuple[int, int, int, int, int]] = []
        self.lines = self.empty = self.bad = 0
        self.messages: list[tuple[int, str]] = []
        self.fatal: tuple[int | None, str] | None = None

    def document(self, k: int, start: int, doc: Any) -> None:
        if not len(doc):
            self.empty += 1
            return
        b = self.block
        self.docs.append(doc)
        self.meta.append((k, b.offset + start, b.input_bytes + start, self.empty, self.bad))

    def refuse(self, k: int, why: str) -> None:
        if self.raising:
            self.fatal = k, why
            return
        self.bad += 1
        if len(self.messages) < _MAX_MESSAGES:
            self.messages.append((k, why))

    def result(self) -> ParsedBlock:
        k, off, nbytes, empty, bad = np.array(self.meta, dtype=np.int64).reshape(-1, 5).T
        return ParsedBlock(
            self.docs, k, off, nbytes, empty, bad, self.lines, self.empty, self.bad,
            self.messages, self.fatal,
        )  # fmt: skip
