"""An iteration's end over GETs in flight (``read/sources/fetches.py``: a ``break`` drops the
fetch pool instead of waiting for its GETs).

Attacked: many short iterations (1-5 batches, up to 40) of one loader over the tests' HTTP
file server answering each GET after a delay drawn per iteration (0, 50, 200 or 500 ms), so
that GETs read ahead are in flight at the ``break`` and end, late, during the next iteration;
0 workers, 2 workers persistent or not, a node cache (``cache_dir``) on or off. And a break
over a *stalled* GET (every GET cut after 300 bytes, then silence; read timeout 10 s, one
retry), the run then read on by a new ``iter()`` once the server heals, 0 workers and 2
(persistent or not), node cache on or off; and at 2 workers the wait for a batch that does
not come (a worker blocked in its chunk's stalled read) interrupted by an exception a signal
handler raises, as ^C does: the training process leaves while a worker waits in the read.
Oracles outside the code under test: the uninterrupted run without workers over the local
folder (its batches); the wall time (a break over the stalled GET taking ``JOIN_S`` or
more waited for it, as does a next iteration's first batch, persistent workers still in
the stalled read: a hang; an iteration past ``BOUND_S`` too); the reader's
threads alive after the breaks (past the stated bound ``(1 + DROPPED_MAX) x REMOTE_READS +
AHEAD_MAX`` they grow: a crash); no ``.tmp`` file left in the node cache once the dropped
GETs are joined; no worker process alive 2 s after the loader is dropped.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

from faultlib.breaks import JOIN_S, KW, _dataset, _left, _outcome, short_iterations
from faultlib.common import Attempt, labelled, test_servers
from wdstream import Loader
from wdstream.errors import RemoteReadError
from wdstream.read.order.read_ahead import AHEAD_MAX
from wdstream.read.sources.fetches import DROPPED_MAX, REMOTE_READS, join_dropped
from wdstream.testing import write_synthetic_dataset

DELAYS = (0.0, 0.05, 0.2, 0.5)  # seconds before each GET is answered, drawn per iteration
STALL = {"cut_every": 1, "cut_at": 300, "stall": True, "methods": ("GET",)}
WAIT_S = 2.0  # a batch not come in this long: a worker is blocked in the stalled read
THREADS_MAX = (1 + DROPPED_MAX) * REMOTE_READS + AHEAD_MAX


def _reader_threads() -> int:
    return sum(t.name.startswith("wdstream-") for t in threading.enumerate())


def _after(got: list[np.ndarray], want: list[np.ndarray], slow: float, cache: Path | None,
           threads: int) -> str:  # fmt: skip
    """The attempt's outcome once its loader ran to the end (see the module's oracles)."""
    outcome = _outcome(got, want, slow)
    join_dropped()
    left = sorted(p.name for p in cache.rglob("*.tmp")) if cache is not None else []
    if outcome == "handled" and threads > THREADS_MAX:
        return f"crash: {threads} reader threads alive (bound {THREADS_MAX})"
    if outcome == "handled" and left:
        return f"crash: {len(left)} partial files left in the node cache ({left[0]})"
    return outcome


def _slow_breaks(root: Path, want: list[np.ndarray], workers: int, persistent: bool,
                 cache: Path | None, seed: int) -> str:  # fmt: skip
    file_server, _ = test_servers()
    rng = np.random.default_rng(seed)
    before = {p.pid for p in mp.active_children()}
    opts: dict[str, Any] = dict(num_workers=workers, persistent_workers=persistent, **KW)
    if cache is not None:
        opts["cache_dir"] = str(cache)
    with file_server(root) as server:
        loader = Loader(server.base_url, **opts)
        counts = [0]

        def slow() -> None:
            server.faults.reset(delay=float(rng.choice(DELAYS)), methods=("GET",))

        def count() -> None:
            counts.append(_reader_threads())

        got, slowest = short_iterations(loader, rng, len(want), 40, slow, count)
        threads = max(counts)
        server.faults.reset()
        t0 = time.monotonic()
        if len(got) < len(want):
            got += [b["input_ids"].numpy().copy() for b in loader]
        outcome = _after(got, want, max(slowest, time.monotonic() - t0), cache, threads)
        del loader
    return "hang" if _left(before) else outcome


def _get_within(server: Any, seconds: float) -> bool:
    """Whether a GET reached ``server`` (its faults' log) within ``seconds``."""
    end = time.monotonic() + seconds
    while not any(m == "GET" for m, _, _ in server.faults.requests):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


class _Waited(BaseException):
    """Raised by the alarm in the wait for a batch (as ^C's ``KeyboardInterrupt`` is)."""


def _interrupt_stalled(it: Iterator[Any], got: list[np.ndarray], n: int) -> tuple[float, bool]:
    """Batches until one does not come within ``WAIT_S`` (a worker is blocked in a stalled
    read), then that wait interrupted by an exception a signal handler raises, as ^C does:
    the seconds from the interrupt to the loader raising it, and whether the run's end came
    first. (A ``break`` is only possible between batches, when the workers may be idle with
    only a read ahead stalled: the interrupt meets a worker blocked in its chunk's read.)"""
    fired = [0.0]

    def alarm(signum: int, frame: Any) -> None:
        fired[0] = time.monotonic()
        raise _Waited

    old = signal.signal(signal.SIGALRM, alarm)
    try:
        for _ in range(n):
            signal.setitimer(signal.ITIMER_REAL, WAIT_S)
            try:
                batch = next(it)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except StopIteration:
                return 0.0, True
            except _Waited:
                return time.monotonic() - fired[0], False
            got.append(batch["input_ids"].numpy().copy())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return 0.0, True


def _stalled_break(root: Path, want: list[np.ndarray], cache: Path | None, at: int,
                   workers: int = 0, persistent: bool = False,
                   interrupt: bool = False) -> str:  # fmt: skip
    """``at`` batches, a break while a GET is stalled (read ahead, or with workers, any
    read a worker waits in; ``interrupt``: the wait for a batch a worker cannot make
    interrupted instead, :func:`_interrupt_stalled`), the run read on. Where a batch's own
    read meets the stall first it fails (``RemoteReadError``, a clear error) and the run is
    read on all the same; where no GET is made any more (the node cache holds every block),
    the run's end comes first."""
    file_server, _ = test_servers()
    before = {p.pid for p in mp.active_children()}
    opts: dict[str, Any] = dict(num_workers=workers, persistent_workers=persistent,
                                timeout=10.0, retries=1, backoff=0.001, **KW)  # fmt: skip
    if cache is not None:
        opts["cache_dir"] = str(cache)
    with file_server(root) as server:
        loader = Loader(server.base_url, **opts)
        it = iter(loader)
        # With workers, after they run (they start at the second batch): the stall then
        # meets reads they wait in, not the first batch of a worker's own start.
        got = [next(it)["input_ids"].numpy().copy() for _ in range(max(at, 4 if workers else 1))]
        server.faults.reset(**STALL)
        ended = False  # the run's end came first (every window read, or a node cache's)
        for _ in range(
            0 if interrupt else len(want)
        ):  # until a GET is in flight (and stalled) at the server
            if _get_within(server, 0.3):  # looked at up to the next batch's request: a
                break  # worker's GET stalled meanwhile would block that request
            try:
                got.append(next(it)["input_ids"].numpy().copy())
            except StopIteration:
                ended = True
                break
            except RemoteReadError:
                break  # the batch's own read stalled (a clear error); the run is read on
        time.sleep(0.2)
        t0 = time.monotonic()
        if interrupt:
            closing, ended = _interrupt_stalled(it, got, len(want))
        else:
            cast(Generator[Any, None, None], it).close()
            closing = time.monotonic() - t0
        server.faults.reset()
        t0 = time.monotonic()
        resumed = 0.0  # the next iteration's first batch (persistent workers: their reset)
        if not ended:
            it = iter(loader)
            for b in it:
                resumed = resumed or time.monotonic() - t0
                got.append(b["input_ids"].numpy().copy())
        outcome = _after(got, want, time.monotonic() - t0, cache, _reader_threads())
        del loader, it
    if closing >= JOIN_S:
        how = "interrupt" if interrupt else "break"
        return f"hang: the {how} waited {closing:.1f}s for a stalled GET"
    if resumed >= JOIN_S:
        return f"hang: the next iteration's first batch waited {resumed:.1f}s (a stalled read)"
    return "hang" if workers and _left(before) else outcome


def inflight_breaks(work: Path, scale: float) -> Iterator[Attempt]:
    """Breaks with GETs in flight (slow, or stalled), then the run read on."""
    root, want = _dataset(work)
    n = 0
    for cached in (False, True):
        for workers, persistent in ((0, False), (2, False), (2, True)):
            for seed in range(max(1, round(2 * scale))):
                n += 1
                cache = work / f"inflight-cache-{n}" if cached else None
                label = (f"{workers} workers{', persistent' if persistent else ''}, node cache "
                         f"{'on' if cached else 'off'}, slow GETs, seed {seed}")  # fmt: skip

                def slow(w: int = workers, p: bool = persistent, c: Path | None = cache,
                         s: int = seed, label: str = label) -> str:  # fmt: skip
                    return labelled(label, _slow_breaks(root, want, w, p, c, s))

                yield slow
        ways = ((0, False, False), (2, False, False), (2, True, False), (2, False, True),
                (2, True, True))  # fmt: skip
        for (workers, persistent, interrupt), at in itertools.product(
            ways, (1, 7, 40)[: max(1, round(3 * scale))]
        ):
            n += 1
            cache = work / f"inflight-cache-{n}" if cached else None
            label = (f"{workers} workers{', persistent' if persistent else ''}, node cache "
                     f"{'on' if cached else 'off'}, stalled GET after {at}"
                     f"{', the wait interrupted' if interrupt else ''}")  # fmt: skip

            def stalled(c: Path | None = cache, a: int = at, w: int = workers,
                        p: bool = persistent, i: bool = interrupt, label: str = label) -> str:  # fmt: skip
                return labelled(label, _stalled_break(root, want, c, a, w, p, i))

            yield stalled
    # A docs-mode pack (samples of varied length): a window's metadata needs its shards'
    # sidecars (token counts), fetched in line by the worker's own thread where it chooses
    # the windows to read ahead (WindowReads._needs), outside any ReadStop.
    docs_root, docs_want = _docs_dataset(work)
    for persistent in (False, True):
        label = f"2 workers{', persistent' if persistent else ''}, docs-mode pack, stalled GET"

        def stalled_docs(p: bool = persistent, label: str = label) -> str:
            return labelled(label, _stalled_break(docs_root, docs_want, None, 1, 2, p))

        yield stalled_docs


def _docs_dataset(work: Path) -> tuple[Path, list[np.ndarray]]:
    """A docs-mode pack (one document per sample, varied lengths: sidecars give the token
    counts) and its batches read whole, locally, without workers."""
    root = work / "breaks-docs-ds"
    if not root.exists():
        write_synthetic_dataset(str(root), n_docs=240, mode="docs", samples_per_shard=2)
    want = [b["input_ids"].numpy().copy() for b in Loader(str(root), num_workers=0, **KW)]
    return root, want
