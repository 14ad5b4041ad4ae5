"""One record's document, as a pure function: the JSON parsing and checks of every reader.

:class:`RecordParser` says what a JSON line (or a Parquet row, a record given from Python)
holds: its document, or why it is a bad record. It keeps no counters and raises nothing, so
the same code runs in the reading process (:class:`~wdstream.inputs.records.DocumentReader`
counts and raises) and in a pack's tokenizer workers, which parse whole blocks of raw lines
(:mod:`wdstream.inputs.blocks`) so the packing process never parses JSON.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["RecordDocument", "RecordParser"]

_MAX_KEYS = 8  # keys an error lists when the text field is missing
# A lone UTF-16 surrogate comes from a \uD800-\uDFFF escape in the JSON (UTF-8 decoding never
# yields one); UTF-8 cannot encode it, so no tokenizer takes it.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


class RecordDocument(Protocol):
    """Turns one parsed JSON record into the document a pack's encoder takes (pre-tokenized
    ids and mask, a conversation, ...), instead of the text under ``text_key``.

    Raises ValueError saying what is wrong with a record; the reader makes that a bad
    record naming file and line. The document needs a ``len()`` (0: an empty document,
    skipped and counted like empty text).
    """

    def __call__(self, record: Any) -> Any: ...


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


@dataclass(frozen=True)
class RecordParser:
    """What a record holds (see the module docstring). Picklable: it crosses to workers.

    Args:
        text_key: JSON field holding the text; dots reach into nested objects.
        errors: ``"strict"`` (a lone surrogate is a bad record) or ``"replace"`` (U+FFFD).
        document: what each record's document is; None: the text at ``text_key``.
    """

    text_key: str = "text"
    errors: str = "strict"
    document: RecordDocument | None = None

    def line(self, line: str) -> tuple[Any, str | None]:
        """``(document, None)`` of one JSON line (its newline kept, for json's messages),
        or ``(None, why)`` when it is not JSON Python can load (malformed, nested deeper
        than the recursion limit, an integer longer than Python's digit limit) or
        :meth:`record` refuses it."""
        try:
            obj: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            return None, f"malformed JSON ({_json_problem(exc, line)})"
        except RecursionError:
            return None, "JSON nested too deeply to parse (Python's recursion limit)"
        except ValueError:  # the only other one json raises: an integer over the digit limit
            limit = sys.get_int_max_str_digits()
            return None, f"JSON integer longer than Python's limit of {limit:,} digits"
        return self.record(obj)

    def record(self, obj: Any) -> tuple[Any, str | None]:
        """``(document, None)`` of one parsed record, or ``(None, why)``: no text field, a
        field that is not a string or holds a lone surrogate; with :attr:`document`, what
        that refuses."""
        if self.document is not None:
            try:
                return self.document(obj), None
            except ValueError as exc:
                return None, str(exc)
        keys = self.text_key.split(".")
        for depth, key in enumerate(keys):
            if not isinstance(obj, dict) or key not in obj:
                owner = repr(".".join(keys[:depth])) if depth else "the record"
                return None, f"no text field {self.text_key!r} ({_keys_found(obj, owner)})"
            obj = obj[key]
        if not isinstance(obj, str):
            return None, f"text field {self.text_key!r} is {type(obj).__name__}, not a string"
        if not obj.isascii():  # O(1), and ASCII text cannot hold a surrogate
            return self.checked_text(obj)
        return obj, None

    def checked_text(self, text: str) -> tuple[str | None, str | None]:
        """``(text, None)``, unless it holds a lone surrogate: then ``(None, why)``, or with
        ``errors="replace"`` the text with U+FFFD for it."""
        try:
            text.encode("utf-8")  # several times faster than a regex search for one
        except UnicodeEncodeError as exc:
            if self.errors == "replace":
                return _SURROGATE.sub("\ufffd", text), None
            return None, (
                f"text field {self.text_key!r} holds a lone surrogate "
                f"\\u{ord(text[exc.start]):04x} at character {exc.start} (half of a UTF-16 pair, "
                "not text UTF-8 can encode; use errors='replace' / --errors replace to "
                "substitute U+FFFD)"
            )
        return text, None
