"""The rules a parsed ``index.json`` must satisfy before anything is read through it.

``index.json`` decides what every reader reads: which objects (shard and sidecar names), how
many samples and tokens an epoch plan counts on, the dtype and the sample length. A wrong
value does not fail loudly: a reduced ``tokens`` or two swapped entries give different
batches, ``../x.tar`` reads from outside the dataset. So :meth:`DatasetIndex.from_json`
refuses an index that is not well-formed and internally consistent; checks against the
bytes themselves (sha256, sidecar counts, sample keys) are the readers' and
``wdstream verify``'s. After the strict JSON parse and the format/version check of
:mod:`wdstream.format.index`, two layers, each a table:

1. One rule per key (``_TOP``, ``_TOKENIZER``, ``_SHARD``, ``_STATS``): presence, JSON type
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

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wdstream.errors import IndexValidationError
from wdstream.format.checksum import CHECKSUM_NAME
from wdstream.format.sample import DTYPES
from wdstream.format.tar import BLOCK

__all__ = [
    "MAX_COUNT",
    "MAX_NAME_BYTES",
    "index_error",
    "join_path",
    "show_value",
    "validate_index",
]

MAX_COUNT = 2**48  # samples, tokens, documents, bytes: per shard and over the dataset
MAX_NAME_BYTES = 255  # one file name on common filesystems; S3 keys allow 1024
_MAX_SAMPLE_TOKENS = 2**31
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# At most 255 ASCII letters, digits and ``_.+=-`` in ``/``-separated parts, none ``.``/``..``.
_PLAIN_NAME = re.compile(
    r"(?=[\w.+=/-]{1,255}\Z)(?:(?!\.\.?/)[\w.+=-]+/)*(?!\.\.?\Z)[\w.+=-]+", re.ASCII
)
_PACKED_NAME = re.compile(r"(.+)-([0-9]{6,})\.tar")  # NAME-NNNNNN.tar, as the packer writes


def index_error(where: str, path: str, problem: str) -> IndexValidationError:
    """The one error type of a bad index: ``WHERE: PATH: PROBLEM``."""
    return IndexValidationError(f"{where}: {path}: {problem}" if path else f"{where}: {problem}")


def show_value(value: Any) -> str:
    """``repr`` of an offending value (a long name in full), cut short if it is huge."""
    text = "null" if value is None else repr(value)
    return text if len(text) <= 300 else f"{text[:200]}... ({len(text)} characters)"


def join_path(path: str, key: str | int) -> str:
    """``shards`` + 3 -> ``shards[3]``; ``shards[3]`` + ``tokens`` -> ``shards[3].tokens``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    part = key if key.isidentifier() else repr(key)
    return f"{path}.{part}" if path else part


def _pow2(n: int) -> str:
    return f"2**{n.bit_length() - 1}" if n >= 2**16 and n & (n - 1) == 0 else str(n)


# -- 1. one rule per key -------------------------------------------------------------------


@dataclass(frozen=True)
class _Kind:
    """What a value must be: ``expected`` for messages, ``accepts`` to test, ``why`` to say
    which part of an unaccepted value is wrong (None: the expectation says it all)."""

    expected: str
    accepts: Callable[[Any], bool]
    why: Callable[[Any], str | None] = lambda value: None

    def problem(self, value: Any) -> str:
        """The message for a value ``accepts`` refused."""
        why = self.why(value)
        return f"expected {self.expected}, got {show_value(value)}" + (f" ({why})" if why else "")


def _int(lo: int, below: int) -> _Kind:
    return _Kind(
        f"an integer >= {lo} and < {_pow2(below)}",
        lambda v: type(v) is int and lo <= v < below,  # type() excludes bool
    )


def _one_of(*values: Any) -> _Kind:
    return _Kind(
        " or ".join(map(repr, values)),
        lambda v: type(v) in (str, int) and v in values,  # type() excludes bool
    )


def _or_null(kind: _Kind) -> _Kind:
    return _Kind(f"null or {kind.expected}", lambda v: v is None or kind.accepts(v), kind.why)


def _is_unicode(text: str) -> bool:
    """False for a string holding a lone surrogate (JSON can spell one: ``"\\ud800"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(max_chars: int) -> _Kind:
    return _Kind(
        f"a Unicode string of 1 to {max_chars} characters",
        lambda v: type(v) is str and 0 < len(v) <= max_chars and _is_unicode(v),
    )


def _list(min_len: int = 0) -> _Kind:
    return _Kind(
        f"a list of at least {min_len} items" if min_len else "a list",
        lambda v: type(v) is list and len(v) >= min_len,
    )


_OBJECT = _Kind("an object", lambda v: type(v) is dict)
_STRING = _Kind("a string", lambda v: type(v) is str)
_SHA = _Kind(
    "64 lowercase hex digits (a sha256)", lambda v: type(v) is str and bool(_SHA256.fullmatch(v))
)
_TAR_SIZE = _Kind(
    f"a multiple of {BLOCK} >= {2 * BLOCK} and < {_pow2(MAX_COUNT)} (a tar's size)",
    lambda v: type(v) is int and 2 * BLOCK <= v < MAX_COUNT and v % BLOCK == 0,
)

# Why a name could leave the dataset root or alias another object, in the order checked.
_NAME_FAULTS: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda n: n == "", "empty"),
    (lambda n: not _is_unicode(n), "a lone surrogate, not Unicode"),
    (lambda n: len(n.encode("utf-8")) > MAX_NAME_BYTES, f"longer than {MAX_NAME_BYTES} bytes"),
    (lambda n: _CONTROL.search(n) is not None, "a control character"),
    (lambda n: "\\" in n, "a backslash"),
    (lambda n: ":" in n, "':' (a URL scheme or a drive)"),
    (lambda n: n.startswith("/"), "an absolute path"),
    (lambda n: n.startswith("~"), "'~' (a home directory)"),
    (lambda n: "" in n.split("/"), "an empty path component"),
    (lambda n: bool({".", ".."} & set(n.split("/"))), "a '.' or '..' path component"),
)


def _name_fault(name: Any) -> str | None:
    if type(name) is not str:
        return None
    return next((why for test, why in _NAME_FAULTS if test(name)), None)


def _name(suffix: str) -> _Kind:
    # The regular expression passes the usual names fast; the rest go through the faults.
    return _Kind(
        f"a plain relative name inside the dataset root ending in {suffix!r}",
        lambda v: (
            type(v) is str
            and v.endswith(suffix)
            and (bool(_PLAIN_NAME.fullmatch(v)) or _name_fault(v) is None)
        ),
        _name_fault,
    )


@dataclass(frozen=True)
class _Rule:
    """Key ``key`` holds a ``kind`` (a list: each item an ``each``); ``required`` or not."""

    key: str
    kind: _Kind
    required: bool = True
    each: _Kind | None = None


_TOP = (
    _Rule("tokenizer", _OBJECT),
    _Rule("eos_id", _or_null(_int(0, 2**32))),
    _Rule("bos_id", _or_null(_int(0, 2**32))),
    _Rule("dtype", _one_of(*DTYPES)),
    _Rule("mode", _one_of("concat", "docs", "bestfit")),
    _Rule("seq_len", _or_null(_int(1, _MAX_SAMPLE_TOKENS))),
    _Rule("sample_tokens", _or_null(_int(2, _MAX_SAMPLE_TOKENS))),
    _Rule("shards", _list(min_len=1), each=_OBJECT),
    _Rule("checksum", _or_null(_one_of(CHECKSUM_NAME)), required=False),
    _Rule("pad_id", _or_null(_int(0, 2**32)), required=False),
    _Rule("stats", _OBJECT, required=False),
)
_TOKENIZER = (
    _Rule("name", _text(4096)),  # an encoding's name, or the path it was loaded from
    _Rule("backend", _text(4096)),
    _Rule("ranks_sha256", _Kind(f"'' or {_SHA.expected}", lambda v: v == "" or _SHA.accepts(v))),
    _Rule("n_vocab", _int(1, 2**32)),
)
_SHARD = (
    _Rule("name", _name(".tar")),
    _Rule("sidecar", _name(".idx")),
    _Rule("samples", _int(1, MAX_COUNT)),
    _Rule("tokens", _int(0, MAX_COUNT)),
    _Rule("documents", _int(0, MAX_COUNT)),
    _Rule("bytes", _TAR_SIZE),
    _Rule("sha256", _SHA),
    _Rule("sidecar_sha256", _SHA),
    _Rule("provenance", _name(".prov"), required=False),
    _Rule("provenance_sha256", _SHA, required=False),
)
_STATS = tuple(
    _Rule(key, _int(0, 2**63), required=False)
    for key in (
        "documents",
        "empty_documents_skipped",
        "records_skipped",
        "input_bytes",
        "input_files",
    )
) + (_Rule("skipped_locations", _list(), required=False, each=_STRING),)


def _check_keys(obj: dict[str, Any], rules: tuple[_Rule, ...], path: str, where: str) -> None:
    # Key paths are built only for a message: this runs for every shard.
    for rule in rules:
        if rule.key not in obj:
            if rule.required:
                at = join_path(path, rule.key)
                raise index_error(where, at, f"missing (expected {rule.kind.expected})")
            continue
        value = obj[rule.key]
        if not rule.kind.accepts(value):
            raise index_error(where, join_path(path, rule.key), rule.kind.problem(value))
        if rule.each is not None:
            for i, item in enumerate(value):
                if not rule.each.accepts(item):
                    at = join_path(join_path(path, rule.key), i)
                    raise index_error(where, at, rule.each.problem(item))


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
    eos_id, bos_id = obj["eos_id"], obj["bos_id"]
    if eos_id is not None and eos_id >= n_vocab:
        return "eos_id", f"expected an id below tokenizer.n_vocab = {n_vocab}, got {eos_id}"
    # bos_id may be chosen outside the vocabulary (pack --bos-id); it must still fit.
    if bos_id is not None and bos_id >= ids:
        return "bos_id", f"expected an id below {ids} (dtype {dtype!r}), got {bos_id}"
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
    for i, shard in enumerate(obj["shards"]):
        missing = [k for k in keys if k not in shard]
        if any(has) and missing:
            return f"shards[{i}].{missing[0]}", (
                f"missing (shards[{has.index(True)}] has provenance: every shard or none)"
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


_ACROSS: tuple[Callable[[dict[str, Any]], _Problem], ...] = (
    _checksum_fits_version,
    _lengths_fit_mode,
    _pad_fits_mode,
    _ids_fit_dtype,
    _names_unique,
    _names_in_pack_order,
    _provenance_everywhere,
    _shard_counts,
    _stats_documents,
)


def validate_index(obj: dict[str, Any], where: str) -> None:
    """Check a parsed index of a readable version against every rule (both layers).

    Args:
        obj: the parsed JSON object; ``format`` and ``version`` already checked.
        where: the file, for messages.

    Raises:
        IndexValidationError: ``WHERE: KEY.PATH: expected ..., got ...`` for the first
            rule broken.
    """
    _check_keys(obj, _TOP, "", where)
    _check_keys(obj["tokenizer"], _TOKENIZER, "tokenizer", where)
    _check_keys(obj.get("stats", {}), _STATS, "stats", where)
    for i, shard in enumerate(obj["shards"]):
        _check_keys(shard, _SHARD, f"shards[{i}]", where)
    for rule in _ACROSS:
        problem = rule(obj)
        if problem:
            raise index_error(where, *problem)
