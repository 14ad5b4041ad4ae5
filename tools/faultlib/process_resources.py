"""Process resources over long runs: Loaders made, read and dropped again and again.

Each attempt runs in its own forked child at the users' usual soft limit of 1024 open files
and counts, from outside the code, what the process holds before and after: its
descriptors (``/proc/self/fd``, by target), its threads (``/proc/self/task``). A Loader
dropped must give back what it held without the cyclic collector (attempts run with the
collector on, as a user has it, and off: the worst case of a collector that runs late).
"""

from __future__ import annotations

import gc
import itertools
import os
import resource
import shutil
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from faultlib.common import READ, Attempt, clean_dataset
from wdstream import Loader

# Descriptors and threads a process may hold past its start after the drops: the shard
# maps of the process-wide LRU that outlive their dropped store until evicted are closed
# with the store; a few stay for imports (the torch and requests modules' own).
SLACK_FDS = 16
SLACK_THREADS = 2


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _settled(before: tuple[int, int]) -> tuple[int, int]:
    """The descriptors and threads once the last Loader's read-ahead ended (3 s at most)."""
    stop = time.monotonic() + 3
    while True:
        now = _fds(), _threads()
        if (now[0] <= before[0] + SLACK_FDS and now[1] <= before[1] + SLACK_THREADS) or (
            time.monotonic() > stop
        ):
            return now
        time.sleep(0.02)


def _repeat(make: Callable[[], Loader], n: int, use: str, collector: bool) -> str:
    """Make, use and drop ``n`` Loaders; the outcome by the process's counts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    first = make()  # imports and module state first, then the baseline
    next(iter(first))
    del first
    gc.collect()
    before = _fds(), _threads()
    peak = 0
    if not collector:
        gc.disable()
    for i in range(n):
        loader = make()
        if use == "batch_at":
            loader.batch_at(i % 7)
        elif use == "raise":
            try:
                for k, _ in enumerate(loader):
                    if k == 2:
                        raise KeyError("the training step failed")
            except KeyError:
                pass
        else:
            for _ in itertools.islice(loader, 3):
                pass
        del loader
        peak = max(peak, _fds())
    after = _settled(before)
    gc.enable()
    said = f"{n} loaders ({use}, collector {'on' if collector else 'off'}): descriptors {before[0]} -> peak {peak} -> {after[0]}, threads {before[1]} -> {after[1]}"
    if after[0] > before[0] + SLACK_FDS or after[1] > before[1] + SLACK_THREADS:
        return f"crash: resources grow with dropped Loaders: {said}"
    return f"handled: {said}"


def process_resources(work: Path, scale: float) -> Iterator[Attempt]:
    """Local, mixture (20 sources), HTTP (the tests' file server) and 2-worker Loaders made
    and dropped 25-300 times, iterated, ``batch_at``, broken off by an exception; collector
    on and off; at a soft limit of 1024 open files."""
    root, _ = clean_dataset(work)
    mixture = {}
    for k in range(20):
        dst = work / f"resources-mix-{k}"
        if not dst.exists():
            shutil.copytree(root, dst)
        mixture[f"m{k}"] = str(dst)
    n = max(25, int(300 * scale))
    opts: dict[str, Any] = {**READ, "epochs": None}

    def local() -> Loader:
        return Loader(root, **opts)

    def mixed() -> Loader:
        return Loader(mixture, weights=dict.fromkeys(mixture, 1), **opts)

    def workers() -> Loader:
        return Loader(root, **{**opts, "num_workers": 2})

    cases: list[tuple[Callable[[], Loader], int, str]] = [
        (local, n, "iterated"), (local, n, "batch_at"), (local, n, "raise"),
        (mixed, max(10, n // 5), "iterated"), (workers, max(5, n // 25), "iterated"),
    ]  # fmt: skip
    for (make, count, use), collector in itertools.product(cases, (True, False)):
        yield partial(_repeat, make, count, use, collector)
    for collector in (True, False):
        yield partial(_remote, root, work, max(10, n // 10), collector)


def _remote(root: str, work: Path, n: int, collector: bool) -> str:
    """HTTP Loaders over the tests' file server, in this process (its sockets count too:
    one a connection the client keeps open)."""
    from tests.servers import FileServer

    served = work / "resources-http"
    if not served.exists():
        shutil.copytree(root, served / "ds")
    with FileServer(served) as server:
        url = f"{server.base_url}/ds"
        opts: dict[str, Any] = {**READ, "epochs": None}
        return _repeat(lambda: Loader(url, **opts), n, "iterated", collector)
