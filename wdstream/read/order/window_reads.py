"""How a global order's process reads its windows' sample data: whole, ahead or in line,
a first batch's few samples alone, verified by this process or shared with other workers.

The global order (:mod:`~wdstream.read.order.global_order`) says which samples make a row;
a :class:`WindowReads` is its collaborator that reads and keeps the windows those rows are
cut from (a :class:`~wdstream.read.order.read_ahead.WindowCache`), in the mode the
iteration asks for (:meth:`WindowReads.read_mode`): a torch worker of several verifies only
the samples of its own rows (:meth:`WindowReads.check_only`) and may split a window's
fetches with the other workers (:meth:`WindowReads.share_reads`).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable

import numpy as np

from wdstream.read.order.plan import EpochPlan, OrderWindow, WindowGeometry, joined
from wdstream.read.order.read_ahead import WindowCache, WindowKey
from wdstream.read.order.window_data import (
    WINDOW_MASK,
    CopyTimeChecks,
    Segment,
    WindowData,
    emitted_bad,
    samples_alone,
    samples_used,
)
from wdstream.read.sources.exchange import (
    Needers,
    SharedPieces,
    WindowShares,
    remove_share_folder,
    share_folder,
)
from wdstream.read.sources.fetches import ReadStop
from wdstream.read.sources.packed import ShardSource
from wdstream.read.sources.quarantine import QuarantinedReads
from wdstream.read.weak_calls import weak_method

__all__ = ["ReadSpans", "WindowReads"]

# ``(epoch, t0, t1)`` -> the token ranges ``[a, b)`` of ``[t0, t1)`` of the epoch's stream
# that one consumer will read (see ``WindowReads.check_only``).
ReadSpans = Callable[[int, int, int], list[tuple[int, int]]]

# Rows that hold at most 1/16 of a window not read yet read their samples alone (fill).
_ALONE_SHARE = 16


class WindowReads:
    """The windows' sample data of one global order, read and kept for its fills.

    Args:
        source: the packed dataset.
        quarantine: read through :class:`~wdstream.read.sources.quarantine.QuarantinedReads`
            (``on_corrupt="mask"``).
        geometry: the order's windows.
        plan: the order's epoch plans (``GlobalOrder.plan``).
        window: the order's windows' metadata (``GlobalOrder.window``).
    """

    def __init__(
        self,
        source: ShardSource,
        quarantine: bool,
        geometry: WindowGeometry,
        plan: Callable[[int], EpochPlan],
        window: Callable[[int, int], OrderWindow],
    ) -> None:
        self.source = source
        self.reads = QuarantinedReads(source) if quarantine else source
        self.geometry = geometry
        self.n_windows = geometry.n_windows
        self.plan = plan
        self.window = window
        self._cache = WindowCache(
            weak_method(self._load_data), deepen=source.remote, read_ahead=source.remote
        )
        # Set while release() drops the reads (see there), or in a torch worker once the
        # training process left the iteration (stop_when).
        self._outside: Callable[[], bool] | None = None
        self._stop = ReadStop()
        self._alone = True  # a cold window's few samples read alone first (read_mode)
        self._hot: tuple[WindowKey, WindowData] | None = None  # the window last cut from
        # None: the only consumer, verifying every sample read; else a worker of several
        # (see check_only).
        self._read_spans: ReadSpans | None = None
        # The folder the order's torch workers share window reads through (made by the
        # first worker that shares; removed by this process), and, in such a worker, its
        # side of the share (see share_reads). A copy in a worker takes its maker's token.
        self.share_token = f"{os.getpid()}-{os.urandom(6).hex()}"
        if source.shares_reads:
            folder = share_folder(self.share_token)
            weakref.finalize(self, remove_share_folder, folder, os.getpid())
        self._sharing: WindowShares | None = None
        # ``(epoch, t0, t1)`` -> whether this process's rows read any of those tokens,
        # where its chunks are known (an iteration's): windows read ahead are those.
        self._reads: Callable[[int, int, int], bool] | None = None

    def window_data(self, epoch: int, w: int, with_docs: bool) -> WindowData:
        """The sample views of window ``w``, read with one ranged read per lane and shard
        (a shard's adjacent lanes as one, :func:`joined`; concurrently from remote stores)
        and kept while rows are cut from it; the next windows this process needs are read
        ahead (:mod:`~wdstream.read.order.read_ahead`).

        The window the last fill cut from is at hand without the cache (its lock, the
        read-ahead checks): the next fill mostly starts there, once per source in a mixture."""
        key = (epoch, w, with_docs)
        hot = self._hot
        if hot is not None and hot[0] == key:
            return hot[1]
        data = self._cache.get(key, self._following)
        self._hot = (key, data)
        return data

    def _following(self, key: WindowKey, n: int) -> list[WindowKey]:
        """Of the ``n`` windows after ``key``, those this process will cut rows from."""
        out = []
        epoch, w, with_docs = key
        for _ in range(n):
            epoch, w = (epoch, w + 1) if w + 1 < self.n_windows else (epoch + 1, 0)
            if self._needs(epoch, w):
                out.append((epoch, w, with_docs))
        return out

    def _needs(self, epoch: int, w: int) -> bool:
        """Whether this process will cut rows from window ``w`` (always, but where its
        chunks are known: past the iteration's end, or in a window of other workers'
        chunks only, its read-ahead would be fetched for nothing). Where every window is
        needed the window's metadata is left to its read (a read-ahead thread's)."""
        if self._reads is None:
            return True
        win = self.window(epoch, w)
        return self._reads(epoch, win.begin, win.end)

    def samples_alone(
        self, epoch: int, segments: list[Segment], with_docs: bool
    ) -> dict[int, WindowData]:
        """The windows of ``segments`` (of ``epoch``, any tags) neither read nor being read of
        which these rows hold few samples (at most 1/16): those samples alone
        (:func:`samples_alone`), by window (untagged); :meth:`GlobalOrder.fill` (a mixture's
        fill too) starts each window's whole read behind them before the rows are copied
        (start_reads); a local source only for an iteration's first rows (later read whole in
        line, as ever)."""
        # Segments run through windows in order; most fills touch only windows already
        # read or being read, and then no segment needs looking at.
        first, last = (segments[0][0], segments[-1][0]) if segments else (0, -1)
        hot = self._hot
        if first == last and hot is not None and hot[0] == (epoch, first & WINDOW_MASK, with_docs):
            return {}  # all in the window the last fill cut from: at hand (no lock taken)
        if not self._alone or not (self.source.remote or self._cache.empty()):
            return {}
        spanned = range(first & WINDOW_MASK, (last & WINDOW_MASK) + 1)
        wanted: dict[int, set[int]] = {
            w: set() for w in spanned if self._cache.cold((epoch, w, with_docs))
        }
        if not wanted:
            return {}
        for named, i, _, _ in segments:
            if named & WINDOW_MASK in wanted:
                wanted[named & WINDOW_MASK].add(i)
        out = {}
        for w, emitted in wanted.items():
            positions = self.window(epoch, w).positions
            if emitted and len(emitted) * _ALONE_SHARE <= len(positions):
                plan = self.plan(epoch)
                out[w] = samples_alone(self.reads, plan, positions, emitted, with_docs, self._stop)
        return out

    def start_reads(self, epoch: int, windows: Iterable[int], with_docs: bool) -> None:
        """Start reading windows ``windows`` of ``epoch`` (tagged or not) whole in the
        background, where they are neither read nor being read; a local source only names
        them, and the next rows read them in line (:meth:`WindowCache.start`)."""
        for w in windows:
            self._cache.start((epoch, w & WINDOW_MASK, with_docs))

    def release(self) -> None:
        """Drop the windows' sample views (they pin the mapped shards' file descriptors), any
        read-ahead and the threads reading: called when an iteration ends or is abandoned.

        The reads being dropped stop first: their pieces not started are not fetched, and a
        torch worker's reads waiting for a peer's piece end (:meth:`WindowShares.end`, which
        also tells the peers to wait no more for this one), and the GETs in flight are left
        to end on their own, their bytes dropped (:mod:`~wdstream.read.sources.fetches`):
        they were waited for (80-160 ms a worker from loopback S3, a stalled one up to the
        read timeout). Before that, the queued fetches of up to ``AHEAD_MAX`` windows read
        ahead were all made first (~0.1-0.2 s at the end of every iteration from loopback
        S3), and a worker whose peer had dropped a window's read before starting it waited for
        that peer's pieces until torch killed it (5 s)."""
        self._hot = None
        self._stop.set()
        if self._sharing is not None:
            self._sharing.end()
        try:
            self._cache.release()
            self.source.end_fetches()
        finally:
            # A new stop for the next reads: the GETs left in flight keep seeing theirs set.
            self._stop = ReadStop(self._outside)

    def stop_when(self, outside: Callable[[], bool] | None) -> None:
        """Stop the reads also once ``outside()`` is true (looked at while a read waits for
        its pieces): in a torch worker, the training process left the iteration it serves
        (:meth:`~wdstream.read.torch.handoff.WorkerHandoff.left`), so a chunk blocked in a
        stalled read ends at once instead of after the read's timeout. Set at the start of
        each of the worker's iterations (reads of a later one never see an earlier one's)."""
        self._outside = outside
        self._stop = ReadStop(outside)
        if self.source.remote:  # a window's metadata may read sidecars in line
            self.source.sidecars.stop_when(outside)

    def read_mode(self, background: bool = True, alone: bool = True) -> None:
        """How windows are read: ahead in background threads (else each where its rows
        are cut, and no thread is made: :meth:`StepChunks.first_chunk`); the few samples of
        a cold window's rows alone before the window whole (:meth:`samples_alone`), which
        only a first batch waits for (else: a torch worker after the training process made
        the first step, whose every chunk needs its windows whole anyway)."""
        self._cache.background = background
        self._alone = alone

    def check_only(self, read_spans: ReadSpans | None) -> None:
        """Make this order a torch worker's, one of several (``None``: the only consumer).

        A window is read whole (a few large ranged reads), but a worker cuts only its own
        chunks from it; the other workers verify theirs. Token windows then verify each
        sample at its first copy (:meth:`_load_unverified`); document windows verify, in
        the read-ahead, only the samples behind the token ranges ``read_spans`` names.
        Without this every worker would checksum every sample of each window,
        ``num_workers`` times the work. Set it only where this order fills nothing but
        those ranges (a worker's private copy).
        """
        self.release()
        self._read_spans = read_spans
        if read_spans is None and self._sharing is not None:
            self._sharing.close()
            self._sharing = None
        self._reads = None if read_spans is None else lambda e, a, b: bool(read_spans(e, a, b))

    def read_ahead_only(self, reads: Callable[[int, int, int], bool] | None) -> None:
        """Read ahead only windows with tokens ``reads(epoch, t0, t1)`` says this process
        reads (the only one: past an iteration's end nothing); None: every next one."""
        self._reads = reads

    def share_reads(self, worker: int, needers: Needers) -> None:
        """Make this torch worker (of several, after :meth:`check_only`) split the fetches
        of each window with the other workers whose chunks read it (``needers``): it
        fetches some of the window's pieces and takes the rest from them
        (:mod:`~wdstream.read.sources.exchange`), so a rank fetches each byte once."""
        self._sharing = WindowShares(share_folder(self.share_token), worker, needers)

    def _load_data(self, epoch: int, w: int, with_docs: bool) -> WindowData:
        plan, win = self.plan(epoch), self.window(epoch, w)
        pieces = joined([pc for p, q in self.geometry.spans(w) for pc in plan.pieces(p, q)])
        order = win.order
        sizes = [b - a for _, a, b in pieces]
        shares = self._sharing
        shared = shares.split((epoch, w), win.begin, win.end, sizes) if shares else None
        if not with_docs and self._read_spans is not None:
            return self._load_unverified(pieces, order, shared)
        checks = None
        if self._read_spans is not None and self.source.checksums:
            used = samples_used(
                win.begin + win.starts, order, self._read_spans(epoch, win.begin, win.end)
            )
            bounds = np.cumsum([0, *sizes])
            checks = [used[i:j] for i, j in zip(bounds[:-1], bounds[1:], strict=True)]
        if with_docs:
            parts = self.reads.read(pieces, docs=True, checks=checks, shared=shared,
                                    stop=self._stop)  # fmt: skip
            toks = [t for part in parts for t in part.tokens.views()]
            docs = [d for part in parts for d in part.doc_lens]
            return WindowData(toks, order.tolist(), [0] * len(order), [docs[k] for k in order],
                              bad=emitted_bad(parts, order))  # fmt: skip
        parts = self.reads.read(pieces, checks=checks, shared=shared, stop=self._stop)
        located = [part.tokens for part in parts]
        base_of = np.repeat(np.arange(len(located)), [len(x) for x in located])
        first = np.concatenate([x.first for x in located] or [np.zeros(0, dtype=np.int64)])
        bases = [x.base for x in located]
        return WindowData(bases, base_of[order].tolist(), first[order].tolist(), [],
                          bad=emitted_bad(parts, order))  # fmt: skip

    def _load_unverified(
        self, pieces: list[tuple[int, int, int]], order: np.ndarray, shared: SharedPieces | None
    ) -> WindowData:
        """A torch worker's window (one of several workers): it copies scattered samples,
        and verifies each right after its first copy (:meth:`GlobalOrder.fill`), while the
        bytes are in the cache. Checked by a read-ahead thread instead, in runs of the samples it
        uses, the sums cost 2-3x more there: every run is a GIL hand-off between that
        thread and the filling one, on cores the other workers already keep busy."""
        reads = self.reads.read(pieces, verify=False, shared=shared, stop=self._stop)
        located = [part.tokens for part in reads]
        checks = [part.checks for part in reads]
        counts = [len(x) for x in located]
        base_of = np.repeat(np.arange(len(located)), counts)[order].tolist()
        first = np.concatenate([x.first for x in located] or [np.zeros(0, dtype=np.int64)])
        unverified = CopyTimeChecks.of(checks, counts, order)
        bases = [x.base for x in located]
        return WindowData(bases, base_of, first[order].tolist(), [], unverified,
                          emitted_bad(reads, order))  # fmt: skip
