"""Targets and document ids of rows: ``-100`` on padding and document ends, ``doc_ids``.

A best-fit row (``--mode bestfit``, :mod:`wdstream.write.bestfit`) holds whole documents,
each ending with EOS, then padding (the dataset's ``pad_id``, which is its EOS) up to
``seq_len + 1`` tokens. The padding is found from the tokens alone, so no extra data
crosses from the workers: it is everything after the row's last EOS that follows a
non-padding token. Text is tokenised without special tokens, so a document never holds the
EOS id inside its text; a corpus whose text does would only lose those targets (rows are
over-masked, never under-masked). ``seq_len = 7``, ``E`` = EOS = pad::

    row            a b E c d E E E        (documents [a b E], [c d E], 2 padding)
    input_ids      a b E c d E E
    labels         b E - d E - -          (- = -100; the E -> c target is a document end)

``mask_doc_ends``: the target after a document's last token (its EOS) is the next
document's first token, which nothing in the row predicts; set it to -100 for
document-causal training. When BOS and EOS are the same id, an EOS is a document end only
when the next token is that id too (the next document's BOS, or padding).

**One truth per target.** A dataset with a stored loss mask (``"loss_mask": "bit31"``)
decides every target itself: the pack sets the no-loss bit on its padding, on the BOS/EOS
it adds and on each document's first token (``write/encoders.py: start_not_target``), so
the padding and document-end rules above apply only to rows of data without a stored mask.
They used to apply to masked rows too, and where a masked document holds the EOS id inside
its own ids, the rule masked a target the stored mask supervises. In a mixture each row
follows its own source: ``RowLabels.stored`` says, per source, whether its rows carry a
stored mask, and the batch's ``source`` picks the rule per row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from wdstream.format.index import DatasetIndex
from wdstream.format.loss import ID_BITS, NO_LOSS_BIT, split_ids

__all__ = [
    "IGNORE_INDEX",
    "RowLabels",
    "copy_ids",
    "doc_end_mask",
    "doc_ids",
    "labelled_rows",
    "padding_mask",
    "position_ids",
    "row_labels",
]

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index


def position_ids(doc_start: np.ndarray) -> np.ndarray:
    """Per-row positions restarting at every piece start and at each row start."""
    starts = doc_start[:, :-1].copy()
    starts[:, 0] = True
    idx = np.arange(starts.shape[1], dtype=np.int32)
    last = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    return idx - last


def copy_ids(out: np.ndarray, stored: np.ndarray, strip: bool) -> None:
    """Copy ``stored`` ids into ``out`` (the batches' int64 array), with ``strip`` without
    the no-loss bit: one pass either way (the bit is split off in the copy itself)."""
    if strip:
        np.bitwise_and(stored, ID_BITS, out=out)
    else:
        np.copyto(out, stored)


def padding_mask(rows: torch.Tensor, pad_id: int) -> torch.Tensor:
    """bool ``[B, S]``: True on the padding at the end of each best-fit row of ``S`` tokens."""
    idx = torch.arange(rows.shape[1], device=rows.device)
    last = torch.where(rows != pad_id, idx, -1).amax(dim=1)  # last token that is not padding
    return idx[None, :] >= (last + 2)[:, None]  # after it: its document's EOS, then padding


def doc_end_mask(rows: torch.Tensor, eos_id: int, bos_id: int | None) -> torch.Tensor:
    """bool ``[B, S-1]``: True at input position ``t`` when token ``t`` ends a document."""
    ends = rows[:, :-1] == eos_id
    if bos_id == eos_id:  # an EOS that is the next document's BOS is followed by its text
        ends &= rows[:, 1:] == eos_id
    return ends


def doc_ids(positions: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
    """int32 ``[B, T]``: per input token, its document piece's number within the row (from
    0), and -1 on padding; from ``position_ids`` (0 where a piece starts).

    Two tokens may attend to each other in a document-causal mask exactly when their ids are
    equal (PyTorch SDPA / FlexAttention block masks).
    """
    ids = torch.cumsum((positions == 0).to(torch.int32), dim=1, dtype=torch.int32) - 1
    if padding is not None:
        ids = ids.masked_fill(padding[:, : ids.shape[1]], -1)
    return ids


@dataclass(frozen=True)
class RowLabels:
    """How targets are masked for one dataset (see the module docstring).

    Attributes:
        pad_id: best-fit datasets: the padding id (its targets are -100); else None.
        eos_id: the dataset's EOS id (None: no document ends are known).
        bos_id: the dataset's BOS id, or None.
        mask_doc_ends: set the target after every document's last token to -100.
        loss_mask: the ids may carry bit 31, "no loss" (:mod:`wdstream.format.loss`): strip
            it from the ids and set those targets to -100.
        stored: per source (one for a single dataset), whether its rows carry the pack's
            stored mask, which then decides their targets alone: the padding and
            document-end rules apply only to rows of the others. Empty: no source does.
    """

    pad_id: int | None
    eos_id: int | None
    bos_id: int | None
    mask_doc_ends: bool
    loss_mask: bool = False
    stored: tuple[bool, ...] = ()

    def split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(ids, no_loss)``: ``rows`` without the loss bit and where it was set (None:
        this dataset has no loss mask, or no row carries the bit: ``rows`` as they are)."""
        if not self.loss_mask:
            return rows, None
        if rows.device.type == "cpu":
            # Through numpy: one thread, the caller's. torch's CPU ops wake their intra-op
            # thread team, which cost ~10 ms per [256, 513] chunk on a busy 2-core host (the
            # whole read then ran 3-4x slower; see long_copy in read/torch/casts.py).
            tokens = rows.numpy()
            if tokens.dtype == np.int32 and int(tokens.min(initial=0)) >= 0:
                return rows, None  # no token carries the bit (one pass, no copies)
            ids, no_loss = split_ids(tokens)
            return torch.from_numpy(ids), torch.from_numpy(no_loss)
        if rows.dtype == torch.int32:  # the reader's row buffers: bit 31 reads as negative
            return rows & ID_BITS, rows < 0
        return rows & ID_BITS, rows >= NO_LOSS_BIT

    def split_chunk(
        self, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, np.ndarray | None]:
        """``(rows, no_loss, stored)`` of a chunk: as :meth:`split`, except that the
        reader's own CPU rows (int32) that carry the bit come back as they are, with
        ``stored`` their numpy view: the caller strips the bit inside its int64 copies
        (:func:`copy_ids`) and sets ``-100`` where ``stored < 0``, two passes fewer than
        splitting first and no copy of the ids. Else ``stored`` is None."""
        if self.loss_mask and rows.device.type == "cpu" and rows.dtype == torch.int32:
            tokens = rows.numpy()
            return rows, None, tokens if int(tokens.min(initial=0)) < 0 else None
        ids, no_loss = self.split(rows)
        return ids, no_loss, None

    def rules_apply(self) -> bool:
        """Whether the padding and document-end rules may decide any row's targets (not
        every source's rows carry a stored mask)."""
        return not (self.stored and all(self.stored))

    def padding(self, rows: torch.Tensor) -> torch.Tensor | None:
        """bool ``[B, S]`` padding of ``rows``, or None for datasets without padding."""
        return None if self.pad_id is None else padding_mask(rows, self.pad_id)

    def masked(
        self,
        rows: torch.Tensor,
        padding: torch.Tensor | None,
        no_loss: torch.Tensor | None = None,
        sources: np.ndarray | torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """bool ``[B, S-1]``: the targets to set to -100 (None: none): padding, document
        ends if chosen (both only in rows without a stored mask), and tokens ``no_loss``
        marks (:meth:`split`, ``[B, S]``). ``sources``: each row's source index (a
        mixture's batch; needed when only some sources store a mask)."""
        mask = None
        ruled = self.ruled_rows(rows.shape[0], sources, rows.device)
        if ruled is not False:
            mask = padding[:, 1:] if padding is not None else None
            if self.mask_doc_ends and self.eos_id is not None:
                ends = doc_end_mask(rows, self.eos_id, self.bos_id)
                mask = ends if mask is None else mask | ends
            if mask is not None and isinstance(ruled, torch.Tensor):
                mask = mask & ruled[:, None]
        if no_loss is not None:
            mask = no_loss[:, 1:] if mask is None else mask | no_loss[:, 1:]
        return mask

    def ruled_rows(
        self, n: int, sources: np.ndarray | torch.Tensor | None, device: torch.device
    ) -> torch.Tensor | bool:
        """Which of ``n`` rows the padding and document-end rules apply to: True (all),
        False (none: every row carries a stored mask) or a bool tensor ``[n]``.

        Raises:
            ValueError: some sources store a mask and ``sources`` is not given.
        """
        if not any(self.stored):
            return True
        if all(self.stored):
            return False
        if sources is None:
            raise ValueError("rows of a mixture whose sources differ in storing a loss mask "
                             "need each row's source to be labelled")  # fmt: skip
        src = torch.as_tensor(sources, dtype=torch.int64).to(device)
        return ~torch.tensor(self.stored, dtype=torch.bool, device=device)[src]


def row_labels(
    index: DatasetIndex | None, seq_len: int, mask_doc_ends: bool | None
) -> RowLabels | None:
    """The target rule of a dataset read with rows of ``seq_len``, or None (plain targets).

    Args:
        index: the dataset's index (None: shard URLs or raw text, read as concat rows).
        seq_len: the reader's row length.
        mask_doc_ends: -100 after each document's last token; None: on for best-fit
            datasets, off otherwise. Neither it nor the padding rule applies to a dataset
            with a stored loss mask: its stored bits decide every target.

    Raises:
        ValueError: a best-fit dataset read with another ``seq_len`` than it was packed
            with (its rows would be cut across documents and padding), or
            ``mask_doc_ends=True`` on a dataset without EOS ids.
    """
    bestfit = index is not None and index.mode == "bestfit"
    if index is not None and bestfit and seq_len != index.seq_len:
        raise ValueError(
            f"this dataset is packed with --mode bestfit at seq_len {index.seq_len}: one "
            f"sample is one row, so read it with seq_len={index.seq_len} (got {seq_len}), or "
            "repack with --seq-len to match"
        )
    mask = bestfit if mask_doc_ends is None else mask_doc_ends
    eos_id = index.eos_id if index is not None else None
    if mask and eos_id is None:
        raise ValueError(
            "mask_doc_ends=True needs a dataset packed with EOS ids (its index has eos_id "
            "null, or it is read without an index)"
        )
    if index is None:
        # Shard URLs read without their index.json: nothing says whether the ids carry a
        # loss mask, and no id of a vocabulary reaches bit 31, so split it in any case.
        return RowLabels(None, None, None, mask, loss_mask=True)
    loss_mask = index.loss_mask is not None
    if not bestfit and not mask and not loss_mask:
        return None
    pad_id = index.pad_id if bestfit else None
    # A stored mask decides its rows' targets: the rules above fill in only elsewhere.
    return RowLabels(pad_id, eos_id, index.bos_id, mask, loss_mask, (True,) if loss_mask else ())


def labelled_rows(rows: torch.Tensor, labels: RowLabels | None) -> dict[str, torch.Tensor]:
    """``{"input_ids", "labels"}`` int64 ``[B, S-1]`` of rows ``[B, S]`` under ``labels``
    (the loss bit stripped, -100 where the rule says): one batch outside the Loader's
    chunked path (``global_batch_at``)."""
    no_loss = None
    if labels is not None:
        rows, no_loss = labels.split(rows)
    t = rows.to(torch.int64)
    out = {"input_ids": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous()}
    if labels is None:
        return out
    masked = labels.masked(rows, labels.padding(rows), no_loss)
    if masked is not None:
        out["labels"].masked_fill_(masked, IGNORE_INDEX)
    return out
