"""The global batch sequence: the rows of global step k, a pure function of the dataset, seed,
``seq_len``, the global batch size G and k -- the same on any number of ranks and workers.

Epoch ``e`` (all from ``index.json``, no communication)::

    shards in default_rng([seed, e]) order, samples concatenated     positions 0 .. N-1
    m lanes = m contiguous parts; window w = the next ceil(W/m) samples of every lane,
        emitted in default_rng([seed, e, w]).permutation             the epoch's token stream
    rows of T + 1 tokens cut from that stream                        rows 0 .. R-1
    global step s of the epoch = rows [s*G, (s+1)*G)                 S = R // G steps
    rank r of a world of W (G = W * B) takes rows [s*G + r*B, s*G + (r+1)*B)

So a window still mixes m distant parts of the data and every lane is read sequentially, as
with the per-rank streams, but there is one stream per epoch, not one per rank. Rows never
cross an epoch; the R - S*G rows at an epoch's end are left out (fewer than G). In concat
mode with the packed ``seq_len`` every row is exactly one packed sample.

Random access: the token offset of a row is ``row * (T + 1)``; the window holding it is found
by binary search over window token offsets (arithmetic for concat shards, a few sidecar
lookups otherwise), the sample inside it by ``searchsorted`` over the window's token counts.
No sample data is read but the rows' own, so ``batch_at(k)`` costs the same for any k.

Steps are counted from an *origin* ``(step, epoch, row)``: ``(0, 0, 0)`` for a fresh run. When
a run continues with another global batch size, the origin moves to where the saved step
ended, and steps of the new size run from there to the epoch end (the rest of that epoch
exactly once), then whole epochs again.
"""

from __future__ import annotations

import bisect
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from wdstream.read.order.plan import EpochPlan, OrderWindow, WindowGeometry, joined
from wdstream.read.order.read_ahead import WindowCache, WindowKey
from wdstream.read.order.row_places import RowPlaces
from wdstream.read.order.window_data import (
    WINDOW_MASK,
    CopyTimeChecks,
    Hit,
    Segment,
    WindowData,
    copy_rows,
    emitted_bad,
    finish_copy,
    mask_rows,
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
from wdstream.read.sources.packed import ShardSource
from wdstream.read.sources.quarantine import QuarantinedReads
from wdstream.read.sources.reads import neutral_id

__all__ = ["ORDER_VERSION", "GlobalOrder", "OrderConfig", "Origin", "ReadSpans"]

# The version of the algorithm above. Bump it with any change to which samples a step's rows
# are cut from: a state saved under another version is refused, not read in another order.
ORDER_VERSION = 1

# ``(epoch, t0, t1)`` -> the token ranges ``[a, b)`` of ``[t0, t1)`` of the epoch's stream
# that one consumer will read (see ``GlobalOrder.check_only``).
ReadSpans = Callable[[int, int, int], list[tuple[int, int]]]

_WINDOW_CACHE = 8  # windows' metadata kept per process (a few KB each)
# Rows that hold at most 1/16 of a window not read yet read their samples alone (fill).
_ALONE_SHARE = 16


@dataclass(frozen=True)
class OrderConfig:
    """Everything that fixes the global sequence (world size and workers do not)."""

    seq_len: int
    global_batch: int
    shuffle: bool
    seed: int
    shuffle_window: int
    shuffle_lanes: int


@dataclass(frozen=True)
class Origin:
    """Step ``step`` began at row ``row`` of epoch ``epoch`` (see the module docstring)."""

    step: int = 0
    epoch: int = 0
    row: int = 0


class GlobalOrder:
    """Locate and read the rows of any global step.

    Args:
        source: the packed dataset.
        cfg: the sequence's parameters.
        quarantine: ``on_corrupt="mask"``: a sample that cannot be read stands in masked and
            the rows holding its tokens are masked whole (:mod:`~wdstream.read.order.window_data`),
            instead of raising.

    Raises:
        ValueError: if an epoch holds less than one global batch.
    """

    def __init__(self, source: ShardSource, cfg: OrderConfig, quarantine: bool = False) -> None:
        self.source = source
        self.cfg = cfg
        self.quarantine = quarantine
        self.reads = QuarantinedReads(source) if quarantine else source
        self.neutral = neutral_id(source.index)
        self.row_tokens = cfg.seq_len + 1
        self.n_samples = int(source.samples.sum())
        self.rows_per_epoch = int(source.tokens.sum()) // self.row_tokens
        self.steps_per_epoch = self.rows_per_epoch // cfg.global_batch
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"dataset too small: {self.rows_per_epoch} rows of {self.row_tokens} tokens "
                f"per epoch, less than one global batch of {cfg.global_batch} rows "
                "(data-parallel ranks x batch_size); with tensor or pipeline "
                "parallelism the ranks of a model replica share one batch: give the "
                "data-parallel coordinates, Loader(..., mesh=device_mesh['dp'])"
            )
        lanes = cfg.shuffle_lanes if cfg.shuffle else 1
        self.geometry = WindowGeometry(0, self.n_samples, cfg.shuffle_window, lanes)
        self.n_windows = self.geometry.n_windows
        self._plans: OrderedDict[int, EpochPlan] = OrderedDict()
        self._windows: OrderedDict[tuple[int, int], OrderWindow] = OrderedDict()
        self._last_window: tuple[tuple[int, int], OrderWindow] | None = None
        self._lock = threading.Lock()
        self._last: tuple[int, int] | None = None  # (epoch, window) of the last rows cut
        self._cache = WindowCache(self._load_data, deepen=source.remote, read_ahead=source.remote)
        self._alone = True  # a cold window's few samples read alone first (read_mode)
        self._hot: tuple[WindowKey, WindowData] | None = None  # the window last cut from
        # None: the only consumer, verifying every sample read; else a worker of several
        # (see check_only).
        self._read_spans: ReadSpans | None = None
        # The folder this order's torch workers share window reads through (made by the
        # first worker that shares; removed by this process), and, in such a worker, its
        # side of the share (see share_reads).
        self._share_token = f"{os.getpid()}-{os.urandom(6).hex()}"
        if source.shares_reads:
            folder = share_folder(self._share_token)
            weakref.finalize(self, remove_share_folder, folder, os.getpid())
        self._sharing: WindowShares | None = None
        # ``(epoch, t0, t1)`` -> whether this process's rows read any of those tokens,
        # where its chunks are known (an iteration's): windows read ahead are those.
        self._reads: Callable[[int, int, int], bool] | None = None

    def __getstate__(self) -> dict[str, object]:
        return {"source": self.source, "cfg": self.cfg, "quarantine": self.quarantine,
                "share": self._share_token}  # fmt: skip

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["source"], state["cfg"], state["quarantine"])  # type: ignore[misc]
        self._share_token = str(state["share"])  # the maker's folder, not a new one

    # ---- where a step is ---------------------------------------------------------------
    def locate(self, step: int, origin: Origin = Origin()) -> tuple[int, int]:
        """``(epoch, first row)`` of global step ``step`` (``step >= origin.step``)."""
        if step < origin.step:
            raise ValueError(f"step {step} is before the origin step {origin.step}")
        g, spe = self.cfg.global_batch, self.steps_per_epoch
        first = (self.rows_per_epoch - origin.row) // g  # steps left in the origin's epoch
        k = step - origin.step
        if k < first:
            return origin.epoch, origin.row + k * g
        k -= first
        return origin.epoch + 1 + k // spe, (k % spe) * g

    def epoch_end_step(self, epoch: int, origin: Origin = Origin()) -> int:
        """The first step of epoch ``epoch + 1`` (``epoch >= origin.epoch``)."""
        first = (self.rows_per_epoch - origin.row) // self.cfg.global_batch
        return origin.step + first + (epoch - origin.epoch) * self.steps_per_epoch

    # ---- the epoch's token stream ------------------------------------------------------
    def plan(self, epoch: int) -> EpochPlan:
        with self._lock:
            plan = self._plans.get(epoch)
            if plan is not None:
                self._plans.move_to_end(epoch)
                return plan
        plan = EpochPlan(self.source, epoch, self.cfg.seed, self.cfg.shuffle, 1)
        with self._lock:
            self._plans[epoch] = plan
            while len(self._plans) > 2:
                self._plans.popitem(last=False)
        return plan

    def window(self, epoch: int, w: int) -> OrderWindow:
        """Window ``w`` of ``epoch``: its samples in emitted order and their token offsets
        (the last one asked for at hand, without the lock: a fill asks for it several times)."""
        key = (epoch, w)
        last = self._last_window
        if last is not None and last[0] == key:
            return last[1]
        with self._lock:
            hit = self._windows.get(key)
            if hit is not None:
                self._windows.move_to_end(key)
                self._last_window = (key, hit)
                return hit
        plan, cfg = self.plan(epoch), self.cfg
        positions, counts = [], []
        for p, q in self.geometry.spans(w):
            positions.append(np.arange(p, q, dtype=np.int64))
            counts += [self.source.token_counts(s, a, b) for s, a, b in plan.pieces(p, q)]
        pos = np.concatenate(positions) if positions else np.zeros(0, dtype=np.int64)
        cnt = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
        if cfg.shuffle:
            order = np.random.default_rng([cfg.seed, epoch, w]).permutation(len(pos))
        else:
            order = np.arange(len(pos))
        pos, cnt = pos[order], cnt[order]
        starts = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int64)
        begin = self.geometry.tokens_before_window(w, plan.tokens_before)
        win = OrderWindow(pos, starts, begin, order, starts.tolist())
        with self._lock:
            self._windows[key] = win
            while len(self._windows) > _WINDOW_CACHE:
                self._windows.popitem(last=False)
        self._last_window = (key, win)
        return win

    def _segments(self, epoch: int, t0: int, t1: int, tag: int = 0) -> list[Segment]:
        """``(window, emitted index, first token, tokens)`` of the samples covering
        tokens ``[t0, t1)`` of the epoch's stream, in stream order; each window named
        ``tag | w`` (``tag``: 0, or a multiple of ``WINDOW_TAG``, see :meth:`fill_segments`)."""
        w = self._window_of(epoch, t0)
        out: list[Segment] = []
        t = t0
        while t < t1:
            win = self.window(epoch, w)
            local = t - win.begin
            b = win.bounds
            i = bisect.bisect_right(b, local) - 1
            key = tag | w
            while t < t1 and i < len(win.positions):
                off = local - b[i]
                take = min(b[i + 1] - b[i] - off, t1 - t)
                if take > 0:
                    out.append((key, i, off, take))
                t += take
                local += take
                i += 1
            w += 1
        self._last = (epoch, w - 1)
        return out

    def _window_of(self, epoch: int, token: int) -> int:
        """The window holding ``token``: the last one used or its successor when it is there
        (reading in order), else a binary search over window offsets."""
        last = self._last
        if last is not None and last[0] == epoch:
            for w in (last[1], last[1] + 1):
                if w < self.n_windows:
                    win = self.window(epoch, w)
                    if win.begin <= token < win.end:
                        return w
        return self.geometry.window_at(token, self.plan(epoch).tokens_before)

    def fill_segments(self, epoch: int, row: int, n: int, tag: int) -> list[Segment]:
        """The segments of rows ``[row, row + n)`` of ``epoch`` (:func:`copy_rows`), each
        window named ``tag | w``: a mixture copies several sources' segments in one pass, a
        tag (a multiple of ``WINDOW_TAG``) per run of rows naming its source and epoch."""
        return self._segments(epoch, row * self.row_tokens, (row + n) * self.row_tokens, tag)

    def window_data(self, epoch: int, w: int, with_docs: bool) -> WindowData:
        """The sample views of window ``w``, read with one ranged read per lane and shard
        (a shard's adjacent lanes as one, :func:`joined`; concurrently from remote stores) and kept while rows are cut from it; the next
        windows this process needs are read ahead (:mod:`~wdstream.read.order.read_ahead`).

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
        (:func:`samples_alone`), by window (untagged); :meth:`fill` (a mixture's fill too)
        starts each window's whole read behind them before the rows are copied (start_reads);
        a local source only for an iteration's first rows (later read whole in line, as ever)."""
        # Segments run through windows in order; most fills touch only windows already
        # read or being read, and then no segment needs looking at.
        if not self._alone or not (self.source.remote or self._cache.empty()):
            return {}
        first, last = (segments[0][0], segments[-1][0]) if segments else (0, -1)
        hot = self._hot
        if first == last and hot is not None and hot[0] == (epoch, first & WINDOW_MASK, with_docs):
            return {}  # all in the window the last fill cut from: at hand
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
                out[w] = samples_alone(self.reads, plan, positions, emitted, with_docs)
        return out

    def start_reads(self, epoch: int, windows: Iterable[int], with_docs: bool) -> None:
        """Start reading windows ``windows`` of ``epoch`` (tagged or not) whole in the
        background, where they are neither read nor being read."""
        for w in windows:
            self._cache.start((epoch, w & WINDOW_MASK, with_docs))

    def release(self) -> None:
        """Drop the windows' sample views (they pin the mapped shards' file descriptors), any
        read-ahead and the threads reading: called when an iteration ends or is abandoned."""
        self._hot = None
        self._cache.release()
        self.source.end_fetches()

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
        self._sharing = WindowShares(share_folder(self._share_token), worker, needers)

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
            parts = self.reads.read(pieces, docs=True, checks=checks, shared=shared)
            toks = [t for part in parts for t in part.tokens.views()]
            docs = [d for part in parts for d in part.doc_lens]
            return WindowData(toks, order.tolist(), [0] * len(order), [docs[k] for k in order],
                              bad=emitted_bad(parts, order))  # fmt: skip
        parts = self.reads.read(pieces, checks=checks, shared=shared)
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
        and verifies each right after its first copy (:meth:`fill`), while the bytes are
        in the cache. Checked by a read-ahead thread instead, in runs of the samples it
        uses, the sums cost 2-3x more there: every run is a GIL hand-off between that
        thread and the filling one, on cores the other workers already keep busy."""
        reads = self.reads.read(pieces, verify=False, shared=shared)
        located = [part.tokens for part in reads]
        checks = [part.checks for part in reads]
        counts = [len(x) for x in located]
        base_of = np.repeat(np.arange(len(located)), counts)[order].tolist()
        first = np.concatenate([x.first for x in located] or [np.zeros(0, dtype=np.int64)])
        unverified = CopyTimeChecks.of(checks, counts, order)
        bases = [x.base for x in located]
        return WindowData(bases, base_of, first[order].tolist(), [], unverified,
                          emitted_bad(reads, order))  # fmt: skip

    def row_segments(self, epoch: int, row: int) -> list[tuple[int, int, int]]:
        """``(epoch position, first token in the sample, tokens)`` of the sample pieces that
        make row ``row`` of ``epoch``, in row order (map positions with ``plan(epoch).pieces``)."""
        t0 = row * self.row_tokens
        return [
            (int(self.window(epoch, w).positions[i]), off, take)
            for w, i, off, take in self._segments(epoch, t0, t0 + self.row_tokens)
        ]

    def row_ids(self, epoch: int, row: int, n: int) -> list[tuple[int, int, int, int]]:
        """``(shard, sample, first token, tokens)`` of the sample pieces that make rows
        ``[row, row + n)`` of ``epoch``: the rows' identity, from the plan alone (no data)."""
        plan, T1 = self.plan(epoch), self.row_tokens
        out = []
        for w, i, off, take in self._segments(epoch, row * T1, (row + n) * T1):
            position = int(self.window(epoch, w).positions[i])
            [(shard, sample, _)] = plan.pieces(position, position + 1)
            out.append((shard, sample, off, take))
        return out

    def fill(
        self,
        epoch: int,
        row: int,
        tokens: np.ndarray,
        doc_start: np.ndarray | None,
        into: np.ndarray | None = None,
    ) -> list[Hit]:
        """Write rows ``[row, row + n)`` of ``epoch`` into ``tokens`` ([n, T + 1]), or with
        ``into`` (``n`` increasing rows of ``tokens``) row ``row + j`` into ``tokens[into[j]]``:
        rows straight into their places in a block (a mixture fills all its sources' runs
        this way in one copy, :mod:`~wdstream.read.mixture.fill`).

        ``doc_start`` (bool, shaped as ``tokens``), when given, is True where a document
        piece begins: at every sample start (the next sample of a shuffled stream is
        unrelated) and at every document start inside a sample.

        Returns:
            With ``quarantine``, each row (of ``tokens``) masked whole with each stand-in
            sample it holds tokens of, in stream order; else empty.
        """
        T1 = self.row_tokens
        with_docs = doc_start is not None
        flat = tokens.reshape(-1)
        flat_ds = doc_start.reshape(-1) if doc_start is not None else None
        places = None if into is None else RowPlaces(into, T1)
        if doc_start is not None:
            doc_start[slice(None) if into is None else into] = False
        n = len(tokens) if into is None else len(into)
        segments = self._segments(epoch, row * T1, (row + n) * T1)
        windows = self.samples_alone(epoch, segments, with_docs)
        # Their whole reads start before the copy: started after it, the read-ahead the copy
        # starts came first and the cache's bound dropped these again (read alone again by
        # the next fill: 43 % more GETs an epoch from HTTP in one test).
        self.start_reads(epoch, windows, with_docs)
        hits = copy_rows(
            segments, windows, lambda w: self.window_data(epoch, w, with_docs),
            flat, flat_ds, T1, lambda _: self.source, self.quarantine, places,
        )  # fmt: skip
        hits = finish_copy(segments, windows, flat, into, T1, self.source, hits)
        if hits:
            mask_rows(tokens, doc_start, hits, self.neutral)
        return hits
