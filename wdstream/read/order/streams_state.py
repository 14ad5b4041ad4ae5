"""The reader's resume state: its one format, and the checks that refuse a broken or hostile one.

A state is a few hundred bytes of JSON (``docs/READER.md``, "Loader state")::

    {"version": 1, "config": {...}, "streams": [<cursor>, <cursor>], "next_stream": 1,
     "chunk_left": 9, "iter_stop": 1, "worker": null}

A :class:`StreamsPosition` is the part a reader moves through (the cursors, whose turn is next, the
stop epoch of the iteration in progress, the worker a share belongs to); ``config`` comes
from the reader and ``chunk_left`` from the next stream's cursor, so both only serve to
check a state against the reader that loads it.

Checking a state, cheapest first; every refusal is a :class:`StateMismatchError` naming the
field as a path (``streams[1].offset``) and the bad value:

1. :func:`parse_state`: keys (none missing, none unknown), types (a bool is not an int),
   ranges (int64, not negative), the config equal to the reader's, one cursor per stream.
2. :func:`check_iter_stop` and :func:`check_turns`: what a round-robin of equal streams
   allows. Streams are served in turn, one chunk of ``K`` batches each, and all yield the
   same batches per epoch, so with ``next_stream = s`` the streams before ``s`` are exactly
   one chunk ahead of those after it::

       K=2, next_stream=2:   streams[0] batch 6 | streams[1] batch 6 | streams[2] batch 4 or 5
                             | streams[3] batch 4            (one position, no freedom left)

3. The reader's context checks each cursor against the epoch plan (``check_cursor``), and
   raw-text streams check their window when they re-read it (:func:`check_in_window`).

Raw-text cursors cannot be checked against a plan (there is no index: a window may start at
any byte of a file), so a raw-text state is *sealed*: each cursor carries ``check``, one
8-hex tag per field, a hash of the field's name and value keyed by the reader's config and
the stream number (:func:`cursor_seal`). Any edit of a field is refused naming that field;
a state of another stream or configuration fails every tag.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from wdstream.errors import StateMismatchError
from wdstream.read.order.state_fields import (
    SEAL_KEY,
    TAG_HEX,
    cursor_seal,
    dict_field,
    int_field,
    json_kind,
    mismatch,
    quote_value,
    same_value,
)

__all__ = [
    "STATE_KEYS",
    "STATE_VERSION",
    "StreamsPosition",
    "check_in_window",
    "check_iter_stop",
    "check_turns",
    "parse_state",
]

STATE_VERSION = 1
STATE_KEYS = ("version", "config", "streams", "next_stream", "chunk_left", "iter_stop", "worker")

_HINT_WORKERS = 64  # worker counts listed when a state's stream count differs


@dataclass
class StreamsPosition:
    """Where a reader is: everything of a state that iteration changes.

    Attributes:
        cursors: one cursor per stream (``docs/READER.md``, "The stream cursor").
        next_stream: the stream whose turn is next.
        iter_stop: stop epoch of the iteration in progress; None when none is.
        worker: ``(id, num_workers)`` when this is one torch worker's share of the streams.
    """

    cursors: list[dict[str, int]]
    next_stream: int = 0
    iter_stop: int | None = None
    worker: tuple[int, int] | None = None
    quarantined: ClassVar[int] = 0  # per-rank streams never mask a row (on_corrupt="raise")

    def copy(self) -> StreamsPosition:
        return StreamsPosition(
            [dict(c) for c in self.cursors], self.next_stream, self.iter_stop, self.worker
        )

    @property
    def epoch(self) -> int:
        """The epoch of the stream whose turn is next: the reader's current epoch."""
        return self.cursors[self.next_stream]["epoch"]

    def begin(self, epochs: int | None) -> int | None:
        """Set and return the stop epoch of the iteration starting (or continuing) here.

        A state taken mid-iteration keeps its stop, so it finishes that iteration; otherwise
        the iteration runs the next ``epochs`` epochs (forever when None).
        """
        if epochs is None:
            self.iter_stop = None
        elif self.iter_stop is None:
            self.iter_stop = self.epoch + epochs
        return self.iter_stop

    def members(self) -> list[int]:
        """The streams this position moves: all, or one worker's share (``next_stream`` mod W)."""
        n = len(self.cursors)
        if self.worker is None or self.worker[1] == 1:
            return list(range(n))
        w = self.worker[1]
        return [t for t in range(n) if t % w == self.next_stream % w]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (for the hand-off to workers, which trust it: their loader checked it)."""
        worker = list(self.worker) if self.worker is not None else None
        return {"cursors": self.cursors, "next_stream": self.next_stream,
                "iter_stop": self.iter_stop, "worker": worker}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StreamsPosition:
        worker = tuple(d["worker"]) if d["worker"] is not None else None
        return cls(d["cursors"], d["next_stream"], d["iter_stop"], worker)

    def hand_over(self, stream: int, cursors: list[dict[str, Any]], j: int) -> None:
        """Batch ``j`` of a chunk of ``stream`` reached the caller: its cursor is the
        stream's, and after the chunk's last batch the turn passes to the next stream."""
        self.cursors[stream] = cursors[j]
        self.next_stream = (stream + 1) % len(self.cursors) if j == len(cursors) - 1 else stream

    def pass_turn(self, stream: int) -> None:
        """``stream`` finished its epochs and passed its turn (raw text)."""
        self.next_stream = (stream + 1) % len(self.cursors)


def _streams_hint(saved: Any, now: int) -> str:
    """How to resume a state saved with another stream count (``num_workers``)."""
    if json_kind(saved) != "int" or saved < 1:
        return ""
    # The worker counts that divide it, up to a bound (a hostile count must not be factored).
    small = [str(w) for w in range(1, min(saved, _HINT_WORKERS) + 1) if saved % w == 0]
    workers = ", ".join(["0", *small]) + (", ..." if saved > _HINT_WORKERS else "")
    return (
        f". It was saved with streams={saved} (the default for num_workers={saved}); this "
        f"reader has streams={now}. To resume it, pass streams={saved} to Loader (then any "
        f"num_workers in {workers} gives the same batches), or keep num_workers={saved}"
    )


def _check_config(saved: Any, config: dict[str, Any]) -> None:
    saved = dict_field("config", saved, list(config))
    diff = {k: (saved[k], v) for k, v in config.items() if not same_value(saved[k], v)}
    if diff:
        what = ", ".join(
            f"{k}: saved {quote_value(a)}, now {b!r}" for k, (a, b) in sorted(diff.items())
        )
        hint = _streams_hint(diff["streams"][0], config["streams"]) if "streams" in diff else ""
        raise StateMismatchError(f"state does not belong to this reader ({what}){hint}")


def _cursor(path: str, value: Any, keys: Sequence[str]) -> dict[str, int]:
    c = {k: int_field(f"{path}.{k}", v) for k, v in dict_field(path, value, keys).items()}
    if c["batches"] == 0:
        # No batch of this epoch done: the cursor is the epoch's start, all zeros.
        for k in keys:
            if k not in ("epoch", "batches") and c[k] != 0:
                raise mismatch(f"{path}.{k}", c[k], "must be 0 at an epoch's start (batches 0)")
    return {k: c[k] for k in keys}


def _worker(value: Any, n_streams: int) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise mismatch("worker", value, "None or [worker id, num_workers] expected")
    n = int_field("worker[1]", value[1], lo=1, hi=n_streams + 1)
    if n_streams % n:
        raise mismatch("worker[1]", n, f"num_workers must divide streams={n_streams}")
    return int_field("worker[0]", value[0], hi=n), n


def _unseal(
    path: str, value: dict[str, Any], config: dict[str, Any], stream: int, keys: Sequence[str]
) -> dict[str, Any]:
    """``value`` without its ``check``, once every field's tag matches.

    Raises:
        StateMismatchError: naming the first edited field (and the others), or ``check``
            when it is missing (a state saved before cursors were sealed) or malformed.
    """
    if isinstance(value, dict) and SEAL_KEY not in value:
        raise mismatch(
            f"{path}.{SEAL_KEY}", None,
            "missing: a raw-text cursor carries a check of its fields, and a "
            "state saved without one cannot vouch for its position, so it is refused; "
            "resume from a state saved by this version, or start the run's epoch afresh",
        )  # fmt: skip
    fields = dict_field(path, value, (*keys, SEAL_KEY))
    tags = fields[SEAL_KEY]
    n = TAG_HEX * len(keys)
    if not isinstance(tags, str) or len(tags) != n:
        raise mismatch(f"{path}.{SEAL_KEY}", tags, f"a string of {n} hex digits expected")
    cursor = {k: int_field(f"{path}.{k}", fields[k]) for k in keys}
    want = cursor_seal(config, stream, cursor, keys)
    bad = [k for i, k in enumerate(keys) if tags[i * TAG_HEX : (i + 1) * TAG_HEX]
           != want[i * TAG_HEX : (i + 1) * TAG_HEX]]  # fmt: skip
    if len(bad) == len(keys):
        raise mismatch(
            f"{path}.{SEAL_KEY}", tags,
            "no field matches the check: the cursor belongs to another stream or reader",
        )  # fmt: skip
    if bad:
        also = f" (also {', '.join(bad[1:])})" if len(bad) > 1 else ""
        raise mismatch(
            f"{path}.{bad[0]}", cursor[bad[0]],
            f"differs from the value the cursor's check was made with: the field was "
            f"edited{also}",
        )  # fmt: skip
    return {k: fields[k] for k in keys}


def parse_state(
    state: Any, config: dict[str, Any], cursor_keys: Sequence[str], sealed: bool = False
) -> tuple[StreamsPosition, int]:
    """Check the shape of ``state`` and that it belongs to the reader of ``config``.

    Args:
        state: a state as saved (parsed JSON).
        config: the loading reader's config (``TokenDataset.config()``).
        cursor_keys: the keys of this reader's cursors.
        sealed: cursors carry a ``check`` of their fields (raw text, :func:`cursor_seal`).

    Returns:
        The position and the saved ``chunk_left`` (checked against the plan by the caller).

    Raises:
        StateMismatchError: naming the first bad field and its value.
    """
    if not isinstance(state, dict):
        raise mismatch("state", state, "a dict expected")
    version = state.get("version")
    if not same_value(version, STATE_VERSION):
        raise mismatch(
            "version", version, f"not a wdstream reader state of version {STATE_VERSION}"
        )
    state = dict_field("", state, STATE_KEYS)
    _check_config(state["config"], config)
    n = config["streams"]
    streams = state["streams"]
    if not isinstance(streams, list) or len(streams) != n:
        raise mismatch("streams", streams, f"a list of {n} cursors expected")
    if sealed:
        streams = [
            _unseal(f"streams[{t}]", c, config, t, cursor_keys) for t, c in enumerate(streams)
        ]
    cursors = [_cursor(f"streams[{t}]", c, cursor_keys) for t, c in enumerate(streams)]
    next_stream = int_field("next_stream", state["next_stream"], hi=n)
    chunk_left = int_field("chunk_left", state["chunk_left"], lo=1, hi=config["chunk_batches"] + 1)
    stop = state["iter_stop"]
    iter_stop = None if stop is None else int_field("iter_stop", stop)
    worker = _worker(state["worker"], n)
    return StreamsPosition(cursors, next_stream, iter_stop, worker), chunk_left


def check_iter_stop(position: StreamsPosition, epochs: int | None) -> None:
    """Refuse a stop epoch no iteration of equal streams could have at this position.

    The iteration in progress stops at ``iter_stop``: no stream is past it, a stream that
    reached it stands at its start, and (with ``epochs`` per iteration) it began at most
    ``epochs`` epochs before it, so not after the streams' epoch.
    """
    stop = position.iter_stop
    if stop is None:
        return
    members = position.members()
    for t in members:
        c = position.cursors[t]
        if c["epoch"] > stop or (c["epoch"] == stop and c["batches"] > 0):
            raise mismatch(
                "iter_stop", stop,
                f"streams[{t}] is at batch {c['batches']} of epoch {c['epoch']}, past the stop",
            )  # fmt: skip
    first = min(position.cursors[t]["epoch"] for t in members)
    if epochs is not None and stop - epochs > first:
        raise mismatch(
            "iter_stop", stop,
            f"more than epochs={epochs} after the streams' epoch {first}: the state was saved "
            "by a reader with more epochs per iter(); pass that epochs= to finish its iteration",
        )  # fmt: skip


def check_turns(
    position: StreamsPosition, batches_per_stream: Callable[[int], int], k: int
) -> None:
    """Refuse cursors that equal streams served in turn, ``k`` batches each, cannot have.

    Every stream yields ``batches_per_stream(epoch)`` batches per epoch in chunks aligned
    to ``k``, so a stream's progress is a chunk ``(epoch, j)``. The streams before
    ``next_stream`` (in its share) have had their turn in this round and stand at the start
    of the chunk after the round's chunk; those after it stand at the start of the round's
    chunk; ``next_stream`` itself may be inside that chunk (a loader hands out batches one
    by one). The round's chunk is the one most streams agree on.

    Raises:
        StateMismatchError: naming the first stream whose ``epoch``/``batches`` disagree.
    """
    s = position.next_stream
    members = position.members()

    def chunk_of(t: int) -> tuple[int, int] | None:
        """The round's chunk according to stream ``t`` (None: no chunk fits)."""
        c = position.cursors[t]
        e, j = c["epoch"], c["batches"] // k
        if t != s and c["batches"] % k:
            return None  # only the stream being served can be inside its chunk
        if t >= s:
            return e, j
        if j > 0:
            return e, j - 1
        return (e - 1, -(-batches_per_stream(e - 1) // k) - 1) if e > 0 else None

    votes = {t: chunk_of(t) for t in members}
    tally = Counter(v for v in votes.values() if v is not None)
    if not tally:
        raise mismatch(f"streams[{s}].batches", position.cursors[s]["batches"], "no round fits")
    here = max(tally, key=lambda r: (tally[r], r == votes[s]))
    for t in members:
        if votes[t] != here:
            agree = f"{tally[here]} of {len(members)} streams"
            raise _turn_error(position, t, here, agree, batches_per_stream, k)


def _turn_error(
    position: StreamsPosition,
    t: int,
    here: tuple[int, int],
    agree: str,
    batches_per_stream: Callable[[int], int],
    k: int,
) -> StateMismatchError:
    """Where stream ``t`` must be when the round's chunk is ``here``, as the error."""
    s = position.next_stream
    e, j = here
    if t < s:
        nb = batches_per_stream(e)
        e, j = (e, j + 1) if (j + 1) * k < nb else (e + 1, 0)
    c = position.cursors[t]
    name = "epoch" if c["epoch"] != e else "batches"
    where = f"in the chunk of batches [{j * k}, {(j + 1) * k})" if t == s else f"at batch {j * k}"
    return mismatch(
        f"streams[{t}].{name}", c[name],
        f"streams served in turn (next_stream={s}, chunk_batches={k}; those before "
        f"next_stream one chunk ahead) put it {where} of epoch {e}, where {agree} agree",
    )  # fmt: skip


def check_in_window(stream: int, cursor: dict[str, int], starts: np.ndarray) -> None:
    """Refuse a cursor pointing past its re-read window: ``starts`` are its samples' offsets.

    Raises:
        StateMismatchError: for ``emitted`` past the window's samples or ``offset`` past
            that sample's tokens.
    """
    n, k = len(starts) - 1, cursor["emitted"]
    if k >= n:
        raise mismatch(f"streams[{stream}].emitted", k, f"its window holds {n} documents")
    size = int(starts[k + 1]) - int(starts[k])
    if cursor["offset"] >= size:
        raise mismatch(
            f"streams[{stream}].offset", cursor["offset"], f"that document has {size} tokens"
        )
