"""A state's ``check`` that names its own form: which fields it was made over.

A check is one 8-hex tag per sealed field (:func:`~wdstream.read.order.state_fields.cursor_seal`),
keyed by the state's config. Tags alone do not say which fields the check was made over,
so a field could be removed with its tag and the check, cut back, still matched what was
left: a state with ``skips`` whose skips and last tag were removed loaded as if no step had
been skipped, moving every ``data_step`` (issue 33). Now the key also holds the list of the
sealed fields (``FORM_KEY``): a check cut back to fewer fields matches no tag of the form
the state now claims, and the placing tags tell which form it was made in, so the removed
field is named. Checks made before the form was in the key (global states saved before
issue 33) are still recognised where the global order allows them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from wdstream.read.order.state_fields import SEAL_KEY, TAG_HEX, cursor_seal, mismatch

__all__ = ["FORM_KEY", "check_form_tags", "form_tags"]

FORM_KEY = "~sealed"  # the key of the sealed fields' list inside a check's config


def form_tags(
    config: dict[str, Any], fields: dict[str, int], keys: Sequence[str], form: Sequence[str]
) -> str:
    """The tags of ``keys`` (a prefix of ``form``) in a check made over the fields ``form``."""
    return cursor_seal({**config, FORM_KEY: list(form)}, 0, fields, keys)


def check_form_tags(
    tags: Any,
    config: dict[str, Any],
    fields: dict[str, int],
    placing: Sequence[str],
    optional: Sequence[str],
    shown: Callable[[str], Any],
    legacy: bool,
) -> None:
    """Refuse ``tags`` (a state's ``check``) unless it is the check of exactly the fields
    the state carries (``fields``: ``placing`` then those of ``optional`` it holds), naming
    the first field that differs, is not covered or was removed.

    Args:
        shown: the value to print for a field (the state's own, not its tag value).
        legacy: also accept a check made before the form was part of the key.

    Raises:
        StateMismatchError: naming the field, or ``check`` when malformed or foreign.
    """
    keys = tuple(fields)
    n = TAG_HEX
    if not isinstance(tags, str) or len(tags) % n:
        raise mismatch(SEAL_KEY, tags, f"a string of {n * len(keys)} hex digits expected")
    covered = len(tags) // n
    if len(placing) <= covered < len(keys):
        left = keys[covered]
        raise mismatch(left, shown(left),
                       f"is not covered by the state's check (a check of {covered} fields): "
                       "the field was added to the state, or its check cut back to an older "
                       "form that never carried it")  # fmt: skip
    if covered != len(keys):
        raise mismatch(SEAL_KEY, tags, f"a string of {n * len(keys)} hex digits expected")

    def differing(want: str) -> list[str]:
        return [
            k for i, k in enumerate(keys) if tags[i * n : (i + 1) * n] != want[i * n : (i + 1) * n]
        ]

    bad = differing(form_tags(config, fields, keys, keys))
    if len(bad) == len(keys) and legacy:
        old = differing(cursor_seal(config, 0, fields, keys))
        bad = old if len(old) < len(bad) else bad
    if len(bad) == len(keys):
        _name_removed(tags, config, fields, placing, optional)
        raise mismatch(SEAL_KEY, tags, "no field matches the check: another run's state")
    if bad:
        also = f" (also {', '.join(bad[1:])})" if len(bad) > 1 else ""
        raise mismatch(bad[0], shown(bad[0]),
                       f"differs from the value the state's check was made with: the field "
                       f"was edited{also}")  # fmt: skip


def _name_removed(
    tags: str,
    config: dict[str, Any],
    fields: dict[str, int],
    placing: Sequence[str],
    optional: Sequence[str],
) -> None:
    """Raise naming a field the check was made over but the state no longer carries, found
    by the form under which the placing fields' tags match."""
    absent = [k for k in optional if k not in fields]
    head = tags[: len(placing) * TAG_HEX]
    for r in range(1, len(absent) + 1):
        for gone in itertools.combinations(absent, r):
            form = (*placing, *(k for k in optional if k in fields or k in gone))
            if form_tags(config, fields, placing, form) == head:
                raise mismatch(gone[0], None,
                               "missing: the state's check was made with this field; it was "
                               "removed from the state (and the check cut back)")  # fmt: skip
