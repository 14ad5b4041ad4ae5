"""The ``check`` of a global-order state: tags over the fields that place its position
(origin, step, stop, the saved global batch) and, when the state holds them, its ``skips``
and ``quarantined`` count, so an edited field is named on load instead of resuming onto
other rows or another step mapping (``docs/READER.md``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from wdstream.read.order.seal_forms import check_form_tags, form_tags
from wdstream.read.order.state_fields import SEAL_KEY, mismatch

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
    state holds); the list of them is part of the key (``seal_forms.py``), so a check cut
    back to fewer fields matches no tag of the form it then claims."""
    config, fields = sealed_fields(state)
    keys = keys or tuple(fields)
    return form_tags(config, fields, keys, keys)


def check_seal(state: dict[str, Any]) -> None:
    """Refuse a sealed global state whose sealed fields differ from their check, naming
    the first such field. The check covers the placing fields, then the state's ``skips``
    and ``quarantined`` in that order, and it must cover every one the state carries, and
    no more: a counted field the check does not cover was added after it, or the check was
    cut back to an older form (the placing fields alone) that never carried it; a field the
    check was made over but the state no longer carries was removed (its tag cut with it).
    Each is refused, since an edited or removed ``skips`` would remap training steps to
    other data steps unseen. Checks made before the form was part of the key still load
    (``seal_forms.py``); a state without ``check`` (saved before issue 23) is not checked
    here.

    Raises:
        StateMismatchError: naming the field, or ``check`` when malformed.
    """
    config, fields = sealed_fields(state)

    def shown(key: str) -> Any:
        return state[key] if key in _COUNTED else fields[key]

    check_form_tags(state[SEAL_KEY], config, fields, SEALED, _COUNTED, shown, legacy=True)


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
