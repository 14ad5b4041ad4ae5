"""Order identity: a state names the order algorithm and the rows of its next step.

A global-order or mixture state carries ``order_version`` (the version of the algorithm that
made it, a constant of the module that defines the order) and ``next_rows`` (16 hex of
SHA-256 over the ``(shard, sample, first token, tokens)`` pieces the next step's rows are
cut from, computed from the plan, no data read). On load both are compared with what this
code computes, so a state resumed under a changed order is refused instead of continuing
silently in other rows. States saved before these fields existed carry neither and load
unchecked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from wdstream.errors import StateMismatchError
from wdstream.read.order.state_fields import same_value

__all__ = ["IDENTITY_KEYS", "check_identity", "rows_fingerprint"]

IDENTITY_KEYS = ("order_version", "next_rows")


def rows_fingerprint(ids: Sequence[Sequence[int]]) -> str:
    """16 hex of SHA-256 over ``ids`` (canonical JSON of the rows' pieces)."""
    blob = json.dumps([list(map(int, x)) for x in ids], separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def check_identity(state: dict[str, Any], version: Any, fingerprint: Callable[[], str]) -> None:
    """Refuse ``state`` if it was made by another version of the order, or if its next step's
    rows differ from those this code computes (``fingerprint``, called only when needed).

    Raises:
        StateMismatchError: naming ``order_version`` or ``next_rows`` and both values.
    """
    saved = state["order_version"]
    if not same_value(saved, version):  # True or 1.0 is no version 1
        raise StateMismatchError(
            f"order_version: the state was saved by order version {saved!r}, this code reads "
            f"version {version!r}: it would continue in other rows; resume it with the "
            "wdstream release that saved it, or start a new run"
        )
    mine = fingerprint()
    if state["next_rows"] != mine:
        raise StateMismatchError(
            f"next_rows: the order changed: the state's next step is made of rows with "
            f"fingerprint {state['next_rows']!r}, this code computes {mine!r} for that step "
            "(another order algorithm or dataset plan); resume it with the code that saved it"
        )
