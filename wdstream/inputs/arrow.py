"""Parquet and Arrow IPC inputs: each row of the table is one record, streamed in batches.

A row is read as a JSON line is: its text under ``text_key`` (dotted keys reach into struct
columns), or with a :class:`~wdstream.inputs.records.RecordDocument` (pre-tokenized ids, ...)
the whole row as a dict. Rows are numbered from 1 in error messages and provenance, as lines
are: ``data.parquet:7`` is the file's 7th row, and ``wdstream explain`` names it so::

    data.parquet   row group 0: rows 1-1000   row group 1: rows 1001-2000 ...
    read           batches of BATCH_ROWS rows of the needed columns, one row group at a time

Memory is bounded by one row group's compressed column chunks plus one batch (Parquet), or
one stored record batch (Arrow IPC, file or stream format: Hugging Face ``datasets`` caches
are IPC streams). A text pack reads only the column holding the text; other document kinds
read whole rows. A row is a record of its Arrow bytes (``RecordBatch.nbytes`` of the row:
values, offsets, validity): one over ``max_record_bytes`` is a bad record (an InputError
naming ``file:row``, or skipped and counted), never made into Python objects.

Refused whole, naming the file (:mod:`wdstream.inputs.arrow_ipc`): an IPC stream without
its end-of-stream marker or an IPC file without its footer (cut short: the message names
the last complete record batch), and a table naming a column, or a struct's field, twice.

Positions (:class:`~wdstream.inputs.files.InputPosition`): ``record`` and ``offset`` are both
the 0-based row (a row has no byte offset). ``input_bytes`` counts each batch's Arrow bytes
(``RecordBatch.nbytes``) as the batch is read, and every row carries the count from before
its batch; a resumed read skips whole row groups (or stored batches) before the row, re-reads
the batch holding it and counts that batch again, so every counter continues exactly as an
uninterrupted read's. Batch boundaries are a function of the file alone (per row group,
every ``BATCH_ROWS`` rows; stored batches in IPC files), never of where a read started.

pyarrow is an optional dependency (``pip install 'wdstream[arrow]'``); without it an input of
these kinds is a one-line ImportError naming the extra.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any, Protocol

from wdstream.errors import InputError
from wdstream.inputs.arrow_ipc import check_schema, ipc_batches
from wdstream.inputs.files import InputPosition

__all__ = ["ARROW_SUFFIXES", "BATCH_ROWS", "arrow_documents", "is_arrow", "require_pyarrow"]

ARROW_SUFFIXES = (".parquet", ".arrow")
BATCH_ROWS = 1024  # rows per batch turned into Python objects at once


def is_arrow(path: str) -> bool:
    """Whether ``path`` names a Parquet or Arrow IPC input (by its suffix)."""
    return path.endswith(ARROW_SUFFIXES)


def require_pyarrow() -> Any:
    """The ``pyarrow`` module, with its ``parquet`` and ``ipc`` parts loaded.

    Raises:
        ImportError: pyarrow is not installed; the message names the extra to install.
    """
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet  # noqa: F401  (loads the submodule onto pyarrow)
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"Parquet and Arrow inputs need pyarrow ({exc.name} is missing): "
            "pip install 'wdstream[arrow]'"
        ) from None
    return pyarrow


class RowReader(Protocol):
    """What :func:`arrow_documents` needs of the reader it reads for (a
    :class:`~wdstream.inputs.records.DocumentReader`): its record rules and counters."""

    text_key: str
    document: Any
    empty: int
    bad: int
    input_bytes: int
    max_record_bytes: int

    def document_of(self, obj: Any, path: str, lineno: int) -> Any: ...

    def long_record(self, where: str, line: int) -> None: ...

    def counted(self, doc: Any, pos: InputPosition) -> Iterator[tuple[Any, InputPosition]]: ...


def arrow_documents(
    reader: RowReader, file: int, fh: IO[bytes], name: str, resume: InputPosition | None
) -> Iterator[tuple[Any, InputPosition]]:
    """The documents of the Parquet or Arrow IPC file ``fh`` (input ``file``, named ``name``),
    from row ``resume.record`` on, with their positions; counts into ``reader``.

    Raises:
        InputError: the file is not a readable table of its kind (names it and pyarrow's
            reason), or a bad row under ``on_error="raise"`` (names ``name:row``).
        ImportError: pyarrow is missing.
    """
    pa = require_pyarrow()
    first = resume.record if resume is not None else 0
    kind = "Parquet" if name.endswith(".parquet") else "Arrow IPC"
    try:
        read = _parquet_batches if kind == "Parquet" else _ipc_batches
        for row0, batch in read(pa, fh, name, reader, first):
            before = reader.input_bytes
            reader.input_bytes += batch.nbytes
            for lo in range(max(first - row0, 0), batch.num_rows, BATCH_ROWS):
                part = batch.slice(lo, BATCH_ROWS)
                long = _long_rows(part, reader.max_record_bytes)
                records = _records(part, reader, long)
                yield from _row_documents(reader, records, file, name, row0 + lo, before, long)
    except (pa.ArrowException, UnicodeDecodeError) as exc:
        # A string column holding bytes that are not UTF-8 (a damaged Arrow IPC file has no
        # checksum) fails as its batch becomes Python strings: the file is damaged.
        raise InputError(f"{name}: not a readable {kind} file ({exc})") from exc


def _row_documents(
    reader: RowReader,
    records: list[Any],
    file: int,
    name: str,
    row0: int,
    before: int,
    long: dict[int, int],
) -> Iterator[tuple[Any, InputPosition]]:
    """Documents of consecutive rows from ``row0`` on; ``before``: input bytes before their
    batch; ``long``: the rows over the record limit (their index: their Arrow bytes)."""
    for k, obj in enumerate(records):
        row = row0 + k
        pos = InputPosition(file, row, row, reader.empty, reader.bad, before)
        if k in long:  # over max_record_bytes: a bad record, never made a Python object
            reader.long_record(f"{name}:{row + 1}", long[k])
            continue
        doc = reader.document_of(obj, name, row + 1)
        if doc is None:
            continue
        yield from reader.counted(doc, pos)


def _columns(names: list[str], reader: RowReader) -> list[str] | None:
    """The columns a reader needs: a text pack only the text's top-level column (when the
    table has it; otherwise every column, so the error lists what the rows hold), any other
    kind of document whole rows (None)."""
    top = reader.text_key.split(".")[0]
    return [top] if reader.document is None and top in names else None


def _long_rows(batch: Any, limit: int) -> dict[int, int]:
    """The rows of ``batch`` whose Arrow bytes (their values, offsets and validity, as
    ``RecordBatch.nbytes`` counts a one-row slice) exceed ``limit``: ``{index: bytes}``.
    A batch within the limit as a whole has none, so rows are measured one by one only in
    a batch that holds more than ``limit`` bytes."""
    if batch.nbytes <= limit:
        return {}
    sizes = ((k, batch.slice(k, 1).nbytes) for k in range(batch.num_rows))
    return {k: n for k, n in sizes if n > limit}


def _records(batch: Any, reader: RowReader, long: dict[int, int]) -> list[Any]:
    """The rows of ``batch`` as dicts of their (selected) columns; a row of ``long`` (over
    the record limit) as None, never turned into Python objects."""
    if long:
        keep = [k for k in range(batch.num_rows) if k not in long]
        kept = iter(_records(batch.take(keep), reader, {}) if keep else [])
        return [None if k in long else next(kept) for k in range(batch.num_rows)]
    if reader.document is None and batch.num_columns == 1:
        key = batch.schema.names[0]
        if key == reader.text_key.split(".")[0]:
            return [{key: v} for v in batch.column(0).to_pylist()]
    rows: list[Any] = batch.to_pylist()
    return rows


def _parquet_batches(
    pa: Any, fh: IO[bytes], name: str, reader: RowReader, first: int
) -> Iterator[Any]:
    """``(first row, batch)`` of a Parquet file, one row group at a time, from the batch
    holding row ``first`` on (row groups wholly before it are not read)."""
    # A page written with a CRC (write_page_checksum=True) is checked: a flipped bit in it is
    # an error naming the file, not other text packed (pyarrow checks none by default).
    pf = pa.parquet.ParquetFile(fh, page_checksum_verification=True)
    check_schema(pa, pf.schema_arrow, name)
    columns = _columns(pf.schema_arrow.names, reader)
    meta, start = pf.metadata, 0
    for g in range(meta.num_row_groups):
        rows = meta.row_group(g).num_rows
        if start + rows <= first:
            start += rows
            continue
        row = start
        for batch in pf.iter_batches(
            batch_size=BATCH_ROWS, row_groups=[g], columns=columns, use_threads=False
        ):
            if row + batch.num_rows > first:  # batches before the resume row were counted
                yield row, batch
            row += batch.num_rows
        start += rows


def _ipc_batches(pa: Any, fh: IO[bytes], name: str, reader: RowReader, first: int) -> Iterator[Any]:
    """``(first row, batch)`` of an Arrow IPC file (random-access format) or stream, one
    stored record batch at a time, from the batch holding row ``first`` on; a stream cut
    short or a file without its footer is refused (:mod:`wdstream.inputs.arrow_ipc`)."""
    schema, stored = ipc_batches(pa, fh, name)
    columns = _columns(schema.names, reader)
    row = 0
    for batch in stored:
        if row + batch.num_rows > first:
            yield row, batch if columns is None else batch.select(columns)
        row += batch.num_rows
