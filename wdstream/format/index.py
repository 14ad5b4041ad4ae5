"""``index.json``: the dataset-level description a reader plans an epoch from.

Written last by the packer (its presence means the dataset is complete). Holds the format
version, the tokenizer (name, backend, hash of its ranks), special ids, the on-disk dtype,
the packing mode and sample length, and per shard its name, sidecar name, counts, size and
sha256. Everything a reader needs to split an epoch into equal parts across ranks and
workers is here, so planning needs no communication and no shard reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, overload

import numpy as np

from wdstream.format.entry import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_NAME,
    JOURNAL_NAME,
    READABLE_VERSIONS,
    ShardEntry,
)
from wdstream.format.index_checks import validate_index
from wdstream.format.index_columns import ShardColumns
from wdstream.format.index_rules import index_error, show_value
from wdstream.format.index_strict import StrictHooks, parse_strict
from wdstream.format.shard_table import ShardRows

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_NAME",
    "JOURNAL_NAME",
    "READABLE_VERSIONS",
    "DatasetIndex",
    "ShardEntry",
    "ShardTable",
]


@dataclass(frozen=True)
class DatasetIndex:
    """The parsed ``index.json`` of a packed dataset."""

    tokenizer: dict[str, Any]  # name, backend, ranks_sha256, n_vocab
    eos_id: int | None
    bos_id: int | None
    dtype: str  # on-disk token dtype: "uint16" or "uint32"
    # "concat" (fixed-length samples), "docs" (one document per sample) or "bestfit" (rows
    # of whole documents padded to sample_tokens, :mod:`wdstream.write.bestfit`)
    mode: str
    seq_len: int | None  # training rows the samples were sized for (concat, bestfit)
    sample_tokens: int | None  # tokens in every sample but concat's last (concat, bestfit)
    shards: Sequence[ShardEntry]  # a tuple, or from index.json a ShardTable
    stats: dict[str, Any] = field(default_factory=dict)  # skipped lines, empty docs, ...
    checksum: str | None = None  # per-sample checksum in the sidecars ("crc32c"; None in v1)
    version: int = FORMAT_VERSION
    format: str = FORMAT_NAME
    pad_id: int | None = None  # bestfit: the id of the padding at rows' ends (the EOS id)
    # "bit31": ids carry a loss mask in bit 31 (:mod:`wdstream.format.loss`); None: all loss
    loss_mask: str | None = None
    # The shard table beside index.json (:mod:`wdstream.format.shard_table`): its name,
    # length and sha256; None in datasets packed before it (they read the same, from JSON).
    shard_table: dict[str, Any] | None = None

    @property
    def total_samples(self) -> int:
        """Samples over all shards."""
        return _total(self.column("samples"))

    @property
    def total_tokens(self) -> int:
        """Tokens over all shards."""
        return _total(self.column("tokens"))

    @property
    def total_documents(self) -> int:
        """Documents over all shards."""
        return _total(self.column("documents"))

    def column(self, key: str) -> Sequence[Any] | np.ndarray:
        """Every shard's value of :class:`ShardEntry` field ``key``, in shard order (from
        ``index.json``'s :class:`ShardTable` without making entries; a count of a shard
        table is a read-only uint64 view of the mapped table)."""
        if isinstance(self.shards, ShardTable):
            return self.shards.column(key)
        return [getattr(s, key) for s in self.shards]

    def has_provenance(self) -> bool:
        """Every shard has a provenance table (a shard table says so in its flags: no pass
        over a million entries; the rules allow every shard or none)."""
        shards = self.shards
        if isinstance(shards, ShardTable) and shards.table is not None:
            return shards.table.provenance
        return all(s.provenance is not None for s in shards)

    def document_pieces(self, doc_lens: tuple[int, ...]) -> tuple[int, ...]:
        """A sample's document piece lengths: ``doc_lens`` less a best-fit row's last entry,
        which is its padding (``--mode bestfit``), not a document."""
        return doc_lens[:-1] if self.mode == "bestfit" else doc_lens

    def to_json(self) -> str:
        """Serialise with sorted keys but ``shards`` last, so equal datasets give
        byte-identical indexes and a reader of the shard table parses only the text before
        the shard list (:func:`parse_head`)."""
        obj = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "shards"}
        if self.version < 2:
            del obj["checksum"]  # v1 indexes have no such key
        for key in ("pad_id", "loss_mask", "shard_table"):
            if obj[key] is None:  # padding, a mask, a table: only datasets that have one
                del obj[key]
        obj = dict(sorted(obj.items()))
        obj["shards"] = [
            {k: v for k, v in asdict(s).items() if v is not None or k not in _OPTIONAL_SHARD_KEYS}
            for s in self.shards
        ]
        return json.dumps(obj, indent=1) + "\n"

    @classmethod
    def from_table(cls, head: dict[str, Any], rows: ShardRows, where: str) -> DatasetIndex:
        """The index of ``head`` (index.json's keys before its shard list) whose shards are
        the rows of its shard table, validated by every rule of :meth:`from_json`.

        Raises:
            IndexValidationError: naming ``where`` and the key (``shards[i].KEY`` for a
                row of the table).
        """
        _check_format_version(head, where)
        validate_index(head, where, table=rows)
        known = {k: head[k] for k in _INDEX_KEYS if k in head and k != "shards"}
        return cls(**{**known, "shards": ShardTable(rows)})

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "index.json") -> DatasetIndex:
        """Parse and validate ``index.json`` text.

        Every reader and tool opens a dataset through here, so an index that is not
        well-formed and internally consistent is refused before anything is read through
        it (rules: :mod:`wdstream.format.index_checks`, ``docs/FORMAT.md``). Keys this
        version does not know are ignored, so optional keys can be added.

        Raises:
            IndexValidationError: naming ``where`` and the offending key, e.g.
                ``data/index.json: shards[3].tokens: expected ..., got -1``.
        """
        clean = _parse_clean(text, where)
        if clean is None:  # a problem, or an unusual index: every check as written
            obj = parse_strict(text, where)
            _check_format_version(obj, where)
            columns = validate_index(obj, where)
        else:
            obj, columns = clean
        known = {k: obj[k] for k in _INDEX_KEYS if k in obj}
        if columns is not None and columns.known_keys_only:  # the parsed dicts as rows
            table = ShardTable(obj["shards"], columns.values)
        else:  # new dicts of the known keys (a later version's keys dropped)
            table = ShardTable([{k: s.get(k) for k in _SHARD_KEYS} for s in obj["shards"]])
        return cls(**{**known, "shards": table})


def _total(column: Sequence[Any] | np.ndarray) -> int:
    """The exact sum of a count column (a list, or a table's uint64 view: counts are
    below 2**48, so their sum over up to 2**15 shards fits; Python's sum past that)."""
    if isinstance(column, np.ndarray):
        step = 1 << 15
        return sum(
            int(column[i : i + step].sum(dtype=np.uint64)) for i in range(0, len(column), step)
        )
    return sum(column)


_SHARD_KEYS = tuple(f.name for f in fields(ShardEntry))
_OPTIONAL_SHARD_KEYS = ("provenance", "provenance_sha256")
_ABSENT: dict[str, Any] = dict.fromkeys(_OPTIONAL_SHARD_KEYS)
_N_FIELDS = len(_SHARD_KEYS)
_INDEX_KEYS = tuple(f.name for f in fields(DatasetIndex))


class ShardTable(Sequence[ShardEntry]):
    """The shard list of a parsed ``index.json``: its entries made as they are asked for.

    Opening a dataset of 100,000 shards must not make 100,000 :class:`ShardEntry` objects:
    each is an object the garbage collector tracks (the parsed dicts, holding only strings
    and numbers, are not), so they cost ~5 µs each to make and lengthen every full
    collection of the training process after. A reader asks for a few entries (the shards
    it reads) and for whole columns (:meth:`column`, made without entries). Otherwise it
    behaves as the tuple of entries: indexing, slices (tuples), iteration, equality.
    """

    __slots__ = ("_rows", "_columns")

    def __init__(
        self,
        rows: list[dict[str, Any]] | ShardRows,
        columns: dict[str, list[Any]] | None = None,
    ) -> None:
        """``rows``: one dict per shard holding :class:`ShardEntry`'s fields and no other
        key; an optional field it lacks is None. (Adding the absent keys to the parsed dicts
        cost more than the rest of opening an index of no provenance: each dict grows.)
        Or the dataset's shard table, whose rows are made as they are asked for.
        ``columns``: fields' columns already gathered (by validation), by key."""
        self._rows = rows
        self._columns = columns or {}

    @property
    def table(self) -> ShardRows | None:
        """The shard table these entries are read from (None: index.json's list)."""
        return self._rows if isinstance(self._rows, ShardRows) else None

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> ShardEntry: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[ShardEntry, ...]: ...
    def __getitem__(self, i: int | slice) -> ShardEntry | tuple[ShardEntry, ...]:
        if isinstance(i, slice):
            return tuple(map(_entry, self._rows[i]))
        return _entry(self._rows[i])

    def __iter__(self) -> Iterator[ShardEntry]:
        return map(_entry, self._rows)

    def column(self, key: str) -> Sequence[Any] | np.ndarray:
        """Every shard's value of field ``key``, in shard order (a new list; a count of a
        shard table: its read-only uint64 column)."""
        rows = self._rows
        if isinstance(rows, ShardRows):
            if key in rows.counts:
                return rows.counts[key]
            if key.endswith("sha256"):
                return rows.hex_column(key)
            return rows.name_column(key)
        if key in self._columns:
            return self._columns[key].copy()
        if key in _OPTIONAL_SHARD_KEYS:
            return [row.get(key) for row in self._rows]
        return [row[key] for row in self._rows]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (ShardTable, tuple)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"ShardTable({list(self)!r})"


def _entry(row: dict[str, Any]) -> ShardEntry:
    """A :class:`ShardEntry` whose ``__dict__`` is ``row``, completed with the optional
    fields it lacks (a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``: ~5 µs an entry)."""
    entry = object.__new__(ShardEntry)
    object.__setattr__(entry, "__dict__", row if len(row) == _N_FIELDS else _ABSENT | row)
    return entry


def _check_format_version(obj: Any, where: str) -> None:
    """Refuse what is not a wdstream index, or one of a version this code cannot read."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        got = obj.get("format") if isinstance(obj, dict) else obj
        raise index_error(
            where,
            "",
            f"not a wdstream index (format: expected {FORMAT_NAME!r}, got {show_value(got)})",
        )
    version = obj.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:  # type(): not True
        raise index_error(
            where,
            "version",
            f"format version {show_value(version)}, this wdstream reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}",
        )


# -- strict JSON: what json.loads accepts but an index must not hold -------------------------


def _parse_clean(text: str | bytes, where: str) -> tuple[dict[str, Any], ShardColumns] | None:
    """The index parsed with ``json``'s own integers and validated through the shard
    columns, when it is clean: nothing :func:`_parse_strict` refuses, and every shard of
    the columns' form; None otherwise, and the strict parse and the rules word the first
    problem as ever.

    The strict parse calls Python for every integer (four a shard, ~1 µs a shard of
    100,000) only to refuse those of more than 40 characters; the shards' integers are
    checked below 2**48 by the columns, and the few others are checked here.
    """
    hooks = StrictHooks()
    try:
        obj = json.loads(text, parse_float=hooks.real, parse_constant=hooks.number)
    except (RecursionError, ValueError):
        return None
    if hooks.marked or not isinstance(obj, dict) or not _short_integers(obj):
        return None
    try:
        _check_format_version(obj, where)
        columns = validate_index(obj, where)
    except Exception:  # any refusal: the strict path words it
        return None
    if columns is None or not columns.known_keys_only or not _keys_unique(text, obj, columns):
        return None
    return obj, columns


def _keys_unique(text: str | bytes, obj: dict[str, Any], columns: ShardColumns) -> bool:
    """No object of ``text`` repeats a key, told without a Python call per object (the
    strict parse's ``object_pairs_hook`` makes a list of pairs for each: ~0.7 µs a shard);
    False also when this cannot be told so cheaply (then the strict parse decides).

    Outside strings a colon in JSON only ends a key, and each colon inside a string
    decodes to one colon when no escape gives one (``\\u003a``). So the colons of the text
    are its keys, duplicates included, plus the colons of the strings, dropped duplicates'
    included; the parsed objects hold ``keys`` keys and ``colons`` colons in their strings.
    Equal counts leave no room for a dropped key. ``obj``'s shards are validated columns:
    their keys are the format's and their strings names and hashes, without colons.
    """
    if isinstance(text, bytes):
        if json.detect_encoding(text) != "utf-8":
            return False  # in UTF-16 or UTF-32 a 0x3A byte need not be a colon
        # numpy counts 3x faster than bytes.count; "\\" alone is a memchr, "\\u003" not
        marks = int(np.count_nonzero(np.frombuffer(text, dtype=np.uint8) == ord(":")))
        escape = b"\\" in text and b"\\u003" in text
    else:
        marks, escape = text.count(":"), "\\" in text and "\\u003" in text
    if escape:
        return False
    keys = len(obj) + columns.keys
    colons = 0
    stack = [*obj.keys(), *(v for k, v in obj.items() if k != "shards")]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            colons += value.count(":")
        elif isinstance(value, dict):
            keys += len(value)
            stack += value.keys()
            stack += value.values()
        elif isinstance(value, list):
            stack += value
    return marks == keys + colons


def _short_integers(obj: dict[str, Any]) -> bool:
    """No integer of more than 40 characters outside ``shards``."""
    stack = [value for key, value in obj.items() if key != "shards"]
    while stack:
        value = stack.pop()
        if type(value) is int and not -(10**39) < value < 10**40:
            return False
        if isinstance(value, dict):
            stack += value.values()
        elif isinstance(value, list):
            stack += value
    return True
