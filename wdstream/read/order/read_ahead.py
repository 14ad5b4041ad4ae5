"""Windows' sample data kept while rows are cut from them, and read ahead of the rows.

The global order (:mod:`~wdstream.read.order.global_order`) cuts rows from one window after
another. :class:`WindowCache` keeps the windows being cut and reads the next ones in
background threads. From a remote store one window ahead may not hide a GET's latency (the
rows then wait for it): each wait longer than ``DEEPEN_WAIT_S`` reads one more window ahead,
up to ``AHEAD_MAX``, so the reads in flight grow with the latency, while the bytes held stay
bounded (``AHEAD_MAX + KEEP`` windows: 48 MB for windows of 1,024 samples of 8 KB)::

    rows at window   5                      ahead = 1: 6 read ahead
    waited 20 ms for 6                      ahead = 2: 7, 8 read ahead
    windows behind the rows go first        kept: 5, 6 (the rows), 7, 8 (ahead)

A local window is read where its rows need it, not ahead (``read_ahead=False``): its read is
bound by the CPU and memory (checksums, the ids check, mapping the pages), and a read-ahead
thread beside the copying one cost more than it hid: a 0-worker steady read's process CPU was
95-100 us a batch with it, 64-72 us reading in line, on a 2-core host (issue 35,
``docs/READER.md``). The window of an iteration's first rows, read alone, is
read whole where the next rows need it too: :meth:`WindowCache.start` only names it (so the
next fill does not read its samples alone again). Read in a thread started behind the first
batch, it cost that batch ~1 ms (the thread's start and its GIL share while the batch was
cut) and saved the second nothing where the caller asked for it at once.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from wdstream.read.order.window_data import WindowData

__all__ = ["AHEAD_MAX", "DEEPEN_WAIT_S", "KEEP", "WindowCache", "WindowKey"]

WindowKey = tuple[int, int, bool]  # (epoch, window, with document boundaries)

KEEP = 2  # windows kept besides those read ahead: the one before the rows', and theirs
AHEAD_MAX = 4  # the most windows read ahead (and threads reading them)
DEEPEN_WAIT_S = 0.002  # a wait for a read-ahead longer than this reads one more ahead


class WindowCache:
    """Windows' data by key, loaded with ``load`` here or ahead in background threads.

    Args:
        load: reads one window's data.
        deepen: whether waits for a read-ahead deepen it (a remote source: latency to
            hide; locally a wait means the reads are bound by the CPU, which more
            windows in flight would not help).
        read_ahead: read the next windows, and those :meth:`start` names, in background
            threads (a remote source); else every window where a :meth:`get` needs it.
    """

    def __init__(
        self, load: Callable[[int, int, bool], WindowData], deepen: bool, read_ahead: bool = True
    ) -> None:
        self._load = load
        self._deepen = deepen
        self._read_ahead = read_ahead
        # None: named by start() without read-ahead, read by the first get() (in line).
        self._data: OrderedDict[WindowKey, Future[WindowData] | None] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.ahead = 1  # windows read ahead of the rows (see AHEAD_MAX)
        # False: no read starts in the background (no thread is made): a training process
        # making its first step itself before it forks its workers (``first_chunk``).
        self.background = True

    def get(
        self, key: WindowKey, following: Callable[[WindowKey, int], Iterable[WindowKey]]
    ) -> WindowData:
        """Window ``key``'s data, and the read-ahead of ``following(key, ahead)`` started.
        A window not read ahead (the first of an iteration) is read here: waiting for a
        thread to start and read it would only add the hand-off.

        Raises:
            Whatever its read raised (kept: asked again, it raises again).
        """
        with self._lock:
            fut = self._data.get(key)
            if fut is not None:
                self._data.move_to_end(key)
        if fut is None:  # not read, or named by start() to be read here
            fut = self._read_here(key)
        elif not fut.done():
            # The next windows' reads go out before this wait, not after it: from a remote
            # store, waiting first left the next window's round trips unstarted until this
            # one had arrived (a fresh loader's second window started only then). Locally
            # (the wait is for the first window of an iteration, started behind the rows
            # read alone) the next is not read here meanwhile: two windows read at once
            # took 10 ms of CPU each, against 6.6 and 2.7 ms one after the other.
            for nxt in following(key, self.ahead) if self._read_ahead else ():
                self.start(nxt)
            t0 = time.perf_counter()
            fut.exception()  # waits; a failed read raises below
            if self._deepen and time.perf_counter() - t0 > DEEPEN_WAIT_S:
                self.ahead = min(self.ahead + 1, AHEAD_MAX)  # the latency was not hidden
        for nxt in following(key, self.ahead) if self._read_ahead and self.background else ():
            self.start(nxt)
        return fut.result()

    def _read_here(self, key: WindowKey) -> Future[WindowData]:
        """Read window ``key`` in this thread and keep it (a failed read too: asked again,
        it raises again)."""
        fut: Future[WindowData] = Future()
        try:
            fut.set_result(self._load(*key))
        except Exception as exc:  # kept, as the read-ahead keeps a failed read
            fut.set_exception(exc)
        with self._lock:
            self._data[key] = fut
            self._bound()
        return fut

    def cold(self, key: WindowKey) -> bool:
        """Whether window ``key`` is neither read nor being read."""
        with self._lock:
            return key not in self._data

    def empty(self) -> bool:
        """Whether no window is read or being read (none since :meth:`release`)."""
        with self._lock:
            return not self._data

    def start(self, key: WindowKey) -> None:
        """Start reading window ``key`` in the background unless it is read or being read
        (or nothing is read in the background: :attr:`background`). Without read-ahead (a
        local source) the window is only named: it is no longer :meth:`cold`, and the first
        :meth:`get` of it reads it in that thread."""
        if not self.background:
            return
        with self._lock:
            if key not in self._data:
                if self._read_ahead:
                    self._submit(key)
                else:
                    self._data[key] = None
            self._bound()

    def _bound(self) -> None:
        """Keep at most ``KEEP + ahead`` windows (under the lock)."""
        while len(self._data) > KEEP + self.ahead:
            # The earliest window goes, not the least recently used: rows move forward,
            # and a window read ahead is used after the ones they are in.
            del self._data[min(self._data, key=lambda k: k[:2])]

    def _submit(self, key: WindowKey) -> None:
        """Read window ``key`` in a background thread (under the lock)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(AHEAD_MAX, thread_name_prefix="wdstream-readahead")
        self._data[key] = self._pool.submit(self._load, *key)

    def release(self) -> None:
        """Drop the windows' data (it pins the mapped shards' file descriptors), any
        read-ahead and its threads: called when an iteration ends or is abandoned."""
        with self._lock:
            futures = [f for f in self._data.values() if f is not None]
            self._data.clear()
            pool, self._pool = self._pool, None
        for fut in futures:
            if not fut.cancel():
                fut.exception()  # a read still running: wait, so no view outlives this call
        if pool is not None:  # an iteration leaves no thread behind (a process may fork next)
            pool.shutdown(wait=True)
