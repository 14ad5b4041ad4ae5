"""The threads a packed source's remote ranged reads run on, and how an ending iteration
leaves the GETs it no longer needs without waiting for them.

A remote window's pieces are fetched concurrently (:meth:`ShardSource.read
<wdstream.read.sources.packed.ShardSource.read>`) on a :class:`FetchPool`. When an
iteration ends early (a ``break``, an iterator closed or collected) its reads are told to
stop: the pieces not started are not fetched, and the reads waiting for pieces in flight
stop waiting (:func:`results`). The GETs in flight are *dropped*, not waited for: before,
a worker's end waited for them (80-160 ms from loopback S3), and for a stalled one up to
the store's read timeout, past torch's 5 s worker join, which then killed the worker.

What a dropped GET may still do when it ends: its bytes land in its own buffer, returned
to a future nobody reads; where the torch workers share a window's fetches it hands the
piece to its peers under the piece's own name (epoch, window, piece: the same bytes in
any iteration, :mod:`~wdstream.read.sources.exchange`), and a node cache keeps the range
under its own name. Nothing of it reaches a later iteration's windows.

Bounded: a pool dropped keeps its threads only until their GETs end (by the store's
timeouts and retries at worst: a dropped GET is not cut short, and may retry); at most
``DROPPED_MAX`` pools are dropped and not yet joined per process, so past that a drop first
waits for the oldest. The fetch threads alive are at most ``DROPPED_MAX x REMOTE_READS``
dropped ones per process (32) besides each source's live pool (16): 48 for one source. They
are daemon threads (:class:`Threads`), not waited for at a process's exit; a process about
to fork joins them first (:func:`join_dropped`): a forked child must not inherit a lock a
thread it does not have was holding.

A torch worker's reads stop too when the *training process* leaves the iteration (a
``break``, its iterator closed or collected, a new ``iter()``): their :class:`ReadStop` also
asks the loader's hand-off whether the iteration the worker serves was left
(:meth:`~wdstream.read.torch.handoff.WorkerHandoff.left`), so a worker blocked in a chunk's
stalled read ends that chunk within ``_STOP_POLL_S`` instead of after the read's timeout
(torch's 5 s join killed it before).
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, wait
from typing import Any, Protocol, TypeVar

__all__ = [
    "DROPPED_MAX",
    "REMOTE_READS",
    "FetchPool",
    "ReadStop",
    "Stop",
    "Threads",
    "join_dropped",
    "results",
    "stoppable",
]

T = TypeVar("T")

REMOTE_READS = 16  # concurrent ranged reads from a remote store (windows read ahead share them)
DROPPED_MAX = 2  # pools dropped with GETs in flight, per process, before a drop waits
_STOP_POLL_S = 0.05  # how often a read waiting for its pieces looks at its stop


class Stop(Protocol):
    """What a read looks at to stop (a ``threading.Event``, a :class:`ReadStop`)."""

    def is_set(self) -> bool: ...


class ReadStop:
    """One iteration's stop for its reads: set by this process (:meth:`set`, as the reader
    drops the iteration's windows), or, in a torch worker, once ``outside()`` says the
    training process left the iteration (looked at only by :meth:`is_set`, which a read
    waiting for its pieces calls every ``_STOP_POLL_S``; once seen, it stays set)."""

    def __init__(self, outside: Callable[[], bool] | None = None) -> None:
        self._own = threading.Event()
        self._outside = outside

    def set(self) -> None:
        """Stop the reads (this process drops them)."""
        self._own.set()

    def is_set(self) -> bool:
        """Whether the reads stop: set here, or left by the training process."""
        if self._own.is_set():
            return True
        if self._outside is not None and self._outside():
            self._own.set()
            return True
        return False


class Threads:
    """Up to ``n`` daemon threads running submitted calls (as a ``ThreadPoolExecutor``, whose
    threads every process joins at its exit: a torch worker ending with a GET left in
    flight then waited for it, past torch's 5 s join, and was killed). A daemon thread is
    not waited for at exit; :func:`join_dropped` waits for them before a fork."""

    def __init__(self, n: int, name: str) -> None:
        self._n, self._name = n, name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]
        self._queue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on a thread; its future."""
        fut: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((fut, lambda: fn(*args)))
            if not self._idle.acquire(timeout=0) and len(self._threads) < self._n:
                name = f"{self._name}_{len(self._threads)}"
                thread = threading.Thread(target=self._work, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)
        return fut

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            fut, call = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(call())
                except BaseException as exc:  # the caller's to see, as in an executor
                    fut.set_exception(exc)
            del item, fut, call
            self._idle.release()

    def shutdown(self, wait: bool) -> None:
        """No more calls; those not started are cancelled; with ``wait``, the threads are
        joined (else they end after their call in flight)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for thread in threads:
                thread.join()


_dropped: deque[Threads] = deque()
_dropped_lock = threading.Lock()


def _none_in_child() -> None:
    """A forked child has none of its parent's threads (nor a lock one of them held)."""
    global _dropped_lock
    _dropped.clear()
    _dropped_lock = threading.Lock()


os.register_at_fork(after_in_child=_none_in_child)


class FetchPool:
    """A source's fetch threads, made when first needed (none in a process that reads
    nothing remote, or before it forks)."""

    def __init__(self) -> None:
        self._pool: Threads | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        return {}  # threads are per process

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__()  # type: ignore[misc]

    def get(self) -> Threads:
        """The threads, made at the first call after :meth:`drop`."""
        with self._lock:
            if self._pool is None:
                self._pool = Threads(REMOTE_READS, "wdstream-fetch")
            return self._pool

    def drop(self) -> None:
        """Leave the threads (made again when next needed): fetches not started are
        cancelled, those in flight end on their own and their results are dropped (see the
        module's text). Past ``DROPPED_MAX`` pools dropped, the oldest is waited for."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        pool.shutdown(wait=False)
        with _dropped_lock:
            _dropped.append(pool)
            older = [_dropped.popleft() for _ in range(len(_dropped) - DROPPED_MAX)]
        for old in older:
            old.shutdown(wait=True)


def join_dropped() -> None:
    """Wait for every pool dropped in this process (their GETs in flight to end): a process
    about to fork leaves no fetch thread behind, which its children would wait on."""
    with _dropped_lock:
        pools = list(_dropped)
        _dropped.clear()
    for pool in pools:
        pool.shutdown(wait=True)


def results(jobs: list[Future[T]], stop: Stop | None) -> list[T]:
    """The jobs' results in order (the first failure in order raised), or
    ``CancelledError`` as soon as ``stop`` is set: the reader dropping the window does not
    wait for the GETs in flight (:meth:`FetchPool.drop` leaves them)."""
    try:
        if stop is None:
            return [job.result() for job in jobs]
        out = []
        for job in jobs:
            while not wait([job], timeout=_STOP_POLL_S).done:
                if stop.is_set():
                    raise CancelledError
            out.append(job.result())
        return out
    finally:
        # An exception raised here holds this frame: without the jobs, not their futures,
        # which hold a failure's exception (a cycle, freed only by the collector, that kept
        # the reader's source, sockets and bytes).
        jobs = job = None  # type: ignore[assignment]


def stoppable(call: Callable[[], T], outside: Callable[[], bool]) -> T:
    """``call()``, made on a daemon thread of its own and waited for here, or
    ``CancelledError`` once ``outside()`` is true (looked at first, then every
    ``_STOP_POLL_S`` while it waits): a read in a torch worker's own thread that a stalled
    GET would hold past the training process's leaving (a sidecar's). The call left behind
    ends on its own (its read timeout); only a torch worker uses this, which never forks."""
    if outside():
        raise CancelledError
    fut: Future[T] = Future()

    def run() -> None:
        try:
            fut.set_result(call())
        except BaseException as exc:
            fut.set_exception(exc)

    threading.Thread(target=run, name="wdstream-sidecar", daemon=True).start()
    return results([fut], ReadStop(outside))[0]
