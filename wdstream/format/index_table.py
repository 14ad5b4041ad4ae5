"""The shard table (:mod:`wdstream.format.shard_table`) checked by the rules of ``index.json``.

A table's shards must pass exactly the rules a JSON shard list passes
(:mod:`wdstream.format.index_checks`), with the same messages, and at 1,000,000 shards in
well under a second: so, as for a clean JSON list (:mod:`wdstream.format.index_columns`),
whole columns are tested at once and a rule runs shard by shard only to word a problem.
Fixed-width columns make most rules free: a hash column is 32 bytes a shard (always 64
hex digits), and names under the packer's rule (``NAME-{i:06d}``) are plain, unique and in
pack order as soon as the first one is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wdstream.format.index_columns import _LEAST, ShardColumns
from wdstream.format.index_rules import _SHARD, MAX_COUNT, _check_keys
from wdstream.format.shard_table import COUNTS, ShardRows
from wdstream.format.tar import BLOCK

__all__ = ["TableColumns", "table_columns"]


@dataclass(frozen=True)
class TableColumns(ShardColumns):
    """:class:`ShardColumns` of a shard table: the name tests read the table's names."""

    rows: ShardRows | None = None

    def names_unique(self) -> bool:
        """Unique by the rule; listed names are compared."""
        assert self.rows is not None
        if self.rows.prefix is not None:
            return True
        names, sidecars = self.rows.name_column("name"), self.rows.name_column("sidecar")
        return len(set(names)) == len(names) and len(set(sidecars)) == len(names)

    def in_pack_order(self) -> bool:
        """In pack order by the rule; listed names go through the rule shard by shard."""
        assert self.rows is not None
        return self.rows.prefix is not None

    def provenance_everywhere(self) -> bool:
        """Every shard or none has a table (the format's flag); named after the shard."""
        assert self.rows is not None
        return self.rows.prefix is not None or not self.rows.provenance


def table_columns(rows: ShardRows, where: str) -> TableColumns:
    """The columns of ``rows`` after the per-key rules: every count in its range, the
    first shard's names (all of them when listed) plain names of their suffix.

    Raises:
        IndexValidationError: the first shard breaking a per-key rule, worded by the rule
            (``WHERE: shards[i].KEY: expected ..., got ...``).
    """
    n = len(rows)
    counts = {key: rows.counts[key] for key in COUNTS}
    fits = (
        all(
            _LEAST[key] <= int(column.min()) and int(column.max()) < MAX_COUNT
            for key, column in counts.items()
        )
        and not (counts["bytes"] % BLOCK).any()
    )
    if not fits or rows.prefix is None:  # word the first problem, or check every name
        for i in range(n):
            _check_keys(rows.row(i), _SHARD, f"shards[{i}]", where)
    else:
        _check_keys(rows.row(0), _SHARD, "shards[0]", where)  # the rest differ in digits
    signed = {key: column.astype(np.int64) for key, column in counts.items()}
    present = dict.fromkeys(("provenance", "provenance_sha256"), n if rows.provenance else 0)
    return TableColumns(
        values={},
        joined={},
        counts=signed,
        present=present,
        known_keys_only=True,
        packed=rows.prefix is not None,
        keys=0,
        rows=rows,
    )
