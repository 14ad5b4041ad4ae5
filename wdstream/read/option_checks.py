"""One check of a reader's numeric options, shared by every place that takes them: the
:class:`~wdstream.Loader`, ``wdstream explain`` and ``wdstream stats --steps`` (its
``--seq-len``, ``--batch-size``, ``--world-size``), so a value one of them refuses is refused
by all, with the same message, before any data is read::

    check_read_options(seq_len=0)          ValueError: seq_len must be an integer >= 1, got 0
    check_read_options(shuffle_lanes=0)    (explain printed rows for it; the Loader refused)
    check_read_options(seq_len=-1)         (explain: a ZeroDivisionError)

Each option is an integer (not a bool, not a float) in its range; None means "not given"
(the caller's default applies). A ``seq_len`` is at most :data:`MAX_SEQ_LEN`: rows index
their tokens in int32 (``cu_seqlens``), as the index holds ``seq_len + 1`` below 2**31.
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["MAX_SEQ_LEN", "check_read_options"]

MAX_SEQ_LEN = 2**31 - 2
_AT_LEAST_ONE = frozenset({
    "seq_len", "batch_size", "world_size", "shuffle_window", "shuffle_lanes",
    "chunk_batches", "streams", "epochs", "batches_per_epoch", "max_tokens",
    "tokenize_threads", "prefetch_factor",
})  # fmt: skip
_AT_LEAST_ZERO = frozenset({"seed", "num_workers", "rank"})
_MOST = {"seq_len": MAX_SEQ_LEN}


def check_read_options(**options: Any) -> None:
    """Refuse the first of ``options`` (reader option name -> value, None: not given) that is
    not an integer in its range; names the option not listed here pass unchecked.

    Raises:
        ValueError: naming the option, its range and the value (a ``ValueError`` so that
            every CLI command prints it as one ``Error:`` line).
    """
    for name, value in options.items():
        if value is None or (name not in _AT_LEAST_ONE and name not in _AT_LEAST_ZERO):
            continue
        low = 1 if name in _AT_LEAST_ONE else 0
        high = _MOST.get(name)
        integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if not integral or value < low or (high is not None and value > high):
            within = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise ValueError(f"{name} must be an integer {within}, got {value!r:.60}")
