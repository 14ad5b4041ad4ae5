"""The record of masked rows (``on_corrupt="mask"``) where batches are handed out.

A row that cannot be delivered as packed is masked in its place by the order
(:mod:`wdstream.read.order.window_data`); what happened travels with its chunk, in the cursor
of its batch (``"quarantined"``: one plain dict per row and bad sample, made where the rows
were filled, a torch worker or this process). Here, as the batch is handed to the caller,
each event becomes a :class:`QuarantineEvent` in :attr:`QuarantineLog.events` and one
``logging.warning`` line (so once, however many workers read ahead), and ``max_quarantined``
decides whether the run may go on::

    loader = Loader("data/", on_corrupt="mask", max_quarantined=100)
    for batch in loader: ...       # default (None): 0.1 % of the rows handed out, >= 16 rows
    loader.quarantined   # [QuarantineEvent(step=41210, rank=0, row=3, shard='.../data-000017.tar',
                         #   sample=912, byte=7480832, reason='checksum mismatch (corrupt bytes)')]
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from wdstream.errors import QuarantineLimitError
from wdstream.read.order.steps import masked_rows

__all__ = ["DEFAULT_ALLOWANCE", "DEFAULT_FRACTION", "QuarantineEvent", "QuarantineLog"]

log = logging.getLogger("wdstream.read")

_SHOWN = 5  # events a limit error names
# The limit when none is given (max_quarantined=None): masked rows may be 0.1 % of the rows
# handed out, and 16 rows whatever the count, so a corrupt sample early in a run does not
# stop it while a dataset or store that fails throughout stops within a few batches.
DEFAULT_FRACTION = 0.001
DEFAULT_ALLOWANCE = 16


@dataclass(frozen=True)
class QuarantineEvent:
    """One masked row and one sample it held tokens of that could not be read.

    Attributes:
        step: the global (data) step of the batch.
        rank: the rank that read it.
        row: the row's index in that rank's batch.
        shard: the shard's URL.
        sample: the sample's index in its shard.
        byte: the byte offset of the sample's data in the shard (None: its sidecar could
            not be read either).
        reason: why it could not be delivered.
    """

    step: int
    rank: int
    row: int
    shard: str
    sample: int
    byte: int | None
    reason: str

    def __str__(self) -> str:
        at = f" at byte {self.byte}" if self.byte is not None else ""
        return (f"step {self.step} rank {self.rank} row {self.row}: {self.shard} sample "
                f"{self.sample}{at}: {self.reason}")  # fmt: skip


class QuarantineLog:
    """Masked rows as their batches are handed out, and the limit on them.

    Args:
        limit: ``max_quarantined``: an int, the most masked rows of the run (as counted in
            its state); a float in (0, 1), the largest fraction masked of the rows handed
            out through this log (this process, since the reader was made); None: the
            default, :data:`DEFAULT_FRACTION` (0.1 %) of the rows handed out through this
            log and at least :data:`DEFAULT_ALLOWANCE` (16) rows. A large int (``10**12``)
            sets no practical limit.
    """

    def __init__(self, limit: int | float | None) -> None:
        self.limit = limit
        self.events: list[QuarantineEvent] = []
        self.rows = 0  # rows handed out through this log
        self.masked = 0  # of them, masked

    def admit(self, cursor: dict[str, Any], before: int, rows: int) -> None:
        """Record the batch of ``rows`` rows whose cursor is ``cursor``, about to be handed
        out; ``before``: masked rows of the run before it.

        Raises:
            QuarantineLimitError: its masked rows take the run past ``limit`` (the batch
                must then not be handed out), naming the count and the last events.
        """
        self.rows += rows
        events = cursor.get("quarantined")
        if not events:
            return
        new = [QuarantineEvent(**e) for e in events]
        masked = masked_rows(cursor)
        over = self._over(before + masked, self.masked + masked)
        if over:
            last = "; ".join(str(e) for e in [*self.events, *new][-_SHOWN:])
            raise QuarantineLimitError(f"on_corrupt='mask': {over}; the data or its store is "
                                       f"failing. Last events: {last}")  # fmt: skip
        self.masked += masked
        self.events += new
        for e in new:
            log.warning("quarantined (masked in place, labels -100): %s", e)

    def _over(self, total: int, masked: int) -> str | None:
        """What exceeds the limit with ``total`` masked rows in the run and ``masked`` of
        this log's rows, or None."""
        limit = self.limit
        if limit is None:
            allowed = max(DEFAULT_ALLOWANCE, int(DEFAULT_FRACTION * self.rows))
            if masked <= allowed:
                return None
            return (f"{masked} of the {self.rows} rows handed out were masked, more than the "
                    f"default limit ({DEFAULT_FRACTION:.1%} of them, at least "
                    f"{DEFAULT_ALLOWANCE}; max_quarantined sets another)")  # fmt: skip
        if isinstance(limit, float) and masked > limit * self.rows:
            return (f"{masked} of the {self.rows} rows handed out were masked, more than "
                    f"max_quarantined={limit} of them")  # fmt: skip
        if isinstance(limit, int) and total > limit:
            return f"{total} rows masked in this run, more than max_quarantined={limit}"
        return None
