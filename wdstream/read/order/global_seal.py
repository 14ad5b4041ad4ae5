"""The ``check`` of a global-order state: tags over the fields that place its position
(origin, step, stop, the saved global batch) and, when the state holds them, its ``skips``
and ``quarantined`` count, so an edited field is named on load instead of resuming onto
other rows or another step mapping (``docs/READER.md``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from wdstream.read.order.state_fields import SEAL_KEY, cursor_seal, mismatch

__all__ = ["SEALED", "check_seal", "refuse_unsealed", "seal"]

# The fields of a global state that place its position (the rest of the config keys them);
# a state that records skips or quarantined rows seals those too (after these, in this order).
SEALED = ("config.global_batch", "step", "origin.step", "origin.epoch", "origin.row", "iter_stop")
_COUNTED = ("skips", "quarantined")


def sealed_fields(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """The key (config without ``global_batch``) and the placing fields (iter_stop None: -1;
    ``skips`` as 63 bits of a hash of its JSON, which maps training steps to data steps)."""
    config = {k: v for k, v in state["config"].items() if k != "global_batch"}
    o, stop = state["origin"], state["iter_stop"]
    values = [state["config"]["global_batch"], state["step"], o["step"], o["epoch"], o["row"],
              -1 if stop is None else stop]  # fmt: skip
    fields = dict(zip(SEALED, values, strict=True))
    if "skips" in state:
        text = json.dumps(state["skips"], sort_keys=True, separators=(",", ":"))
        fields["skips"] = int(hashlib.blake2b(text.encode(), digest_size=8).hexdigest(), 16) >> 1
    if "quarantined" in state:
        fields["quarantined"] = _count_value(state["quarantined"])
    return config, fields


def _count_value(value: Any) -> int:
    """An int for the seal of a count that may be malformed (its own check names it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else -2


def seal(state: dict[str, Any], keys: tuple[str, ...] | None = None) -> str:
    """The ``check`` of a global state: 8 hex per placing field (``cursor_seal``), so an
    edit of ``origin``, ``step``, ``iter_stop``, the saved global batch, ``skips`` or
    ``quarantined`` is named on load. ``keys``: the fields to seal (default: every one the
    state holds)."""
    config, fields = sealed_fields(state)
    return cursor_seal(config, 0, fields, keys or tuple(fields))


def check_seal(state: dict[str, Any]) -> None:
    """Refuse a sealed global state whose sealed fields differ from their check, naming
    the first such field. The check covers the placing fields, then the state's ``skips``
    and ``quarantined`` in that order, and it must cover every one the state carries: a
    counted field the check does not cover was added after it, or the check was cut back to
    an older form (the placing fields alone) that never carried it; either is refused, since
    an edited ``skips`` under such a check would remap training steps to other data steps
    unseen. A state without ``check`` (saved before issue 23) is not checked here.

    Raises:
        StateMismatchError: naming the field, or ``check`` when malformed.
    """
    tags = state[SEAL_KEY]
    _, fields = sealed_fields(state)
    counted = [k for k in _COUNTED if k in fields]
    n = len(seal(state, SEALED[:1]))
    covered = len(tags) // n - len(SEALED) if isinstance(tags, str) else -1
    if not isinstance(tags, str) or len(tags) % n or not 0 <= covered <= len(counted):
        raise mismatch(SEAL_KEY, tags, f"a string of {n * len(fields)} hex digits expected")
    keys = SEALED + tuple(counted[:covered])
    want = seal(state, keys)
    bad = [k for i, k in enumerate(keys) if tags[i * n : (i + 1) * n] != want[i * n : (i + 1) * n]]
    if len(bad) == len(keys):
        raise mismatch(SEAL_KEY, tags, "no field matches the check: another run's state")
    if bad:
        also = f" (also {', '.join(bad[1:])})" if len(bad) > 1 else ""
        shown = state[bad[0]] if bad[0] in _COUNTED else fields[bad[0]]
        raise mismatch(
            bad[0], shown,
            f"differs from the value the state's check was made with: the field was edited{also}",
        )  # fmt: skip
    added = counted[covered:]
    if added:
        raise mismatch(added[0], state[added[0]],
                       f"is not covered by the state's check (a check of {len(keys)} fields): "
                       "the field was added to the state, or its check cut back to an older "
                       "form that never carried it")  # fmt: skip


def refuse_unsealed(state: dict[str, Any], newer: bool) -> None:
    """Refuse a global state without ``check`` that carries what only sealed states carry.

    Only states saved before issue 23 lack ``check``, and those name their dataset by a
    16-hex fingerprint and carry no ``skips`` or ``quarantined``. A state holding either
    (``newer``) or a dataset named by content claims an older form than it is: its check was
    removed, and it could carry any edit. (``order_version`` and ``next_rows`` are
    recomputed and compared on every load, sealed or not.)

    Raises:
        StateMismatchError: naming ``check``.
    """
    dataset = state["config"].get("dataset") if isinstance(state["config"], dict) else None
    if newer or isinstance(dataset, dict):
        what = "skips, quarantined rows or a dataset named by content"
        raise mismatch(SEAL_KEY, None, f"missing: a state that carries {what} carries its "
                       "check (every version writing those seals its states); it was removed")  # fmt: skip
