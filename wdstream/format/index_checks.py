"""The rules a parsed ``index.json`` must satisfy before anything is read through it.

``index.json`` decides what every reader reads: which objects (shard and sidecar names), how
many samples and tokens an epoch plan counts on, the dtype and the sample length. A wrong
value does not fail loudly: a reduced ``tokens`` or two swapped entries give different
batches, ``../x.tar`` reads from outside the dataset. So :meth:`DatasetIndex.from_json`
refuses an index that is not well-formed and internally consistent; checks against the
bytes themselves (sha256, sidecar counts, sample keys) are the readers' and
``wdstream verify``'s. After the strict JSON parse and the format/version check of
:mod:`wdstream.format.index`, two layers, each a table:

1. One rule per key (``_TOP``, ``_TOKENIZER``, ``_SHARD``, ``_STATS``, in
   :mod:`wdstream.format.index_rules` with the message helpers): presence, JSON type
   (``true`` is not an integer, ``1.0`` is not an integer) and range.
2. Rules across keys (``_ACROSS``): checksum per version, ``sample_tokens == seq_len + 1``,
   ``pad_id`` (best-fit only, equal to ``eos_id``), ids within the dtype, per-shard counts
   (concat: ``samples x sample_tokens`` tokens, the last shard possibly short by less than
   one sample; bestfit: exactly ``samples x sample_tokens``), unique names, pack order.

Every failure is one :class:`~wdstream.errors.IndexValidationError` reading
``WHERE: KEY.PATH: expected ..., got VALUE``; a rule across keys names every key involved.
Unknown keys are not refused, so optional keys can be added without a version bump.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wdstream.format.checksum import CHECKSUM_NAME
from wdstream.format.index_columns import ShardColumns, shard_columns
from wdstream.format.index_rules import (
    _PACKED_NAME,
    _SHARD,
    _STATS,
    _TOKENIZER,
    _TOP,
    MAX_COUNT,
    _check_keys,
    index_error,
    show_value,
)
from wdstream.format.index_table import table_columns
from wdstream.format.sample import DTYPES
from wdstream.format.shard_table import ShardRows
from wdstream.format.tar import BLOCK

__all__ = ["validate_index"]


# -- 2. rules across keys ------------------------------------------------------------------

_Problem = tuple[str, str] | None  # (key path, what is wrong)


def _checksum_fits_version(obj: dict[str, Any]) -> _Problem:
    version, checksum = obj["version"], obj.get("checksum")
    if version >= 2 and checksum != CHECKSUM_NAME:
        got = "it is missing" if "checksum" not in obj else f"got {show_value(checksum)}"
        return "checksum", f"expected {CHECKSUM_NAME!r} in a version {version} index, {got}"
    if version == 1 and checksum is not None:
        return "checksum", f"expected none in a version 1 index, got {show_value(checksum)}"
    return None


def _lengths_fit_mode(obj: dict[str, Any]) -> _Problem:
    mode, seq_len, sample_tokens = obj["mode"], obj["seq_len"], obj["sample_tokens"]
    if mode == "docs":
        if sample_tokens is not None:
            return "sample_tokens", f"expected null when mode is 'docs', got {sample_tokens}"
        return None
    if seq_len is None:
        return "seq_len", f"expected an integer when mode is {mode!r}, got null"
    if sample_tokens != seq_len + 1:
        return "sample_tokens", (
            f"expected seq_len + 1 = {seq_len + 1} when mode is {mode!r}, "
            f"got {show_value(sample_tokens)}"
        )
    return None


def _pad_fits_mode(obj: dict[str, Any]) -> _Problem:
    # Best-fit rows end in padding; readers find it as the row's trailing run of pad_id
    # after its last document's EOS, so the pad id is the EOS id (wdstream.read.batches.rows).
    mode, pad_id, eos_id = obj["mode"], obj.get("pad_id"), obj["eos_id"]
    if mode != "bestfit":
        if pad_id is not None:
            return "pad_id", f"expected none when mode is {mode!r} (no padding), got {pad_id}"
        return None
    if eos_id is None:
        return "eos_id", "expected an id when mode is 'bestfit' (documents end with EOS), got null"
    if pad_id != eos_id:
        return "pad_id", (
            f"expected eos_id = {eos_id} when mode is 'bestfit', got {show_value(pad_id)}"
        )
    return None


def _ids_fit_dtype(obj: dict[str, Any]) -> _Problem:
    dtype, n_vocab = obj["dtype"], obj["tokenizer"]["n_vocab"]
    ids = 1 << (8 * DTYPES[dtype].itemsize)
    if n_vocab > ids:
        return (
            "tokenizer.n_vocab",
            f"expected <= {ids} (ids that fit dtype {dtype!r}), got {n_vocab}",
        )
    if obj.get("loss_mask") is not None and dtype != "uint32":
        # The mask is bit 31 of each stored id (wdstream.format.loss).
        return "dtype", f"expected 'uint32' when loss_mask is set, got {dtype!r}"
    eos_id, bos_id = obj["eos_id"], obj["bos_id"]
    if eos_id is not None and eos_id >= n_vocab:
        return "eos_id", f"expected an id below tokenizer.n_vocab = {n_vocab}, got {eos_id}"
    # An id outside the vocabulary is no token (pack --bos-id refuses one since issue 33).
    if bos_id is not None and bos_id >= n_vocab:
        return "bos_id", f"expected an id below tokenizer.n_vocab = {n_vocab}, got {bos_id}"
    return None


def _shard_counts(obj: dict[str, Any]) -> _Problem:
    shards, mode, sample_tokens = obj["shards"], obj["mode"], obj["sample_tokens"]
    totals = dict.fromkeys(("samples", "tokens", "documents"), 0)
    for i, shard in enumerate(shards):
        problem = _shard_size(shard, i, obj["dtype"]) or _shard_documents(shard, i, mode)
        if problem is None and mode == "concat":
            problem = _concat_tokens(shard, i, sample_tokens, last=i == len(shards) - 1)
        if problem is None and mode == "bestfit":  # every row padded to sample_tokens
            problem = _concat_tokens(shard, i, sample_tokens, last=False)
        if problem:
            return problem
        for key in totals:
            totals[key] += shard[key]
            if totals[key] >= MAX_COUNT:
                return f"shards[{i}].{key}", (
                    f"brings the dataset's {key} to {totals[key]}, expected < 2**48"
                )
    return None


# The three rules below run for every shard: key paths are formatted only for a message.


def _shard_size(shard: dict[str, Any], i: int, dtype: str) -> _Problem:
    # Each sample is a 512-byte header and at least one data block holding its tokens.
    samples, tokens = shard["samples"], shard["tokens"]
    least = 2 * BLOCK + BLOCK * samples + max(BLOCK * samples, DTYPES[dtype].itemsize * tokens)
    if shard["bytes"] >= least:
        return None
    at = f"shards[{i}]"
    return f"{at}.bytes", (
        f"expected >= {least} for {at}.samples = {samples} samples holding {at}.tokens = "
        f"{tokens} tokens of dtype {dtype!r} (headers, data, end marker), got {shard['bytes']}"
    )


def _shard_documents(shard: dict[str, Any], i: int, mode: str) -> _Problem:
    samples, tokens, documents = shard["samples"], shard["tokens"], shard["documents"]
    if documents > tokens:
        return f"shards[{i}].documents", (
            f"expected <= shards[{i}].tokens = {tokens} (every document has a token), "
            f"got {documents}"
        )
    if mode == "docs" and documents != samples:
        return f"shards[{i}].documents", (
            f"expected shards[{i}].samples = {samples} (one document per sample when mode is "
            f"'docs'), got {documents}"
        )
    return None


def _concat_tokens(shard: dict[str, Any], i: int, sample_tokens: int, last: bool) -> _Problem:
    samples, tokens = shard["samples"], shard["tokens"]
    full = samples * sample_tokens
    if tokens == full or (last and full - sample_tokens < tokens < full):
        return None
    product = f"shards[{i}].samples x sample_tokens = {samples} x {sample_tokens}"
    if not last:
        return f"shards[{i}].tokens", f"expected {product} = {full}, got {tokens}"
    return f"shards[{i}].tokens", (
        f"expected {full - sample_tokens + 1}..{full} in the last shard ({product}, its "
        f"last sample possibly short), got {tokens}"
    )


def _names_unique(obj: dict[str, Any]) -> _Problem:
    seen: dict[str, str] = {}
    for i, shard in enumerate(obj["shards"]):
        for key in ("name", "sidecar"):
            at = f"shards[{i}].{key}"
            first = seen.setdefault(shard[key], at)
            if first != at:
                return at, f"{show_value(shard[key])} is listed twice (also {first})"
    return None


def _names_in_pack_order(obj: dict[str, Any]) -> _Problem:
    # The packer names shard i NAME-{i:06d}.tar with sidecar NAME-{i:06d}.idx: a name of
    # that form anywhere else is a swapped, repeated or spliced-in entry.
    origin: tuple[str, int] | None = None
    for i, shard in enumerate(obj["shards"]):
        match = _PACKED_NAME.fullmatch(shard["name"])
        if match is None:
            continue
        origin = origin or (match[1], i)
        prefix, first = origin
        tar, idx = f"{prefix}-{i:06d}.tar", f"{prefix}-{i:06d}.idx"
        if shard["name"] != tar:
            return f"shards[{i}].name", (
                f"expected {tar!r} (NAME-NNNNNN.tar shards are numbered by their position, "
                f"NAME as in shards[{first}].name), got {show_value(shard['name'])}"
            )
        if shard["sidecar"] != idx:
            return f"shards[{i}].sidecar", (
                f"expected {idx!r} (the sidecar of shards[{i}].name), "
                f"got {show_value(shard['sidecar'])}"
            )
    return None


def _provenance_everywhere(obj: dict[str, Any]) -> _Problem:
    # Provenance is optional, but a dataset has it for every shard or for none (lookups
    # number documents across shards), and a table is named after its shard like a sidecar.
    keys = ("provenance", "provenance_sha256")
    has = [all(k in shard for k in keys) for shard in obj["shards"]]
    first = has.index(True) if any(has) else None  # once: this loop runs for every shard
    for i, shard in enumerate(obj["shards"]):
        if first is None:
            break
        missing = [k for k in keys if k not in shard]
        if missing:
            return f"shards[{i}].{missing[0]}", (
                f"missing (shards[{first}] has provenance: every shard or none)"
            )
        if has[i] and shard["provenance"] != shard["name"].removesuffix(".tar") + ".prov":
            return f"shards[{i}].provenance", (
                f"expected {shard['name'].removesuffix('.tar') + '.prov'!r} (the table of "
                f"shards[{i}].name), got {show_value(shard['provenance'])}"
            )
    return None


def _stats_documents(obj: dict[str, Any]) -> _Problem:
    stats = obj.get("stats", {})
    total = sum(shard["documents"] for shard in obj["shards"])
    if "documents" in stats and stats["documents"] != total:
        return "stats.documents", (
            f"expected the sum of shards[*].documents = {total}, got {stats['documents']}"
        )
    return None


def _stats_fit(obj: dict[str, Any], columns: ShardColumns) -> bool:
    stats = obj.get("stats", {})
    return "documents" not in stats or stats["documents"] == columns.documents_total()


_Passes = Callable[[dict[str, Any], ShardColumns], bool]
# Each rule, and where the shard columns have one, a test that passes only what the rule
# passes (wdstream.format.index_columns): the rule itself then runs only to word a problem.
_ACROSS: tuple[tuple[Callable[[dict[str, Any]], _Problem], _Passes | None], ...] = (
    (_checksum_fits_version, None),
    (_lengths_fit_mode, None),
    (_pad_fits_mode, None),
    (_ids_fit_dtype, None),
    (_names_unique, lambda obj, c: c.names_unique()),
    (_names_in_pack_order, lambda obj, c: c.in_pack_order()),
    (_provenance_everywhere, lambda obj, c: c.provenance_everywhere()),
    (_shard_counts, lambda obj, c: c.counts_fit(obj["mode"], obj["sample_tokens"], obj["dtype"])),
    (_stats_documents, _stats_fit),
)


def validate_index(
    obj: dict[str, Any], where: str, table: ShardRows | None = None
) -> ShardColumns | None:
    """Check a parsed index of a readable version against every rule (both layers).

    The shard list is checked a column at a time (:mod:`wdstream.format.index_columns`);
    only an index that path does not accept goes through the rules shard by shard.

    Args:
        obj: the parsed JSON object; ``format`` and ``version`` already checked.
        where: the file, for messages.
        table: the dataset's shard table, whose rows stand for ``obj["shards"]`` (then
            absent from ``obj``): checked by the same rules, a column at a time.

    Returns:
        The shard list's columns, or None when it was checked shard by shard.

    Raises:
        IndexValidationError: ``WHERE: KEY.PATH: expected ..., got ...`` for the first
            rule broken.
    """
    if table is not None:
        _check_keys(obj | {"shards": [{}]}, _TOP, "", where)
        obj = obj | {"shards": table}
    else:
        _check_keys(obj, _TOP, "", where)
    _check_keys(obj["tokenizer"], _TOKENIZER, "tokenizer", where)
    _check_keys(obj.get("stats", {}), _STATS, "stats", where)
    columns = table_columns(table, where) if table is not None else shard_columns(obj["shards"])
    if columns is None:
        for i, shard in enumerate(obj["shards"]):
            _check_keys(shard, _SHARD, f"shards[{i}]", where)
    for rule, passes in _ACROSS:
        if columns is not None and passes is not None and passes(obj, columns):
            continue
        problem = rule(obj)
        if problem:
            raise index_error(where, *problem)
    return columns
