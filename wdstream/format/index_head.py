"""The keys of ``index.json`` before its shard list, parsed without the list.

A pack writes ``index.json`` with ``shards`` last (:meth:`DatasetIndex.to_json`), so a
reader of a dataset with a shard table reads the first kilobytes of the file, parses the
summary from them and never fetches or parses the list (430 MB at 1,000,000 shards), which
stays in the file for people and for readers of earlier versions.

The top-level object is walked key by key with ``json``'s own scanner (``raw_decode``), so
strings that merely contain ``"shards"`` fool nothing; the values go through the same strict
hooks as a whole index (no NaN, no 41-digit numbers, no repeated keys).
"""

from __future__ import annotations

import json
from typing import Any

from wdstream.format.index_strict import StrictHooks

__all__ = ["parse_head"]

_SPACE = " \t\n\r"


def parse_head(text: bytes) -> dict[str, Any] | None:
    """The top-level keys of index.json text that precede ``"shards"``, when ``text`` (the
    file's first bytes) holds all of them, each well-formed and none repeated; None when it
    does not (no ``shards`` key, the text ends first, or anything a strict parse of the
    whole file must word), and the caller reads the whole file."""
    try:
        doc = text.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:  # cut inside a character, or not UTF-8
        doc = text[: exc.start].decode("utf-8") if exc.reason == "unexpected end of data" else ""
    hooks = StrictHooks()
    decoder = json.JSONDecoder(
        parse_float=hooks.real,
        parse_int=hooks.integer,
        parse_constant=hooks.number,
        object_pairs_hook=hooks.object,
    )
    at = _skip(doc, 0)
    if not doc.startswith("{", at):
        return None
    at += 1
    head: dict[str, Any] = {}
    while True:
        at = _skip(doc, at)
        try:
            key, at = decoder.raw_decode(doc, at)
        except (ValueError, RecursionError):
            return None
        at = _skip(doc, at)
        if type(key) is not str or not doc.startswith(":", at) or key in head:
            return None
        if key == "shards":
            return None if hooks.marked else head
        try:
            head[key], at = decoder.raw_decode(doc, _skip(doc, at + 1))
        except (ValueError, RecursionError):
            return None
        at = _skip(doc, at)
        if not doc.startswith(",", at):
            return None  # the object ends (or breaks) before any shard list
        at += 1


def _skip(doc: str, at: int) -> int:
    while at < len(doc) and doc[at] in _SPACE:
        at += 1
    return at
