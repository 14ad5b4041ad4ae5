"""The ``check`` of a mixture state: one tag per field that places it, so an edited field is
named on load instead of resuming onto other rows or another training-to-data step mapping.

A mixture state (``state.py``) is placed by ``step``, ``origin``, ``iter_stop``, the saved
global batch and the ``schedule`` pieces begun before ``step``, and, once present, by
``skips`` (training steps to data steps) and ``quarantined`` (the ``max_quarantined``
budget). Mixture states saved before issue 33 carried no check: an edited but well-formed
``skips`` loaded and moved every later ``data_step`` unseen. Now each field has an 8-hex
tag (:func:`~wdstream.read.order.state_fields.cursor_seal`, keyed by the rest of the saved
config); lists (``schedule``, ``skips``) are tagged by a hash of their JSON.

Forms: a state with ``check`` must cover exactly the fields it carries (a check cut back to
fewer fields is refused, naming the first field left uncovered); a state without ``check``
is one saved before, which never vouched for ``skips`` or ``quarantined``: it loads only
without them. The tags detect edits and mix-ups, not forgery (the config is in the state).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from wdstream.read.order.state_fields import SEAL_KEY, TAG_HEX, cursor_seal, mismatch

__all__ = ["MIXTURE_SEALED", "check_mixture_seal", "mixture_seal", "refuse_unsealed_mixture"]

# Every mixture state's placing fields, in tag order; then "skips", "quarantined" if held.
MIXTURE_SEALED = (
    "config.global_batch", "step", "origin.step", "origin.row", "iter_stop", "schedule",
)  # fmt: skip
_COUNTED = ("skips", "quarantined")


def _hash63(value: Any) -> int:
    """63 bits of a hash of ``value``'s canonical JSON (lists are sealed by content)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return int(hashlib.blake2b(text.encode(), digest_size=8).hexdigest(), 16) >> 1


def _int(value: Any) -> int:
    """An int for a tag of a value whose own check names it when malformed."""
    return value if isinstance(value, int) and not isinstance(value, bool) else -2


def _fields(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """The key (config without ``global_batch``) and the sealed fields' tag values."""
    config = {k: v for k, v in state["config"].items() if k != "global_batch"}
    o, stop = state["origin"], state["iter_stop"]
    values = [_int(state["config"]["global_batch"]), _int(state["step"]), _int(o["step"]),
              _int(o["row"]), -1 if stop is None else _int(stop), _hash63(state["schedule"])]  # fmt: skip
    fields = dict(zip(MIXTURE_SEALED, values, strict=True))
    if "skips" in state:
        fields["skips"] = _hash63(state["skips"])
    if "quarantined" in state:
        fields["quarantined"] = _int(state["quarantined"])
    return config, fields


def mixture_seal(state: dict[str, Any]) -> str:
    """The ``check`` of a mixture state: 8 hex per field it carries (module docstring)."""
    config, fields = _fields(state)
    return cursor_seal(config, 0, fields, tuple(fields))


def check_mixture_seal(state: dict[str, Any]) -> None:
    """Refuse a sealed mixture state whose fields differ from its check, or whose check
    does not cover every field it carries, naming the first such field.

    Raises:
        StateMismatchError: naming the field, or ``check`` when malformed.
    """
    tags = state[SEAL_KEY]
    _, fields = _fields(state)
    keys = tuple(fields)
    if not isinstance(tags, str) or len(tags) % TAG_HEX:
        raise mismatch(SEAL_KEY, tags, f"a string of {TAG_HEX * len(keys)} hex digits expected")
    covered = len(tags) // TAG_HEX
    if covered < len(keys) and covered >= len(MIXTURE_SEALED):
        left = keys[covered]
        raise mismatch(left, state[left],
                       f"is not covered by the state's check (a check of {covered} fields): "
                       "the field was added to the state, or its check cut back to an older "
                       "form that never carried it")  # fmt: skip
    if covered != len(keys):
        raise mismatch(SEAL_KEY, tags, f"a string of {TAG_HEX * len(keys)} hex digits expected")
    want = mixture_seal(state)
    n = TAG_HEX
    bad = [k for i, k in enumerate(keys) if tags[i * n : (i + 1) * n] != want[i * n : (i + 1) * n]]
    if len(bad) == len(keys):
        raise mismatch(SEAL_KEY, tags, "no field matches the check: another run's state")
    if bad:
        also = f" (also {', '.join(bad[1:])})" if len(bad) > 1 else ""
        path = bad[0]
        shown: Any = state.get(path, fields[path])
        raise mismatch(path, shown,
                       f"differs from the value the state's check was made with: the field "
                       f"was edited{also}")  # fmt: skip


def refuse_unsealed_mixture(state: dict[str, Any]) -> None:
    """Refuse a mixture state without ``check`` that carries ``skips`` or ``quarantined``:
    it claims the form saved before mixture states were sealed, which cannot vouch for them.

    Raises:
        StateMismatchError: naming ``check``.
    """
    held = [k for k in _COUNTED if k in state]
    if held:
        raise mismatch(
            SEAL_KEY, None,
            f"missing: a mixture state carrying {' and '.join(held)} carries its check (an "
            "edit there would remap training steps to data steps or move the quarantine "
            "budget unseen); it was removed, or the state was saved before mixture states "
            "were sealed: resume from a state saved by this version",
        )  # fmt: skip
