"""Strict JSON for ``index.json``: what ``json.loads`` accepts but an index must not hold.

NaN and infinities, numbers of more than 40 characters and repeated keys are refused, each
with its key path (``json`` alone keeps the last of two keys and reads 4,300-digit
integers). Used by :meth:`wdstream.format.index.DatasetIndex.from_json` and
:func:`wdstream.format.index_head.parse_head`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from wdstream.format.index_rules import index_error, join_path, show_value

__all__ = ["StrictHooks", "parse_strict"]

_MAX_NUMBER_CHARS = 40  # a count has at most 20 digits; json alone would take 4300


@dataclass(frozen=True)
class _BadNumber:
    """A number JSON allows but an index must not hold: NaN, infinite, absurdly long."""

    text: str


class _DuplicateKeys(dict[str, Any]):
    """An object in which ``key`` appears more than once (json.loads keeps the last)."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


class StrictHooks:
    """``json.loads`` hooks that put a marker where a value must be refused.

    The hooks cannot know the key path, so they only mark; ``marked`` says whether a walk
    to find (and name) the first marker is needed, which keeps a clean index at ``json``
    speed.
    """

    def __init__(self) -> None:
        self.marked = False

    def number(self, text: str) -> _BadNumber:
        self.marked = True
        return _BadNumber(text)

    def integer(self, text: str) -> int | _BadNumber:
        return self.number(text) if len(text) > _MAX_NUMBER_CHARS else int(text)

    def real(self, text: str) -> float | _BadNumber:
        value = float(text)
        ok = len(text) <= _MAX_NUMBER_CHARS and math.isfinite(value)
        return value if ok else self.number(text)

    def object(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) == len(pairs):
            return obj
        self.marked = True
        counts = Counter(key for key, _ in pairs)
        return _DuplicateKeys(pairs, next(key for key, n in counts.items() if n > 1))


def parse_strict(text: str | bytes, where: str) -> Any:
    """``json.loads``, refusing NaN/Infinity, numbers of more than 40 characters and
    duplicate keys, each with its key path."""
    hooks = StrictHooks()
    try:
        obj = json.loads(
            text,
            parse_int=hooks.integer,
            parse_float=hooks.real,
            parse_constant=hooks.number,
            object_pairs_hook=hooks.object,
        )
    except RecursionError:
        raise index_error(where, "", "not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8/16/32
        raise index_error(where, "", f"not valid JSON ({exc})") from exc
    if hooks.marked:
        _refuse_first_marker(obj, where)
    return obj


def _refuse_first_marker(obj: Any, where: str) -> None:
    """Raise naming the key path of the first value the hooks marked (in document order)."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _BadNumber):
            raise index_error(
                where,
                path,
                f"expected a finite number of at most {_MAX_NUMBER_CHARS} characters, "
                f"got {show_value(value.text)}",
            )
        if isinstance(value, _DuplicateKeys):
            raise index_error(where, join_path(path, value.key), "key appears more than once")
        items = (
            value.items()
            if isinstance(value, dict)
            else enumerate(value)
            if isinstance(value, list)
            else ()
        )
        stack += reversed([(join_path(path, key), item) for key, item in items])
