"""A mixture's rows into a chunk in one pass: one copy loop over every source's segments.

The rows of a chunk come from several sources. Each source's rows among them are runs of
consecutive rows of one of its epochs (a run ends where the rank's rows skip other ranks'
and at the source's epoch end). Every run's segments are cut by its source's global order,
each naming its window as ``tag | w`` with a tag per run (which names its source and
epoch), and one :func:`~wdstream.read.order.window_data.copy_rows` copies them all, straight
into their rows of the chunk::

    chunk rows     0    1    2    3    4    5    6    7
    source         web  code web  code web  web  code web
    runs           web 0-4 -> rows [0 2 4 5 7]   code 0-2 -> rows [1 3 6]
    one copy       segments of web's run, then code's, filled rows [0 2 4 5 7 1 3 6]

Filling each source on its own (a fill per run) paid each fill's set-up per source: the
window lookups, the read-ahead checks, the row places, the copy loop's entry and exit.
"""

from __future__ import annotations

import itertools

import numpy as np

from wdstream.read.mixture.interleave import Block
from wdstream.read.mixture.schedule import Schedule
from wdstream.read.order.global_order import GlobalOrder
from wdstream.read.order.row_places import RowPlaces
from wdstream.read.order.window_data import (
    WINDOW_MASK,
    WINDOW_TAG,
    Hit,
    Segment,
    WindowData,
    copy_rows,
    finish_copy,
    mask_rows,
)
from wdstream.read.sources.packed import ShardSource

__all__ = ["Run", "block_runs", "fill_block", "fill_rows", "fill_runs", "source_runs"]

Run = tuple[int, int, int, np.ndarray]  # (source, epoch, first row in it, rows of the chunk)


def fill_rows(
    sched: Schedule,
    orders: list[GlobalOrder],
    rows: np.ndarray,
    tokens: np.ndarray,
    doc_start: np.ndarray | None,
) -> tuple[np.ndarray, list[Hit]]:
    """Mixture rows ``rows`` (increasing) of schedule ``sched`` over the sources' ``orders``
    into ``tokens`` ([len(rows), T + 1]) with :func:`fill_runs`; returns their sources and
    the rows masked. Consecutive rows go by :func:`fill_block`."""
    n = len(rows)
    if n and rows[-1] - rows[0] == n - 1:
        return fill_block(sched, orders, int(rows[0]), n, tokens, doc_start)
    return _fill_located(sched, orders, rows, tokens, doc_start)


def _fill_located(
    sched: Schedule,
    orders: list[GlobalOrder],
    rows: np.ndarray,
    tokens: np.ndarray,
    doc_start: np.ndarray | None,
) -> tuple[np.ndarray, list[Hit]]:
    """:func:`fill_rows` of any rows: each located in the schedule, then grouped in runs."""
    src, idx = sched.locate(rows)
    runs, placed = source_runs(src, idx, [o.rows_per_epoch for o in orders])
    places = RowPlaces(placed, tokens.shape[1])
    return src, fill_runs(orders, runs, places, tokens, doc_start)


def fill_block(
    sched: Schedule,
    orders: list[GlobalOrder],
    row: int,
    n: int,
    tokens: np.ndarray,
    doc_start: np.ndarray | None,
) -> tuple[np.ndarray, list[Hit]]:
    """:func:`fill_rows` of the consecutive rows ``[row, row + n)`` (one rank's steps):
    their runs from the schedule's cached :class:`Block` (counts and first indices: no
    lookup or sort per chunk), the rows' places made once per place in the period."""
    got = sched.block(row, n)
    if got is None:  # across two schedule pieces
        rows = np.arange(row, row + n, dtype=np.int64)
        return _fill_located(sched, orders, rows, tokens, doc_start)
    block, q = got
    runs = block_runs(block, q, [o.rows_per_epoch for o in orders])
    src = block.source.copy()  # the batches' own (the block's is shared)
    return src, fill_runs(orders, runs, block.places(tokens.shape[1]), tokens, doc_start)


def source_runs(
    src: np.ndarray, idx: np.ndarray, rows_per_epoch: list[int]
) -> tuple[list[Run], np.ndarray]:
    """The runs of rows whose sources are ``src`` and indices in them ``idx`` (increasing
    per source), source by source, each run's rows in order; and all their rows in that
    order (the runs' rows one after the other: where the copy's filled rows go)."""
    order = np.argsort(src, kind="stable")
    counts = np.bincount(src, minlength=len(rows_per_epoch)).tolist()
    firsts = idx[order].tolist()
    runs: list[Run] = []
    a = 0
    for s, m in enumerate(counts):
        if not m:
            continue
        b, r = a + m, rows_per_epoch[s]
        first, last = firsts[a], firsts[b - 1]
        if last - first == m - 1 and first // r == last // r:  # one run: the rule
            runs.append((s, first // r, first % r, order[a:b]))
        else:
            runs += _split(s, idx[order[a:b]], order[a:b], r)
        a = b
    return runs, order


def block_runs(block: Block, q: int, rows_per_epoch: list[int]) -> list[Run]:
    """:func:`source_runs` of consecutive rows (``block``, ``q`` periods on: their
    sources, grouped; the same runs, in the same order), from each source's count and
    first index alone: a source's rows of consecutive mixture rows are consecutive rows
    of it."""
    runs: list[Run] = []
    firsts, weights = block.firsts, block.weights
    for s, m, into in block.groups:  # the sources with rows here, their places cached
        first = firsts[s] + q * weights[s]
        epoch, k = divmod(first, rows_per_epoch[s])
        if k + m <= rows_per_epoch[s]:  # one run: the rule
            runs.append((s, epoch, k, into))
        else:
            idx = np.arange(first, first + m, dtype=np.int64)
            runs += _split(s, idx, into, rows_per_epoch[s])
    return runs


def _split(s: int, idx: np.ndarray, into: np.ndarray, r: int) -> list[Run]:
    """Source ``s``'s rows ``idx`` (at chunk rows ``into``) as runs of consecutive rows of
    one of its epochs (``r`` rows each)."""
    epoch = idx // r
    cut = np.flatnonzero((np.diff(idx) != 1) | (np.diff(epoch) != 0)) + 1
    bounds = [0, *cut.tolist(), len(idx)]
    return [(s, *divmod(int(idx[a]), r), into[a:b]) for a, b in itertools.pairwise(bounds)]


def fill_runs(
    orders: list[GlobalOrder],
    runs: list[Run],
    places: RowPlaces,
    tokens: np.ndarray,
    doc_start: np.ndarray | None,
) -> list[Hit]:
    """Fill ``runs`` (:func:`source_runs`: covering every row of ``tokens``, at the rows
    ``places`` names) into ``tokens`` ([n, T + 1]) with one :func:`copy_rows`;
    ``doc_start`` as :meth:`GlobalOrder.fill`.

    Returns:
        The rows masked (``on_corrupt="mask"``), with the stand-in sample each holds.
    """
    if len(runs) == 1:  # one run: all the chunk's rows, in order
        s, e, k, _ = runs[0]
        return orders[s].fill(e, k, tokens, doc_start)
    T1, with_docs = tokens.shape[1], doc_start is not None
    run_of: list[tuple[GlobalOrder, int]] = []  # by tag: the run's order and epoch
    cut: list[list[Segment]] = []
    segments: list[Segment] = []
    # One loop, no comprehension or chain: a fill runs once per chunk, after the chunk's
    # batches moved ~4 MB through the caches, and each code object it enters costs there
    # several times what it costs warm (docs/MIXTURES.md, session 46).
    for j, (s, e, k, into) in enumerate(runs):
        order = orders[s]
        run_of.append((order, e))
        part = order.fill_segments(e, k, len(into), j * WINDOW_TAG)
        cut.append(part)
        segments += part
    windows, alone = _read_alone(runs, run_of, cut, with_docs)

    def load(key: int) -> WindowData:
        order, epoch = run_of[key // WINDOW_TAG]
        return order.data.window_data(epoch, key & WINDOW_MASK, with_docs)

    def source_of(key: int) -> ShardSource:
        return run_of[key // WINDOW_TAG][0].source

    flat = tokens.reshape(-1)
    flat_ds = None
    if doc_start is not None:
        doc_start[:] = False
        flat_ds = doc_start.reshape(-1)
    for order, epoch, ws in alone:  # their whole reads, before the copy (GlobalOrder.fill)
        order.data.start_reads(epoch, ws, with_docs)
    got = copy_rows(segments, windows, load, flat, flat_ds, T1, source_of,
                    run_of[0][0].quarantine, places)  # fmt: skip
    if not got:  # nothing masked: done where every id was checked as read or is admitted
        for data in windows.values():  # in the whole block at once
            if data.unverified is not None:
                if _admitted(run_of, tokens):
                    return []
                break
        else:
            return []
    hits: list[Hit] = []
    a = 0
    for (order, _), part, (_, _, _, into) in zip(run_of, cut, runs, strict=True):
        b = a + len(into)
        mine = [(r - a, bad) for r, bad in got if a <= r < b]
        done = finish_copy(part, windows, flat, into, T1, order.source, mine)
        if done:
            mask_rows(tokens, doc_start, done, order.neutral)
            hits += done
        a = b
    return hits


def _admitted(run_of: list[tuple[GlobalOrder, int]], tokens: np.ndarray) -> bool:
    """Whether every id of the filled block ``tokens`` is of the vocabulary all the runs'
    sources share (the same ``id_limit``: one max over the block, in place, where checking
    run by run gathered each run's rows first, :func:`finish_copy`); False also where their
    limits differ, and then each run is checked on its own."""
    limits = [order.source.id_limit for order, _ in run_of]
    if len({None if x is None else (x.n_vocab, x.masked) for x in limits}) != 1:
        return False
    return limits[0] is None or limits[0].admits(tokens)


def _read_alone(
    runs: list[Run],
    run_of: list[tuple[GlobalOrder, int]],
    cut: list[list[Segment]],
    with_docs: bool,
) -> tuple[dict[int, WindowData], list[tuple[GlobalOrder, int, list[int]]]]:
    """The samples read alone (:meth:`WindowReads.samples_alone`) for the runs' windows not
    read yet, asked once per source and epoch for all its runs (a window read alone holds
    only the samples asked for), and given to each of those runs' tags; and per source and
    epoch the windows so read (their whole reads are started after the copy)."""
    windows: dict[int, WindowData] = {}
    alone_in: list[tuple[GlobalOrder, int, list[int]]] = []
    j = 0
    while j < len(runs):
        group = j + 1
        while group < len(runs) and runs[group][:2] == runs[j][:2]:
            group += 1
        order, epoch = run_of[j]
        segs = cut[j] if group == j + 1 else [x for part in cut[j:group] for x in part]
        alone = order.data.samples_alone(epoch, segs, with_docs)
        if alone:  # mostly not (a local source's, past an iteration's first rows)
            alone_in.append((order, epoch, list(alone)))
            for tag in range(j, group):
                windows.update({tag * WINDOW_TAG | w: data for w, data in alone.items()})
        j = group
    return windows, alone_in
