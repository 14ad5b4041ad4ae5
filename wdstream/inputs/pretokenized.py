"""Pre-tokenized documents: JSON records that already hold token ids, and perhaps a loss mask.

``pack --pretokenized`` reads JSON Lines records such as::

    {"input_ids": [9906, 1917, 0], "loss_mask": [0, 1, 1]}

``input_ids`` (the key is ``ids_key``) are the document's ids in the named tokenizer's
vocabulary; ``loss_mask`` (``mask_key``, only when the pack is masked) says per id whether it
carries loss: ``1``/``true`` supervised, ``0``/``false`` not. :func:`token_document` turns
the parsed record into a :class:`TokenDocument`, or raises :class:`ValueError` saying what is
wrong with it; the :class:`~wdstream.inputs.records.DocumentReader` makes that a bad record
naming file and line (``on_error``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TokenDocument", "TokenFields", "token_document"]


@dataclass(frozen=True)
class TokenDocument:
    """One pre-tokenized document: ``ids`` (int64) and, in a masked pack, ``supervised``
    (bool, True where the id carries loss; None in an unmasked pack)."""

    ids: np.ndarray
    supervised: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class TokenFields:
    """How to read a pre-tokenized record (a picklable callable: record -> document).

    Args:
        n_vocab: ids must be below this (the named tokenizer's vocabulary).
        ids_key: the field holding the ids.
        mask_key: the field holding the loss mask, or None: the pack stores no mask, and a
            record holding a ``loss_mask`` field is refused rather than its mask dropped.

    Raises:
        ValueError: ``mask_key`` equal to ``ids_key``.
    """

    n_vocab: int
    ids_key: str = "input_ids"
    mask_key: str | None = None

    def __post_init__(self) -> None:
        if self.mask_key is not None and self.mask_key == self.ids_key:
            raise ValueError(
                f"mask_key and ids_key are both {self.ids_key!r}: a record's ids cannot be "
                "its own loss mask (--mask-key names another field than --ids-key)"
            )

    def __call__(self, record: Any) -> TokenDocument:
        return token_document(record, self)


def _int_array(value: Any, what: str, ids: bool = False) -> np.ndarray:
    """``value`` (a JSON list of integers, or a 1-D numpy array of them from Python or a
    Parquet/Arrow row) as an integer array, or ValueError naming ``what``; ``ids``: a
    boolean among the integers is refused (a mask may mix 0/1 and booleans)."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iub":
            raise ValueError(f"{what} is an array of {value.dtype} {value.shape}, not of integers")
        return value
    if not isinstance(value, list):
        raise ValueError(f"{what} is a {type(value).__name__}, not a list of integers")
    if not value:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.array(value)
    except (ValueError, OverflowError) as exc:  # ragged nesting, huge integers
        raise ValueError(f"{what} is not a flat list of integers ({exc})") from None
    if arr.ndim != 1 or arr.dtype.kind not in "iub":
        bad = next((v for v in value if type(v) not in (int, bool)), None)
        if bad is None:  # all ints, one past int64/uint64: numpy made an object array
            bad = next(v for v in value if not -(1 << 63) <= v < 1 << 64)
            raise ValueError(f"{what} holds {bad!r}, an integer outside any vocabulary")
        raise ValueError(f"{what} holds {bad!r}, not an integer")
    if ids and arr.dtype.kind != "b" and bool in set(map(type, value)):
        # [1, true] is an int array to numpy: a JSON boolean among integers is no token id
        bad = next(v for v in value if type(v) is bool)
        raise ValueError(f"{what} mixes the boolean {json.dumps(bad)} with integers")
    return arr


def token_document(record: Any, fields: TokenFields) -> TokenDocument:
    """The document of one parsed JSON record.

    Raises:
        ValueError: the record is not an object, lacks the ids (or, in a masked pack, the
            mask), an id is not an integer in ``[0, n_vocab)``, or the mask is not 0/1 (or
            bools) of the ids' length.
    """
    if not isinstance(record, dict):
        raise ValueError(f"the record is a JSON {type(record).__name__}, not an object")
    if fields.ids_key not in record:
        keys = ", ".join(repr(k) for k in list(record)[:8])
        raise ValueError(f"no ids field {fields.ids_key!r} (the record has keys {keys})")
    ids = _int_array(record[fields.ids_key], f"ids field {fields.ids_key!r}", ids=True)
    if ids.dtype.kind == "b":
        raise ValueError(f"ids field {fields.ids_key!r} holds booleans, not token ids")
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= fields.n_vocab):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        at = int(np.flatnonzero(ids == bad)[0])
        raise ValueError(
            f"id {bad} at position {at} of {fields.ids_key!r} is outside the tokenizer's "
            f"vocabulary [0, {fields.n_vocab})"
        )
    ids = ids.astype(np.int64, copy=False)
    if fields.mask_key is None:
        if "loss_mask" in record:
            raise ValueError(
                "the record has a 'loss_mask' field but the pack stores no mask: pass "
                "--mask-key loss_mask (mask_key='loss_mask') to keep it"
            )
        return TokenDocument(ids)
    if fields.mask_key not in record:
        raise ValueError(f"no mask field {fields.mask_key!r} (a masked pack needs one per record)")
    mask = _int_array(record[fields.mask_key], f"mask field {fields.mask_key!r}")
    if len(mask) != len(ids):
        raise ValueError(
            f"mask field {fields.mask_key!r} has {len(mask)} entries for {len(ids)} ids"
        )
    if mask.dtype.kind != "b" and len(mask) and not np.isin(mask, (0, 1)).all():
        bad = int(mask[~np.isin(mask, (0, 1))][0])
        raise ValueError(f"mask field {fields.mask_key!r} holds {bad}; expected 0/1 or booleans")
    return TokenDocument(ids, mask.astype(bool))
