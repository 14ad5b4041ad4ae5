"""Arrow IPC inputs read whole or refused: a stream must end with its end-of-stream marker, a
file must have its footer, and no table may name a column twice.

pyarrow reads an IPC *stream* until the bytes run out, so a stream cut at a message boundary
(a partial download of a Hugging Face ``datasets`` cache) reads as a shorter, valid table;
and an IPC *file* without its footer cannot be opened as a file. Both are refused here,
naming the file and its last complete record batch::

    t.arrow: Arrow IPC stream cut short: it ends after record batch 1 (rows 1-50) without
    its end-of-stream marker (an interrupted download or copy?)

The stream check follows the reader's position: after the last batch pyarrow yields, the
bytes left must be exactly the end-of-stream marker (``0xFFFFFFFF 0x00000000``, or the
4 zero bytes of the format before Arrow 0.15). Bytes after the marker (two streams
concatenated) are refused too: only the first would be read.

A table whose schema names a column twice (at the top, or two fields of one struct) is
ambiguous: which ``text`` is the text? (pyarrow's ``to_pylist`` keeps the last; some of its
conversions abort the process.) It is refused by :func:`check_schema` before a row is read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import IO, Any

from wdstream.errors import InputError

__all__ = ["check_schema", "ipc_batches"]

_FILE_MAGIC = b"ARROW1"
_EOS = (b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00")  # current, before 0.15


def check_schema(pa: Any, schema: Any, name: str) -> None:
    """Refuse a schema that names a column (or a struct's field) more than once.

    Raises:
        InputError: naming the file and the repeated column's dotted path.
    """
    todo: list[tuple[str, list[Any]]] = [("", list(schema))]
    while todo:
        prefix, fields = todo.pop()
        twice = [n for n, k in Counter(f.name for f in fields).items() if k > 1]
        if twice:
            raise InputError(
                f"{name}: the column {prefix + twice[0]!r} appears more than once in the "
                "table's schema: which one holds the record is ambiguous; rename or drop one"
            )
        for f in fields:
            t = f.type
            while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
                t = t.item_type if pa.types.is_map(t) else t.value_type
            if pa.types.is_struct(t):
                todo.append((f"{prefix}{f.name}.", [t.field(i) for i in range(t.num_fields)]))


def _rows(batches: int, rows: int, last: int) -> str:
    """The last complete batch, for a message (``record batch 2 (rows 51-100)``)."""
    if not batches:
        return "before its first record batch"
    return f"after record batch {batches} (rows {rows - last + 1}-{rows})"


def _stream(pa: Any, fh: IO[bytes], name: str, at: int, kind: str) -> tuple[Any, Iterator[Any]]:
    """``(schema, record batches)`` of the IPC stream starting at byte ``at`` of ``fh``; the
    batches refuse a stream that ends without its end-of-stream marker or is cut inside a
    message."""
    fh.seek(at)
    reader = pa.ipc.open_stream(fh)
    check_schema(pa, reader.schema, name)
    return reader.schema, _checked(pa, reader, fh, name, kind)


def _checked(pa: Any, reader: Any, fh: IO[bytes], name: str, kind: str) -> Iterator[Any]:
    batches = rows = last = 0
    end = fh.tell()
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as exc:
            raise InputError(
                f"{name}: Arrow IPC {kind} cut short or damaged {_rows(batches, rows, last)} "
                f"({exc}; an interrupted download or copy?)"
            ) from exc
        batches, last = batches + 1, batch.num_rows
        rows += last
        end = fh.tell()
        yield batch
    fh.seek(end)
    tail = fh.read(9)
    if tail in _EOS:
        return
    where = _rows(batches, rows, last)
    if any(eos.startswith(tail) for eos in _EOS):  # nothing, or part of the marker
        raise InputError(
            f"{name}: Arrow IPC {kind} cut short: it ends {where} without its end-of-stream "
            "marker (an interrupted download or copy?)"
        )
    if tail.startswith(_EOS[0]):
        raise InputError(
            f"{name}: Arrow IPC {kind}: more bytes follow its end-of-stream marker, {where} "
            "(two streams concatenated? only the first would be read)"
        )
    raise InputError(f"{name}: Arrow IPC {kind} damaged: what follows {where} is no Arrow "
                     "message and no end-of-stream marker")  # fmt: skip


def ipc_batches(pa: Any, fh: IO[bytes], name: str) -> tuple[Any, Iterator[Any]]:
    """``(schema, record batches)`` of the Arrow IPC file or stream ``fh``, each batch as
    stored; the file format by its footer, a stream checked to its end-of-stream marker.

    Raises:
        InputError: a file without its footer or a stream without its end (naming the last
            complete record batch), or a schema naming a column twice.
    """
    head = fh.read(len(_FILE_MAGIC))
    if head != _FILE_MAGIC:  # the stream format (datasets' caches)
        return _stream(pa, fh, name, 0, "stream")
    fh.seek(0)
    try:
        ipc = pa.ipc.open_file(fh)
    except pa.ArrowInvalid as exc:
        # The file format is its magic (8 bytes with padding), a stream, then the footer:
        # read the stream to say how far the file is whole, then refuse it.
        whole = _whole_batches(pa, fh, name)
        raise InputError(
            f"{name}: Arrow IPC file without a readable footer ({exc}): the file is cut "
            f"short (an interrupted download or copy?); it ends {whole}"
        ) from exc
    check_schema(pa, ipc.schema, name)
    return ipc.schema, (ipc.get_batch(i) for i in range(ipc.num_record_batches))


def _whole_batches(pa: Any, fh: IO[bytes], name: str) -> str:
    """Where the complete record batches at the start of a file-format file end."""
    sizes: list[int] = []
    try:
        _, batches = _stream(pa, fh, name, 8, "file")
        for batch in batches:
            sizes.append(batch.num_rows)
    except (InputError, pa.ArrowException):
        pass
    return _rows(len(sizes), sum(sizes), sizes[-1] if sizes else 0)
