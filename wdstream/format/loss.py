"""Which tokens carry loss, stored inside the token ids themselves.

A dataset whose ``index.json`` has ``"loss_mask": "bit31"`` (chat data, and rows the reader
quarantines) stores its ids as ``uint32`` with bit 31 set on every token that carries **no**
loss (a prompt, a system message, padding). Vocabularies are far below ``2**31`` ids, so the
bit never collides with an id, and an id array without the bit is all-supervised: rows of a
chat dataset and of a pretraining dataset can be mixed and split by one rule.

The mask is not a second array beside the tokens but part of them, so it is right by
construction wherever tokens go: covered by the sample's CRC32C, cut into rows of any
``seq_len``, shuffled, handed between torch workers and resumed exactly as the ids are,
never one token off. The reader splits it off only when it builds a batch
(:func:`split_ids`): ``input_ids`` without the bit, ``labels`` -100 where the target has it.
The reader's row buffers are int32, where a set bit 31 reads as a negative number; int64
and uint32 arrays hold it as a value ``>= 2**31``. Both are handled.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ID_BITS", "LOSS_MASK_KIND", "NO_LOSS_BIT", "carries_loss", "mark_no_loss", "split_ids"]

LOSS_MASK_KIND = "bit31"  # the value of index.json's "loss_mask"
NO_LOSS_BIT = 1 << 31
ID_BITS = NO_LOSS_BIT - 1  # the id part of a stored token


def mark_no_loss(ids: np.ndarray, supervised: np.ndarray) -> np.ndarray:
    """uint32 token ids with bit 31 set where ``supervised`` is False (the stored form).

    Raises:
        ValueError: an id that does not fit in 31 bits, or arrays of different lengths.
    """
    if len(ids) != len(supervised):
        raise ValueError(f"{len(ids)} ids but {len(supervised)} mask entries")
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) > ID_BITS):
        raise ValueError("token ids must be in [0, 2**31) to carry a loss mask")
    out = ids.astype(np.uint32)
    out[~np.asarray(supervised, dtype=bool)] |= np.uint32(NO_LOSS_BIT)
    return out


def carries_loss(stored: np.ndarray) -> np.ndarray:
    """bool per token of stored (uint32) ids: True where it carries loss (bit 31 clear)."""
    return stored < NO_LOSS_BIT


def split_ids(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, no_loss)``: the ids without bit 31, and a bool array True where it was set.

    Works on int32 (bit 31 reads as negative), int64 and uint32 arrays; narrower arrays
    cannot hold the bit and carry loss everywhere. (Tensors: ``RowLabels.split``.)
    """
    if tokens.dtype.itemsize < 4:
        return tokens, np.zeros(tokens.shape, dtype=bool)
    if tokens.dtype == np.int32:
        return tokens & ID_BITS, tokens < 0
    return tokens & tokens.dtype.type(ID_BITS), tokens >= NO_LOSS_BIT
