"""One token stream: window-shuffled samples of one range, cut into rows and batches.

The stream's position is its cursor, five integers::

    {"epoch": e, "window": w, "emitted": k, "offset": o, "batches": d}

"the next token is token ``o`` of the ``k``-th sample of window ``w`` (in the window's
shuffled order) of epoch ``e``; ``d`` batches of this epoch are done". The tokens carried
over from a sample that straddles two rows are therefore *not* stored: they are re-read
(one window, a few ranged reads) on restore, so the state never holds data and restoring
never replays. At each epoch start the carry is empty; after ``nb`` batches (see
:meth:`ReaderContext.batches_per_stream`) the epoch ends and the rest of the range is left
out.

While window ``w`` is being cut into rows, window ``w + 1`` is read in one background
thread, so remote latency is hidden and at most two windows per stream are in memory.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdstream.read.order.plan import EpochPlan, WindowGeometry
from wdstream.read.order.state_fields import mismatch
from wdstream.read.order.streams_context import ReaderConfig, copy_window
from wdstream.read.sources.packed import ShardSource

__all__ = [
    "CURSOR_KEYS",
    "ReaderContext",
    "TokenStream",
    "start_cursor",
]

CURSOR_KEYS = ("epoch", "window", "emitted", "offset", "batches")


def start_cursor(epoch: int = 0) -> dict[str, int]:
    """Cursor at the start of ``epoch``."""
    return {"epoch": epoch, "window": 0, "emitted": 0, "offset": 0, "batches": 0}


@dataclass
class _StreamWindow:
    tokens: np.ndarray  # flat, disk dtype, samples in shuffled order
    starts: np.ndarray  # int64[n + 1], token offset of each sample in ``tokens``
    doc_start: np.ndarray | None  # bool, True where a document piece begins


class ReaderContext:
    """Per-process shared pieces: the source, epoch plans, batch counts, the read-ahead thread."""

    cursor_keys = CURSOR_KEYS
    # Every stream yields the same batches per epoch, so streams served in turn move in step
    # (what ``state.check_turns`` relies on).
    lockstep = True

    def __init__(self, source: ShardSource, cfg: ReaderConfig) -> None:
        self.source = source
        self.cfg = cfg
        self._plans: dict[int, EpochPlan] = {}
        self._nb: dict[int, int] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "cfg": self.cfg}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["source"], state["cfg"])  # type: ignore[misc]

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="wdstream-readahead")
        return self._pool

    @staticmethod
    def start_cursor(epoch: int = 0) -> dict[str, int]:
        return start_cursor(epoch)

    def stream(self, stream: int, cursor: dict[str, int]) -> TokenStream:
        return TokenStream(self, stream, cursor)

    def config(self) -> dict[str, Any]:
        """Config keys beyond the shared ones (none for indexed shards)."""
        return {}

    def chunk_size(self, cursor: dict[str, int]) -> int:
        """Batches in the next chunk of a stream at ``cursor`` (chunks aligned to K)."""
        nb = self.batches_per_stream(cursor["epoch"])
        k = self.cfg.chunk_batches
        return min(k - cursor["batches"] % k, nb - cursor["batches"])

    def plan(self, epoch: int) -> EpochPlan:
        with self._lock:
            plan = self._plans.get(epoch)
        if plan is None:
            cfg = self.cfg
            plan = EpochPlan(
                self.source, epoch, cfg.seed, cfg.shuffle, cfg.world_size * cfg.streams
            )
            with self._lock:
                self._plans[epoch] = plan
                # Keep the 4 plans made last (not the 4 highest epochs: a refused state's
                # epoch must not evict the ones in use).
                while len(self._plans) > 4:
                    del self._plans[next(iter(self._plans))]
        return plan

    def lead(self, workers: int) -> None:
        """Nothing to give a first chunk: packed streams' reads run no threads of their own."""

    def batches_per_stream(self, epoch: int) -> int:
        """Batches every stream of every rank yields in ``epoch``.

        Raises:
            ValueError: if the dataset is too small for one batch per stream.
        """
        nb = self._nb.get(epoch)
        if nb is None:
            cfg = self.cfg
            nb = self.plan(epoch).batches_per_stream(cfg.seq_len + 1, cfg.batch_size)
            if nb == 0:
                raise ValueError(
                    f"dataset too small: epoch {epoch} has less than one batch of "
                    f"{cfg.batch_size} x {cfg.seq_len + 1} tokens for each of "
                    f"{cfg.world_size} ranks x {cfg.streams} streams"
                )
            self._nb[epoch] = nb
        return nb

    def geometry(self, epoch: int, stream: int) -> WindowGeometry:
        cfg = self.cfg
        start, stop = self.plan(epoch).range(cfg.rank * cfg.streams + stream)
        lanes = cfg.shuffle_lanes if cfg.shuffle else 1
        return WindowGeometry(start, stop, cfg.shuffle_window, lanes)

    def _window_pieces(self, epoch: int, stream: int, w: int) -> list[tuple[int, int, int]]:
        """``(shard, a, b)`` sample spans of window ``w``, in reading order."""
        plan = self.plan(epoch)
        spans = self.geometry(epoch, stream).spans(w)
        return [pc for p, q in spans for pc in plan.pieces(p, q)]

    def window_order(self, epoch: int, stream: int, w: int, n: int) -> np.ndarray:
        """The order in which window ``w``'s ``n`` samples are emitted."""
        cfg = self.cfg
        if not cfg.shuffle:
            return np.arange(n)
        return np.random.default_rng([cfg.seed, epoch, cfg.rank, stream, w]).permutation(n)

    def cursor_at(self, stream: int, epoch: int, batches: int) -> dict[str, int]:
        """The cursor a stream reports after ``batches`` batches of ``epoch``.

        A stream reads its tokens contiguously, so after ``d`` batches it is at token
        ``d * B * (T + 1)`` of its window sequence; from the window token counts (index and
        sidecars, no sample data) follow the window, the sample in shuffled order and the
        offset, exactly as :meth:`TokenStream._after_batch` records them.
        """
        cfg = self.cfg
        token = batches * cfg.batch_size * (cfg.seq_len + 1)
        geometry, plan = self.geometry(epoch, stream), self.plan(epoch)
        w = geometry.window_at(token, plan.tokens_before)
        token -= geometry.tokens_before_window(w, plan.tokens_before)
        source = self.source
        sizes = [
            np.diff([source.tokens_before(shard, k) for k in range(a, b + 1)])
            for shard, a, b in self._window_pieces(epoch, stream, w)
        ]
        lens = np.concatenate(sizes) if sizes else np.zeros(0, dtype=np.int64)
        lens = lens[self.window_order(epoch, stream, w, len(lens))]
        starts = np.concatenate([[0], np.cumsum(lens)])
        k = int(np.searchsorted(starts, token, side="right")) - 1
        return {"epoch": epoch, "window": w, "emitted": k, "offset": token - int(starts[k]),
                "batches": batches}  # fmt: skip

    def check_cursor(self, stream: int, cursor: dict[str, int]) -> None:
        """Refuse a cursor that is not where ``stream`` stands after its ``batches``.

        Raises:
            StateMismatchError: naming the field (``streams[1].offset``) and its value.
        """
        e, d = cursor["epoch"], cursor["batches"]
        nb = self.batches_per_stream(e)
        if d >= nb:
            raise mismatch(f"streams[{stream}].batches", d, f"epoch {e} has {nb} per stream")
        want = self.cursor_at(stream, e, d)
        for k in ("window", "emitted", "offset"):
            if cursor[k] != want[k]:
                raise mismatch(
                    f"streams[{stream}].{k}", cursor[k],
                    f"batch {d} of epoch {e} ends at window {want['window']}, emitted "
                    f"{want['emitted']}, offset {want['offset']}",
                )  # fmt: skip

    def load_window(self, epoch: int, stream: int, w: int) -> _StreamWindow:
        """Read window ``w`` (one ranged read per lane and shard) and shuffle it."""
        cfg = self.cfg
        toks: list[np.ndarray] = []
        docs: list[tuple[int, ...]] = []
        for part in self.source.read(
            self._window_pieces(epoch, stream, w), docs=self.cfg.doc_boundaries
        ):
            toks += part.tokens.views()
            docs += part.doc_lens
        n = len(toks)
        order = self.window_order(epoch, stream, w, n)
        toks = [toks[i] for i in order]
        lens = np.fromiter((len(t) for t in toks), dtype=np.int64, count=n)
        starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        flat = np.concatenate(toks) if n else np.zeros(0, dtype=np.uint32)
        doc_start = None
        if cfg.doc_boundaries:
            # Every sample starts a new piece (a sample boundary in the shuffled stream is
            # never a continuation), and so does every piece inside a sample.
            pieces = np.fromiter(
                itertools.chain.from_iterable(docs[i] for i in order), dtype=np.int64
            )
            at = np.concatenate([[0], np.cumsum(pieces)[:-1]]) if len(pieces) else pieces
            doc_start = np.zeros(len(flat), dtype=bool)
            doc_start[at[at < len(flat)]] = True
            doc_start[starts[:-1][lens > 0]] = True
        return _StreamWindow(flat, starts, doc_start)


class TokenStream:
    """Rows of ``seq_len + 1`` tokens from one stream, resumable from a cursor."""

    def __init__(self, ctx: ReaderContext, stream: int, cursor: dict[str, int]) -> None:
        self.ctx = ctx
        self.stream = stream
        self._cursor = dict(cursor)
        self._win: _StreamWindow | None = None
        self._pos = 0
        self._next: tuple[int, int, Future[_StreamWindow]] | None = None

    def cursor(self) -> dict[str, int]:
        """The position after the last batch produced (JSON-serialisable)."""
        return dict(self._cursor)

    def close(self) -> None:
        """Drop the windows; a read-ahead still running is waited for, so nothing reads a
        shard after its store was closed."""
        if self._next is not None and not self._next[2].cancel():
            self._next[2].exception()  # wait; a failed read-ahead does not matter any more
        self._next = None
        self._win = None

    def _fetch(self, epoch: int, w: int) -> _StreamWindow:
        nxt = self._next
        if nxt is not None and nxt[0] == epoch and nxt[1] == w:
            win = nxt[2].result()
        else:
            win = self.ctx.load_window(epoch, self.stream, w)
        # Read ahead the following window while this one is cut into rows.
        nw = self.ctx.geometry(epoch, self.stream).n_windows
        ne, nwin = (epoch, w + 1) if w + 1 < nw else (epoch + 1, 0)
        self._next = (ne, nwin, self.ctx.pool.submit(self.ctx.load_window, ne, self.stream, nwin))
        return win

    def _ensure_window(self) -> _StreamWindow:
        if self._win is None:
            c = self._cursor
            self._win = self._fetch(c["epoch"], c["window"])
            self._pos = int(self._win.starts[c["emitted"]]) + c["offset"]
        return self._win

    def fill(
        self, tokens: np.ndarray, doc_start: np.ndarray | None, n: int
    ) -> list[dict[str, int]]:
        """Write the next ``n`` batches into ``tokens`` (``[n * B, seq_len + 1]``).

        Returns:
            The cursor after each of the ``n`` batches.
        """
        cfg = self.ctx.cfg
        per_batch = cfg.batch_size * (cfg.seq_len + 1)
        flat = tokens.reshape(-1)
        flat_ds = doc_start.reshape(-1) if doc_start is not None else None
        cursors = []
        for j in range(n):
            o, stop = j * per_batch, (j + 1) * per_batch
            while o < stop:
                win = self._ensure_window()
                take = copy_window(win.tokens, win.doc_start, self._pos, flat, flat_ds, o, stop)
                if take == 0:
                    self._advance()
                    continue
                o += take
                self._pos += take
            cursors.append(self._after_batch())
        return cursors

    def _advance(self) -> None:
        c = self._cursor
        nw = self.ctx.geometry(c["epoch"], self.stream).n_windows
        if c["window"] + 1 >= nw:
            raise AssertionError(f"stream {self.stream} ran out of tokens in epoch {c['epoch']}")
        self._cursor = {**c, "window": c["window"] + 1, "emitted": 0, "offset": 0}
        self._win = None

    def _after_batch(self) -> dict[str, int]:
        c = self._cursor
        d = c["batches"] + 1
        if d >= self.ctx.batches_per_stream(c["epoch"]):
            # Epoch over: the carry and the rest of the range are dropped.
            self._cursor = start_cursor(c["epoch"] + 1)
            self._win = None
            return self.cursor()
        win = self._win
        assert win is not None
        if self._pos >= len(win.tokens):
            self._cursor = {**c, "window": c["window"] + 1, "emitted": 0, "offset": 0, "batches": d}
            self._win = None
        else:
            k = int(np.searchsorted(win.starts, self._pos, side="right")) - 1
            self._cursor = {
                **c,
                "emitted": k,
                "offset": self._pos - int(win.starts[k]),
                "batches": d,
            }
        return self.cursor()
