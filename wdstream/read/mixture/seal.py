"""The ``check`` of a mixture state: one tag per field that places it, so an edited field is
named on load instead of resuming onto other rows or another training-to-data step mapping.

A mixture state (``state.py``) is placed by ``step``, ``origin``, ``iter_stop``, the saved
global batch and the ``schedule`` pieces begun before ``step``, and, once present, by
``skips`` (training steps to data steps) and ``quarantined`` (the ``max_quarantined``
budget). Mixture states saved before issue 33 carried no check: an edited but well-formed
``skips`` loaded and moved every later ``data_step`` unseen. Now each field has an 8-hex
tag (:func:`~wdstream.read.order.state_fields.cursor_seal`, keyed by the rest of the saved
config); lists (``schedule``, ``skips``) are tagged by a hash of their JSON.

Forms: a state must carry ``check``, covering exactly the fields it carries (a check cut back to
fewer fields is refused, naming the first field left uncovered, and the list of the sealed
fields is part of the key, so a field removed with its tag is named too:
:mod:`~wdstream.read.order.seal_forms`). A state without ``check`` is refused: one saved
before cannot be told from a sealed one whose ``skips`` and check were both removed
(:func:`refuse_unsealed_mixture` names the opt-in for a trusted old state). The tags
detect edits and mix-ups, not forgery (the config is in the state).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from wdstream.read.order.seal_forms import check_form_tags, form_tags
from wdstream.read.order.state_fields import SEAL_KEY, mismatch

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
    """The ``check`` of a mixture state: 8 hex per field it carries, the list of those
    fields in the key (module docstring)."""
    config, fields = _fields(state)
    return form_tags(config, fields, tuple(fields), tuple(fields))


def check_mixture_seal(state: dict[str, Any]) -> None:
    """Refuse a sealed mixture state whose fields differ from its check, or whose check
    does not cover exactly the fields it carries, naming the first such field.

    Raises:
        StateMismatchError: naming the field, or ``check`` when malformed.
    """
    config, fields = _fields(state)

    def shown(key: str) -> Any:
        return state.get(key, fields[key])

    check_form_tags(state[SEAL_KEY], config, fields, MIXTURE_SEALED, _COUNTED, shown,
                    legacy=False)  # fmt: skip


def refuse_unsealed_mixture(state: dict[str, Any]) -> None:
    """Refuse a mixture state without ``check``. Such a state is either one saved before
    mixture states were sealed or a sealed one whose check was removed, and the two cannot
    be told apart: removing ``skips`` with the check leaves exactly the older form, and it
    would load with every later ``data_step`` moved. A state you saved yourself before
    (issue 33) can be sealed as it stands with :func:`mixture_seal` (the state then vouches
    for what it says now): that is the explicit opt-in the message names.

    Raises:
        StateMismatchError: naming ``check``.
    """
    held = [k for k in _COUNTED if k in state]
    what = f"a mixture state carrying {' and '.join(held)}" if held else "a mixture state"
    raise mismatch(
        SEAL_KEY, None,
        f"missing: {what} carries its check (without it an edit or removal of skips would "
        "remap training steps to data steps unseen); it was removed, or the state was saved "
        "before mixture states were sealed: resume from a state saved by this version, or, "
        "for a state you trust as it stands, add state['check'] = "
        "wdstream.read.mixture.seal.mixture_seal(state)",
    )  # fmt: skip
