"""The shard list of ``index.json`` checked a column at a time: the fast path of validation.

An index lists every shard (100,000 of them is an ordinary dataset), and the rules of
:mod:`wdstream.format.index_rules` and :mod:`wdstream.format.index_checks` test one shard
at a time through a Python call per key and rule: tens of µs a shard, most of the time it
took to open a many-shard dataset. Here each key of the list is gathered into one column
and tested with a few whole-column operations in C (one regular expression over the names
joined by newlines, ``bytes.fromhex`` over the joined hashes, ``set(map(type, ...))``,
numpy comparisons of the counts), about 1 µs a shard::

    names   "data-000000.tar\\ndata-000001.tar\\n..."  one regex match; the packer's
            order: equal to "%s-%06d.tar\\n" % (prefix, i) joined; sidecars: the same with .idx
    counts  int64 arrays: bytes >= headers + data, tokens == samples x sample_tokens, ...

This path only *accepts*: every test here is as strict as the rule it stands for or
stricter, so whatever it accepts the per-shard rules accept too. Whatever it does not
accept (a broken index, or an unusual valid one: non-ASCII names, other tools' names)
goes through the per-shard rules, which find the first problem and word it; so every
message is the rules' own, whichever path ran (``tests/test_index_columns.py`` checks
that both paths agree on edited indexes).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from wdstream.format.index_rules import _SHARD, MAX_COUNT, MAX_NAME_BYTES
from wdstream.format.sample import DTYPES
from wdstream.format.tar import BLOCK

__all__ = ["ShardColumns", "shard_columns"]

_NAMES = ("name", "sidecar", "provenance")
_COUNTS = ("samples", "tokens", "documents", "bytes")
_HASHES = ("sha256", "sidecar_sha256", "provenance_sha256")
_OPTIONAL = ("provenance", "provenance_sha256")
_REQUIRED = tuple(k for k in (*_NAMES, *_COUNTS, *_HASHES) if k not in _OPTIONAL)
# The keys _SHARD has rules for: a key added there must be checked here too.
assert {r.key for r in _SHARD if r.required} == set(_REQUIRED)
assert {r.key for r in _SHARD if not r.required} == set(_OPTIONAL)
_SUFFIX = {"name": ".tar", "sidecar": ".idx", "provenance": ".prov"}
_LEAST = {"samples": 1, "tokens": 0, "documents": 0, "bytes": 2 * BLOCK}
# index_rules' _PLAIN_NAME with its end \Z a newline (no part "." or ".."), ending in the
# key's suffix; its length and character class are checked by max(len) and the parts.
_JOINED = {
    key: re.compile(
        rf"(?:(?:(?!\.\.?/)[\w.+=-]+/)*(?!\.\.?\n)[\w.+=-]+(?<={re.escape(suffix)})\n)*",
        re.ASCII,
    )
    for key, suffix in _SUFFIX.items()
}

_FIRST_PACKED = re.compile(r"(.+)-000000\.tar")  # the packer's first name, NAME-000000.tar


@dataclass(frozen=True)
class ShardColumns:
    """Every shard's values, one column per key, as accepted by :func:`shard_columns`.

    Attributes:
        values: per required key (every key but ``provenance``, ``provenance_sha256``),
            the shards' values in order.
        joined: per name key (``name``, ``sidecar``, ``provenance``), its values each
            followed by a newline ("" for an optional key no shard has).
        counts: ``samples``, ``tokens``, ``documents``, ``bytes``: int64 arrays.
        present: per optional key (``provenance``, ``provenance_sha256``), how many
            shards hold it.
        known_keys_only: no shard holds a key the format does not know.
        packed: every shard named ``NAME-{i:06d}.tar`` (sidecar ``.idx``), ``i`` its
            position: the packer's names.
        keys: the keys of all shards together.
    """

    values: dict[str, list[Any]]
    joined: dict[str, str]
    counts: dict[str, np.ndarray]
    present: dict[str, int]
    known_keys_only: bool
    packed: bool
    keys: int

    def names_unique(self) -> bool:
        """No name or sidecar listed twice (a name ends in .tar, a sidecar in .idx)."""
        names, sidecars = self.values["name"], self.values["sidecar"]
        return len(set(names)) == len(names) and len(set(sidecars)) == len(names)

    def in_pack_order(self) -> bool:
        """Every shard named ``NAME-{i:06d}.tar`` (sidecar ``.idx``), ``i`` its position:
        the packer's names, all of which the per-shard rule accepts."""
        return self.packed

    def provenance_everywhere(self) -> bool:
        """No shard has both provenance keys, or every shard has both, each table named
        after its shard."""
        if 0 in self.present.values():
            return True
        return (
            set(self.present.values()) == {len(self.values["name"])}
            and _renamed(self.joined["name"], "provenance") == self.joined["provenance"]
        )

    def counts_fit(self, mode: str, sample_tokens: int | None, dtype: str) -> bool:
        """Each shard's bytes hold its samples and tokens, documents fit, tokens fit the
        mode's sample length, and the dataset's totals stay below 2**48."""
        c = self.counts
        samples, tokens, documents = c["samples"], c["tokens"], c["documents"]
        data = np.maximum(BLOCK * samples, DTYPES[dtype].itemsize * tokens)
        if not np.all(c["bytes"] >= 2 * BLOCK + BLOCK * samples + data):
            return False
        if not np.all(documents <= tokens) or (mode == "docs" and (documents != samples).any()):
            return False
        if mode in ("concat", "bestfit"):
            st = int(sample_tokens or 0)
            if st < 1 or int(samples.max()) > (2**62) // st:
                return False  # samples x sample_tokens could pass int64: the rule decides
            full = samples * st
            whole = tokens == full
            if mode == "concat":  # the last sample may be short
                whole[-1] |= full[-1] - st < tokens[-1] < full[-1]
            if not whole.all():
                return False
        # Python's sum: exact however many shards (int64 could wrap past 2**15 of 2**48).
        return all(sum(c[key].tolist()) < MAX_COUNT for key in ("samples", "tokens", "documents"))

    def documents_total(self) -> int:
        """The sum of the shards' documents."""
        return int(sum(self.counts["documents"].tolist()))


def shard_columns(shards: list[Any]) -> ShardColumns | None:
    """The shard list's columns when every key of every shard passes its rule on the fast
    path (see the module docstring); None when the per-shard rules must decide.

    ``shards``: a non-empty list of dicts (the top-level rules check that first).
    """
    n = len(shards)
    try:
        columns = {key: [s[key] for s in shards] for key in _REQUIRED}
    except KeyError:
        return None  # a required key missing: the rules name it
    present = {k: sum(map(operator.contains, shards, repeat(k))) for k in _OPTIONAL}
    # An optional key's rule checks the shards that hold it.
    columns |= {
        k: [s[k] for s in shards] if present[k] == n else [s[k] for s in shards if k in s]
        for k in _OPTIONAL
    }
    joined = {}
    for key in _NAMES:
        text = _joined_names(columns[key])
        if text is None:
            return None
        joined[key] = text
    packer = _packer_names(columns["name"], joined["name"])
    renamed = {key: _renamed(joined["name"], key) if packer else "" for key in _NAMES}
    for key in _NAMES:
        # The packer's names are plain when the first is: the rest differ in digits only.
        one = packer and joined[key] == renamed[key]
        end = joined[key].find("\n") + 1 if one else len(joined[key])
        if not _JOINED[key].fullmatch(joined[key], 0, end):
            return None
    if not all(_hashes(columns[k]) for k in _HASHES):
        return None
    counts = {}
    for key in _COUNTS:
        column = columns[key]
        if set(map(type, column)) != {int}:  # type(): True is not an integer here
            return None
        try:
            counts[key] = np.array(column, dtype=np.int64)
        except OverflowError:
            return None
        if not (_LEAST[key] <= counts[key].min() and counts[key].max() < MAX_COUNT):
            return None
    if (counts["bytes"] % BLOCK).any():
        return None  # not a tar's size
    keys = sum(map(len, shards))
    known = keys == n * len(_REQUIRED) + sum(present.values())
    packed = packer and joined["sidecar"] == renamed["sidecar"]
    values = {key: columns[key] for key in _REQUIRED}
    return ShardColumns(values, joined, counts, present, known, packed, keys)


def _renamed(names: str, key: str) -> str:
    """Joined names (each followed by a newline, the only newlines) with ``.tar``
    replaced by ``key``'s suffix."""
    return names if key == "name" else names.replace(".tar\n", _SUFFIX[key] + "\n")


def _joined_names(names: list[Any]) -> str | None:
    """The names each followed by a newline, when every one is a string of at most 255
    characters without a newline; else None. (Whether they are plain names and end in
    their key's suffix is for ``_JOINED``.)"""
    if not names:
        return ""
    try:
        joined = "\n".join(names) + "\n"
    except TypeError:
        return None  # not all strings
    if joined.count("\n") != len(names) or max(map(len, names)) > MAX_NAME_BYTES:
        return None  # a newline inside a name, or too long
    return joined


def _packer_names(names: list[str], joined: str) -> bool:
    """Whether shard ``i`` is named ``NAME-{i:06d}.tar`` for every ``i``, as the packer
    names them (``joined``: the names each followed by a newline, the only newlines)."""
    first = _FIRST_PACKED.fullmatch(names[0])
    if first is None:
        return False
    n, width = len(names), len(names[0]) + 1
    if not 64 <= n <= 10**6 or len(joined) != n * width or not joined.isascii():
        form = first[1].replace("%", "%%") + "-%06d.tar\n"
        return "".join(map(form.__mod__, range(n))) == joined
    # Lines of one width (each ends in the newline checked below, and there are n): as a
    # byte matrix, every line is line 0 but for 6 digits that count 0, 1, 2, ...
    rows = np.frombuffer(joined.encode("ascii"), dtype=np.uint8).reshape(n, width)
    at = width - len("000000.tar\n")
    digits = rows[:, at : at + 6].astype(np.int64) - ord("0")
    return bool(
        (rows[:, :at] == rows[0, :at]).all()
        and (rows[:, at + 6 :] == rows[0, at + 6 :]).all()
        and ((digits >= 0) & (digits <= 9)).all()
        and (digits @ 10 ** np.arange(5, -1, -1) == np.arange(n)).all()
    )


def _hashes(hashes: list[Any]) -> bool:
    """Every value 64 lowercase hex digits: ``fromhex`` reads 32 bytes from each 64
    characters only when every character is a hex digit (it would skip whitespace)."""
    if not hashes:
        return True
    if set(map(type, hashes)) != {str} or set(map(len, hashes)) != {64}:
        return False
    joined = "".join(hashes)
    try:
        whole = len(bytes.fromhex(joined)) == 32 * len(hashes)
    except ValueError:
        return False
    return whole and joined.lower() == joined
