"""Pre-tokenized records held to the vocabulary before a pack stores them.

:class:`~wdstream.inputs.pretokenized.TokenFields` refuses ids outside ``[0, n_vocab)``
with a ``ValueError`` the pack turns into ``file:line`` (or a skip under ``--on-error
skip``). Two kinds of id slipped past it as a crash instead: a JSON ``null`` among the ids
(``TypeError`` inside its own error path) and ``2**64 - 1`` (numpy makes an array of Python
objects whose search for the culprit found none: ``StopIteration``, then ``RuntimeError``
in the pack's generator). :class:`CheckedTokenFields` reads records the same way and turns
any such failure into the one clear error, naming the field, the position and the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wdstream.inputs.pretokenized import TokenDocument, TokenFields

__all__ = ["CheckedTokenFields", "first_bad_id"]


def first_bad_id(value: Any, n_vocab: int) -> tuple[int, Any] | None:
    """``(position, value)`` of the first element of list ``value`` that is not an integer
    id in ``[0, n_vocab)`` (a bool is not one), or None."""
    if not isinstance(value, list):
        return None
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n_vocab:
            return i, v
    return None


@dataclass(frozen=True)
class CheckedTokenFields(TokenFields):
    """:class:`TokenFields` whose every refusal is a ``ValueError`` (module docstring)."""

    def __call__(self, record: Any) -> TokenDocument:
        try:
            return super().__call__(record)
        except (TypeError, RuntimeError, OverflowError, IndexError, StopIteration) as exc:
            ids = record.get(self.ids_key) if isinstance(record, dict) else None
            bad = first_bad_id(ids, self.n_vocab)
            mask = record.get(self.mask_key) if self.mask_key and isinstance(record, dict) else None
            plain = (
                [int(v) if isinstance(v, bool) else v for v in mask]
                if isinstance(mask, list)
                else None
            )
            odd = first_bad_id(plain, 2) if bad is None else None
            if odd is not None:
                raise ValueError(f"mask field {self.mask_key!r} holds {_show(odd[1])} at "
                                 f"position {odd[0]}; expected 0/1 or booleans") from None  # fmt: skip
            if bad is None:
                raise ValueError(f"ids field {self.ids_key!r} cannot be read as token ids "
                                 f"({type(exc).__name__}: {exc})") from None  # fmt: skip
            at, value = bad
            kind = "not an integer" if not isinstance(value, int) else "outside the vocabulary"
            raise ValueError(
                f"id {_show(value)} at position {at} of {self.ids_key!r} is {kind}: token ids "
                f"are integers in [0, {self.n_vocab})"
            ) from None


def _show(value: Any) -> str:
    """A value as JSON would write it (``null``, ``true``), cut to 40 characters."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)[:40]
