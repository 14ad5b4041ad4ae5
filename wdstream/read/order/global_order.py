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
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from wdstream.read.order.plan import EpochPlan, OrderWindow, WindowGeometry
from wdstream.read.order.row_places import RowPlaces
from wdstream.read.order.window_data import Hit, Segment, copy_rows, finish_copy, mask_rows
from wdstream.read.order.window_reads import WindowReads
from wdstream.read.sources.packed import ShardSource
from wdstream.read.sources.reads import neutral_id
from wdstream.read.weak_calls import weak_method

__all__ = ["ORDER_VERSION", "GlobalOrder", "OrderConfig", "Origin"]

# The version of the algorithm above. Bump it with any change to which samples a step's rows
# are cut from: a state saved under another version is refused, not read in another order.
ORDER_VERSION = 1

_WINDOW_CACHE = 8  # windows' metadata kept per process (a few KB each)


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
        # The windows' sample data: read, kept, read ahead, verified, shared with workers.
        self.data = WindowReads(
            source, quarantine, self.geometry, weak_method(self.plan), weak_method(self.window)
        )

    def __getstate__(self) -> dict[str, object]:
        return {"source": self.source, "cfg": self.cfg, "quarantine": self.quarantine,
                "share": self.data.share_token}  # fmt: skip

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["source"], state["cfg"], state["quarantine"])  # type: ignore[misc]
        self.data.share_token = str(state["share"])  # the maker's folder, not a new one

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
        windows = self.data.samples_alone(epoch, segments, with_docs)
        # Their whole reads start before the copy: started after it, the read-ahead the copy
        # starts came first and the cache's bound dropped these again (read alone again by
        # the next fill: 43 % more GETs an epoch from HTTP in one test).
        self.data.start_reads(epoch, windows, with_docs)
        hits = copy_rows(
            segments, windows, lambda w: self.data.window_data(epoch, w, with_docs),
            flat, flat_ds, T1, lambda _: self.source, self.quarantine, places,
        )  # fmt: skip
        hits = finish_copy(segments, windows, flat, into, T1, self.source, hits)
        if hits:
            mask_rows(tokens, doc_start, hits, self.neutral)
        return hits
