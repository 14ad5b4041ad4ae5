"""The fields of a saved state and their checks, shared by every order's state format.

Each order parses its own state (the per-rank streams in ``streams_state.py``, the global
order in ``global_sequence.py``, a mixture in ``mixture/state.py``); what they share is
here: typed fields with the error that names them (``streams[1].offset: ... (got ...)``),
JSON-kind comparison of config values, the ``check`` tags that let a state vouch for
its own fields, and the check of the dataset a state names (by content,
:mod:`wdstream.read.sources.identity`).
"""

from __future__ import annotations

import hashlib
import json
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from wdstream.errors import StateMismatchError
from wdstream.read.sources.base import Source

__all__ = [
    "SEAL_KEY",
    "TAG_HEX",
    "accept_dataset",
    "cursor_seal",
    "dict_field",
    "int_field",
    "json_kind",
    "mismatch",
    "quote_value",
    "same_value",
]

SEAL_KEY = "check"  # a sealed cursor's tags (raw text)
TAG_HEX = 8  # hex digits of one field's tag: an edit passes with odds 2**-32

# Every position is an int64 (numpy, torch, JSON readers in other languages); past that a
# number is no position a reader could have reached.
_INT_LIMIT = 1 << 63
_SHOW = 60  # characters of a bad value quoted in a message (a hostile value may be huge)


def quote_value(value: Any) -> str:
    """``repr(value)``, cut to a readable length (a hostile value may be huge)."""
    text = repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 3] + "..."


def mismatch(path: str, value: Any, why: str) -> StateMismatchError:
    """The error for field ``path`` of a state holding ``value``: ``path: why (got value)``."""
    return StateMismatchError(f"{path}: {why} (got {quote_value(value)})")


def int_field(path: str, value: Any, lo: int = 0, hi: int = _INT_LIMIT) -> int:
    """``value`` as an int in ``[lo, hi)``; a bool, float or string is refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise mismatch(path, value, "an integer expected")
    number = int(value)
    if not lo <= number < hi:
        top = "2**63" if hi == _INT_LIMIT else str(hi)
        raise mismatch(path, value, f"must be in [{lo}, {top})")
    return number


def dict_field(path: str, value: Any, keys: Sequence[str]) -> dict[str, Any]:
    """``value`` as a dict with exactly ``keys``."""
    if not isinstance(value, dict):
        raise mismatch(path, value, "a dict expected")
    for k in keys:
        if k not in value:
            raise mismatch(f"{path}.{k}" if path else k, None, "missing")
    for k in value:
        if k not in keys:
            raise mismatch(f"{path}.{k}" if path else str(k), value[k], "unknown key")
    return value


def json_kind(value: Any) -> str:
    """JSON kind of a config value, so that ``True`` never equals ``1`` nor ``1.0`` ``1``."""
    if isinstance(value, bool | np.bool_):
        return "bool"
    if isinstance(value, numbers.Integral):
        return "int"
    return type(value).__name__


def same_value(a: Any, b: Any) -> bool:
    return json_kind(a) == json_kind(b) and a == b


def cursor_seal(
    config: dict[str, Any], stream: int, cursor: dict[str, int], keys: Sequence[str]
) -> str:
    """The ``check`` of ``cursor`` of ``stream``: per field of ``keys`` in order, 8 hex of
    BLAKE2b over the config (canonical JSON), the stream, the field's name and value.

    Not a secret (the config is in the state): it detects edits and states moved between
    streams or readers, so a position the run never reached is refused, not read.
    """
    base = json.dumps(config, sort_keys=True, separators=(",", ":")) + f"|{stream}|"
    return "".join(
        hashlib.blake2b(
            f"{base}{k}={int(cursor[k])}".encode(), digest_size=TAG_HEX // 2
        ).hexdigest()
        for k in keys
    )


def accept_dataset(
    state: Any, config: dict[str, Any], source: Source, free: Sequence[str] = ()
) -> dict[str, Any]:
    """``config`` (a reader's, with ``dataset``) as a state of ``source`` must match it: with
    the state's ``config.dataset`` once that names ``source``'s data, so the comparison of
    the other keys and the ``check`` tags (made over the saved config) take it as equal.
    Unchanged when the state has no ``config.dataset``: its shape check names what is missing.

    Args:
        free: config keys a state may change on load (the global order's ``global_batch``),
            not listed among the other differences of a refused state.

    Raises:
        StateMismatchError: ``config.dataset: ...`` naming what differs (the key, the shard),
            and the other config keys that differ too.
    """
    saved = state.get("config") if isinstance(state, dict) else None
    if not isinstance(saved, dict) or "dataset" not in saved:
        return config
    try:
        source.identity.check("config.dataset", saved["dataset"], source.where)
    except StateMismatchError as exc:
        also = [f"{k}: saved {quote_value(saved[k])}, now {config[k]!r}" for k in config
                if k != "dataset" and k not in free and k in saved
                and not same_value(saved[k], config[k])]  # fmt: skip
        if also:
            raise StateMismatchError(f"{exc}; the state differs in {', '.join(also)} too") from None
        raise
    return {**config, "dataset": saved["dataset"]}
