"""Records given from Python: any iterable of texts, dicts or token ids, read as a pack's input.

:func:`wdstream.pack_records` and :class:`wdstream.Writer` read through a
:class:`RecordReader`, the :class:`~wdstream.inputs.records.DocumentReader` of one iterable
(a list, a generator, a Hugging Face ``datasets.Dataset`` or ``IterableDataset``: any
iterable of the records below). Each record is one document::

    "some text"                           text (a text pack)
    {"text": "...", "id": 7}              the text under text_key, as a JSON line's
    {"input_ids": [...], "loss_mask": ..} pre-tokenized (pretokenized=True), as a JSON line's
    [9906, 1917] / np.array([...])        token ids (pretokenized=True, no mask)

A text (a str record, or the text a dict holds) longer than ``max_record_bytes`` in UTF-8 is
a bad record, as a JSON line that long is: refused naming it, or skipped and counted, never
tokenised (a 300 MB string would otherwise be tokenised for minutes).

A record is named by its 1-based number in the iterable: ``<records>:12`` (or the source
name given) in errors, skipped-record lists and provenance (``wdstream explain``), as
``file:line`` names a JSON line. Its :class:`~wdstream.inputs.files.InputPosition` has
``record`` and ``offset`` both the 0-based number; ``input_bytes`` counts the UTF-8 bytes
of text documents (a record has no bytes of its own; token ids count none).

Resume: a reader started at a position skips that many records of the iterable unread, so
an interrupted pack resumes when the caller gives the **same records again** in the same
order (a re-iterable input, or the same generator re-created). Only the position is
checked (a record must be there, and hold at least the tokens already packed of it); a
changed iterable is otherwise not detected.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wdstream.errors import InputError
from wdstream.inputs.files import InputFile, InputPosition
from wdstream.inputs.lines import LongLine
from wdstream.inputs.pretokenized import TokenFields
from wdstream.inputs.records import DocumentReader

__all__ = ["RECORDS_NAME", "RecordReader"]

RECORDS_NAME = "<records>"


def _utf8_bytes(text: str, limit: int) -> int | LongLine:
    """The UTF-8 size of ``text``, or, for a text of more characters than ``limit`` bytes
    that is not ASCII, a :class:`LongLine` of its characters (a lower bound; it is not
    encoded only to be refused)."""
    if text.isascii():
        return len(text)
    if len(text) > limit:
        return LongLine(len(text), False)
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass
class RecordReader(DocumentReader):
    """Iterate ``(document, InputPosition)`` over the non-empty documents of ``records``.

    Takes :class:`DocumentReader`'s arguments (``files`` is the one pseudo-file naming the
    records, see :meth:`of`) plus ``records``.
    """

    records: Iterable[Any] = field(default_factory=tuple)

    @classmethod
    def of(cls, records: Iterable[Any], name: str = RECORDS_NAME, **options: Any) -> RecordReader:
        """A reader of ``records`` named ``name``; ``options`` as :class:`DocumentReader`'s."""
        return cls([InputFile(name)], records=records, **options)

    def __iter__(self) -> Iterator[tuple[Any, InputPosition]]:
        start = self.start or InputPosition(0, 0, 0, 0, 0, 0)
        name = self.files[0].path
        records = iter(self.records)
        # Resume: the records before the position were packed; consumed without a look.
        if sum(1 for _ in itertools.islice(records, start.record)) < start.record:
            return  # fewer records than before: the pack reports the input changed
        for n, record in enumerate(records, start.record):
            pos = InputPosition(0, n, n, self.empty, self.bad, self.input_bytes)
            self.lines_read = n + 1
            doc = self._document(record, name, n + 1)
            if doc is None:
                continue
            if isinstance(doc, str):
                size = _utf8_bytes(doc, self.max_record_bytes)
                self.input_bytes += size if isinstance(size, int) else size.size
                if not isinstance(size, int) or size > self.max_record_bytes:
                    self.long_record(f"{name}:{n + 1}", size)  # never tokenised
                    continue
            yield from self.counted(doc, pos)
        if not self.documents and self.bad and self.start is None:
            raise InputError(self._nothing_left())

    def block_parser(self) -> None:
        """None: records are documents already, never raw lines (iterate instead)."""
        return None

    def _document(self, record: Any, name: str, number: int) -> Any:
        """The document of one record (see the module docstring), or None for a bad one
        that ``on_error`` skips."""
        where = f"{name}:{number}"
        if isinstance(record, str):
            if self.document is None:
                return (
                    record if record.isascii() else self._without_surrogates(record, name, number)
                )
            self._bad(where, "a str record is text, but this pack reads pre-tokenized records")
            return None
        if isinstance(record, Mapping):
            obj = record if type(record) is dict else dict(record)
            return self.document_of(obj, name, number)
        if isinstance(record, (list, tuple, np.ndarray)):
            if not isinstance(self.document, TokenFields):
                self._bad(where, "a record of token ids, but this pack reads text: "
                          "pass pretokenized=True")  # fmt: skip
                return None
            ids = list(record) if isinstance(record, tuple) else record
            return self.document_of({self.document.ids_key: ids}, name, number)
        what = type(record).__name__
        self._bad(where, f"a record of type {what}, not text (str), a dict or token ids")
        return None
