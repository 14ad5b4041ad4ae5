"""Pieces of the inputs one Ray task reads and tokenises: whole files, or byte ranges.

A piece is a whole input file, or, for a large uncompressed line file (JSONL, or ``.txt``
with ``lines``), a byte range of it. A range ``[start, end)`` holds the lines that *start*
in it, so consecutive ranges partition the file's lines whatever the cut offsets are::

    file      {"text": "a"}\\n{"text": "bb"}\\n{"text": "c"}\\n
    offsets   0             14               29
    ranges    [0, 20)        [20, 44)                        cut at 20: line 2 starts at 14
    lines     lines 1, 2     line 3                          (< 20), so it belongs to [0, 20)

A task knows where its lines start in bytes but not in lines (counting the lines before it
would read the file up to there), so it reports record numbers relative to its first line
and the driver, which sees the pieces in order, adds the lines of the pieces before. The
same holds for the reader's counters (empty documents, bad records, bytes read). Bad
records are reported as ``(line, why)`` for the same reason, and the driver writes the
message ``path:line: why`` that the local engine writes.

Documents are decided by the same code as the local engine: whole-file pieces are read by
:class:`~wdstream.inputs.DocumentReader` itself, ranges by its record parser
(``text_of``, ``decode_bytes``) over the range's lines.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from wdstream.errors import InputError
from wdstream.inputs import DocumentReader, InputFile, InputPosition
from wdstream.inputs.files import open_regular
from wdstream.inputs.lines import LongLine, bounded_lines, skip_line

__all__ = ["InputPiece", "PieceDocs", "read_piece", "split_pieces"]

_MAX_REPORTED = 10  # bad records a piece reports by line (the journal keeps 10 in all)


@dataclass(frozen=True)
class InputPiece:
    """One task's share of the inputs.

    Attributes:
        file: index into the expanded input list.
        start: byte offset the piece starts at (a range: its lines are those starting in
            ``[start, end)``; a resumed piece: the record to start at).
        end: end of the range, or None: to the end of the file.
        whole: read by :class:`DocumentReader` (compressed, whole ``.txt``, or small files);
            record numbers it reports are then the file's own.
        resume: the resumed pack's first record in this file (its counters start at 0).
        source_bytes: bytes of the file as stored that this piece accounts for (progress).
    """

    file: int
    start: int
    end: int | None
    whole: bool
    resume: InputPosition | None
    source_bytes: int


@dataclass
class PieceDocs:
    """What a piece's task found, without the tokens (the driver fetches only this).

    Per document (arrays of equal length): ``lens`` (tokens, BOS/EOS included),
    ``records`` (0-based, relative to the piece's first line unless the piece is whole),
    ``offsets`` (byte offset of the record in the decompressed file), and the counters
    before it, relative to the piece: ``empty``, ``bad``, ``input_bytes``.
    """

    lens: np.ndarray
    records: np.ndarray
    offsets: np.ndarray
    empty: np.ndarray
    bad: np.ndarray
    input_bytes: np.ndarray
    lines: int = 0  # lines of the piece (ranges only: what the next range's numbers add to)
    total_empty: int = 0
    total_bad: int = 0
    total_input_bytes: int = 0
    bad_lines: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, why)
    error_line: tuple[int, str] | None = None  # on_error="raise": the bad record (line, why)
    error: str | None = None  # any other InputError, its message already complete


def split_pieces(
    files: list[InputFile], piece_bytes: int, lines: bool, start: InputPosition | None
) -> list[InputPiece]:
    """Cut the inputs into pieces of at most about ``piece_bytes``, each file into equal parts
    (whole files below that size).

    Raises:
        InputError: for stdin, which cluster workers cannot read.
    """
    pieces: list[InputPiece] = []
    first = start.file if start is not None else 0
    for i in range(first, len(files)):
        f = files[i]
        if f.path == "-":
            raise InputError(
                "stdin cannot be read by Ray workers; write it to a file all nodes can read, "
                "or use --engine local"
            )
        resume = start if start is not None and i == start.file else None
        size = f.size or 0
        at = resume.offset if resume is not None else 0
        splittable = not f.path.endswith((".gz", ".zst")) and (lines or not f.is_text)
        if not splittable or size - at <= piece_bytes:
            pieces.append(InputPiece(i, at, None, True, resume, size - (at if splittable else 0)))
            continue
        # Equal parts of at most piece_bytes (not piece_bytes and a remainder): a short
        # last part per file only adds a task, and equal tasks leave the least idle tail.
        parts = -(-(size - at) // piece_bytes)
        cuts = [at + (size - at) * k // parts for k in range(parts)] + [size]
        for k, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
            pieces.append(InputPiece(i, a, b, False, resume if k == 0 else None, b - a))
    return pieces


class _PieceReader(DocumentReader):
    """A DocumentReader that reports bad records by line and reason instead of by message.

    Record numbers of a range are relative, so the message (which names the line) is
    written by the driver; the counting and the raise-or-skip choice stay the reader's.
    """

    reported: list[tuple[int, str]]  # the first bad records skipped: (line, why)

    def _bad(self, where: str, why: str) -> None:
        line = int(where.rsplit(":", 1)[1])  # text_of names records "path:line"
        if self.on_error == "raise":
            raise _BadRecord(line, why)
        self.bad += 1
        if len(self.reported) < _MAX_REPORTED:
            self.reported.append((line, why))


class _BadRecord(Exception):
    def __init__(self, line: int, why: str) -> None:
        super().__init__(line, why)
        self.line, self.why = line, why


def read_piece(
    files: list[InputFile],
    piece: InputPiece,
    text_key: str,
    lines: bool,
    on_error: str,
    errors: str,
    max_record_bytes: int,
) -> tuple[list[str], PieceDocs]:
    """Read one piece: its documents' texts and what the driver needs to place them.

    A line longer than ``max_record_bytes`` is a bad record, as in the local engine; one
    that starts in the range before and runs into this one is skipped over in chunks. A
    file that changed since the inputs were expanded (:meth:`InputFile.changed`) is an
    error once the piece is read: the ranges read before the change hold the old version.
    """
    reader = _PieceReader(
        [files[piece.file]], text_key, lines, on_error, errors, _origin(piece), [],
        max_record_bytes,
    )  # fmt: skip
    reader.reported = []
    texts: list[str] = []
    cols: list[list[int]] = [[], [], [], [], []]
    empty = np.zeros(0, np.int64)
    docs = PieceDocs(empty, empty, empty, empty, empty, empty)
    try:
        found = _whole(reader) if piece.whole else _range(reader, files[piece.file], piece)
        for text, pos in found:
            texts.append(text)
            for col, v in zip(cols, pos[1:6], strict=True):  # record .. input_bytes
                col.append(v)
    except _BadRecord as exc:
        docs.error_line = (exc.line, exc.why)
    except InputError as exc:
        docs.error = str(exc)
    note = files[piece.file].changed()  # a range is no whole file: _read_file never checks it
    if note is not None and (docs.error is None or note not in docs.error):
        docs.error = note if docs.error is None else f"{docs.error}; {note}"
        docs.error_line = None  # the bad record may be the change's: the note names the file
    docs.records, docs.offsets, docs.empty, docs.bad, docs.input_bytes = (
        np.asarray(c, dtype=np.int64) for c in cols
    )
    docs.lines = 0 if piece.whole else reader.lines_read  # ranges only, as documented
    docs.total_empty, docs.total_bad = reader.empty, reader.bad
    docs.total_input_bytes = reader.input_bytes
    docs.bad_lines = reader.reported
    return texts, docs


def _origin(piece: InputPiece) -> InputPosition:
    """Where the piece's reader starts, its counters at zero (the driver adds the rest)."""
    if piece.resume is not None and piece.whole:
        return InputPosition(0, piece.resume.record, piece.resume.offset, 0, 0, 0)
    return InputPosition(0, 0, 0, 0, 0, 0)  # not None: a reader of one piece must not judge
    # "nothing to pack", the whole input decides that


def _whole(reader: _PieceReader) -> Iterator[tuple[str, InputPosition]]:
    yield from reader


def _range(
    reader: _PieceReader, info: InputFile, piece: InputPiece
) -> Iterator[tuple[str, InputPosition]]:
    """The documents of the lines starting in ``[piece.start, piece.end)``, numbered from 0.

    Read by :meth:`DocumentReader.line_documents`, as whole files are (blank lines, the
    byte-order mark at offset 0, ``.txt`` lines), so a range yields what the whole file would.
    """
    assert piece.end is not None
    name = info.path
    try:
        fh = open_regular(name)
    except OSError as exc:
        raise InputError(f"{name}: cannot open ({exc.strerror})") from exc
    with fh:
        offset = piece.start
        if offset > 0 and piece.resume is None:  # the first line starting at or after start
            fh.seek(offset - 1)
            offset += skip_line(fh) - 1
        else:
            fh.seek(offset)
        found = bounded_lines(fh, reader.max_record_bytes, reader.on_error == "skip")
        lines = _lines_before(found, offset, piece.end)
        yield from reader.line_documents(lines, 0, name, info.is_text, 0, offset)


def _lines_before(
    found: Iterator[bytes | LongLine], offset: int, end: int
) -> Iterator[bytes | LongLine]:
    """The lines of ``found`` (starting at ``offset``) that start before ``end``."""
    while offset < end:
        raw = next(found, None)
        if raw is None:
            return
        offset += raw.size if isinstance(raw, LongLine) else len(raw)
        yield raw
