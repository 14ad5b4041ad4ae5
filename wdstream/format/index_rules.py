"""Layer 1 of ``index.json`` validation: one rule per key, and the message helpers.

The tables ``_TOP``, ``_TOKENIZER``, ``_SHARD`` and ``_STATS`` hold one rule per key:
presence, JSON type (``true`` is not an integer, ``1.0`` is not an integer) and range, with
the names a shard, sidecar or provenance file may have (never one that leaves the dataset
root). :func:`wdstream.format.index_checks.validate_index` runs them, then the rules across
keys; ``index_error``, ``show_value`` and ``join_path`` spell every message of both layers
(and of :mod:`wdstream.format.index`) as ``WHERE: KEY.PATH: expected ..., got VALUE``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wdstream.errors import IndexValidationError
from wdstream.format.checksum import CHECKSUM_NAME
from wdstream.format.loss import LOSS_MASK_KIND
from wdstream.format.sample import DTYPES
from wdstream.format.tar import BLOCK

__all__ = [
    "MAX_COUNT",
    "MAX_NAME_BYTES",
    "index_error",
    "join_path",
    "show_value",
]

MAX_COUNT = 2**48  # samples, tokens, documents, bytes: per shard and over the dataset
MAX_NAME_BYTES = 255  # one file name on common filesystems; S3 keys allow 1024
_MAX_SAMPLE_TOKENS = 2**31
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# At most 255 ASCII letters, digits and ``_.+=-`` in ``/``-separated parts, none ``.``/``..``
# (index_columns.py matches a column of them, joined by newlines, in the same terms).
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
    # ``accepts`` is exactly ``type(v) is exact``: a list of them is checked in one pass.
    exact: type | None = None

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


_OBJECT = _Kind("an object", lambda v: type(v) is dict, exact=dict)
_ABSOLUTE_PATH = _Kind(
    "an absolute path of 1 to 4096 characters",
    lambda v: _text(4096).accepts(v) and os.path.isabs(v),
)
_STRING = _Kind("a string", lambda v: type(v) is str, exact=str)
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
    _Rule("loss_mask", _or_null(_one_of(LOSS_MASK_KIND)), required=False),
    _Rule("stats", _OBJECT, required=False),
)
_TOKENIZER = (
    _Rule("name", _text(4096)),  # an encoding's name, or the path it was loaded from
    _Rule("backend", _text(4096)),
    _Rule("ranks_sha256", _Kind(f"'' or {_SHA.expected}", lambda v: v == "" or _SHA.accepts(v))),
    _Rule("n_vocab", _int(1, 2**32)),
    _Rule("config_sha256", _SHA, required=False),  # a Hugging Face tokenizer_config.json's
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
) + (
    _Rule("skipped_locations", _list(), required=False, each=_STRING),
    _Rule("pack_cwd", _ABSOLUTE_PATH, required=False),  # where relative inputs lie
)


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
            if rule.each.exact is not None and set(map(type, value)) <= {rule.each.exact}:
                continue  # every item accepted (one pass in C; 100,000 shards are common)
            for i, item in enumerate(value):
                if not rule.each.accepts(item):
                    at = join_path(join_path(path, rule.key), i)
                    raise index_error(where, at, rule.each.problem(item))
