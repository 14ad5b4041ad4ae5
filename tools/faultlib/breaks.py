"""An iteration's end over remote reads shared by torch workers (``read/sources/exchange.py``).

Attacked: a ``break`` at the first batch, mid-window, at an epoch's last batch or the next
epoch's first, then the epoch read on by a new ``iter()`` (the old iterator closed, or
still held), or by a new loader resumed from ``state_dict()``; many short iterations (1-5
batches each, up to 50) in one loader; 2 and 3 workers, persistent or not, over the tests'
HTTP file server with +20 ms a request. Oracles outside the code under test: the
uninterrupted run without workers over the local folder (its batches), the wall time (an
iteration's remainder past ``BOUND_S`` is a ``hang``: a worker waiting ``SHARE_WAIT_S`` for
a piece that never comes; a close taking torch's 5 s join is one too) and
``multiprocessing.active_children`` (a worker alive 2 s after the loader is dropped).
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from faultlib.common import Attempt, labelled, test_servers
from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

KW: dict[str, Any] = dict(seq_len=64, batch_size=4, epochs=2, shuffle_window=256,
                          shuffle_lanes=4, chunk_batches=8)  # fmt: skip
BOUND_S = 20.0  # an iteration's remainder (~0.5 s here) or a break past this is a hang
JOIN_S = 4.5  # a close this long waited out torch's 5 s join of a worker


def _dataset(work: Path) -> tuple[Path, list[np.ndarray]]:
    root = work / "breaks-ds"
    if not root.exists():
        write_synthetic_dataset(str(root), n_docs=120, sample_tokens=65, samples_per_shard=20)
    want = [b["input_ids"].numpy().copy() for b in Loader(str(root), num_workers=0, **KW)]
    return root, want


def _outcome(got: list[np.ndarray], want: list[np.ndarray], slow: float) -> str:
    if slow > BOUND_S:
        return "hang"
    same = len(got) == len(want) and all(
        np.array_equal(a, b) for a, b in zip(got, want, strict=True)
    )
    return "handled" if same else "silent wrong"


def _left(before: set[int | None]) -> bool:
    """Whether a worker of this attempt is still alive 2 s after its loaders were dropped."""
    gc.collect()
    deadline = time.monotonic() + 2.0
    while [p for p in mp.active_children() if p.pid not in before]:
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def _one_break(root: Path, want: list[np.ndarray], workers: int, persistent: bool,
               at: int, then: str) -> str:  # fmt: skip
    file_server, _ = test_servers()
    before = {p.pid for p in mp.active_children()}
    with file_server(root) as server:
        server.faults.reset(delay=0.02)
        opts = dict(num_workers=workers, persistent_workers=persistent, **KW)
        loader = Loader(server.base_url, **opts)
        it = iter(loader)
        got = [next(it)["input_ids"].numpy().copy() for _ in range(at)]
        t0 = time.monotonic()
        if then == "closed":
            it.close()
        elif then == "state":
            state = loader.state_dict()
            it.close()
            del it, loader
            loader = Loader(server.base_url, **opts)
            loader.load_state_dict(state)
        closing = time.monotonic() - t0
        t0 = time.monotonic()
        got += [b["input_ids"].numpy().copy() for b in loader]
        outcome = _outcome(got, want, time.monotonic() - t0)
        del loader
        it = None
    if closing > JOIN_S or _left(before):
        return "hang"
    return outcome


def short_iterations(loader: Loader, rng: np.random.Generator, rows: int, cycles: int,
                     before: Callable[[], object] = lambda: None,
                     after: Callable[[], object] = lambda: None) -> tuple[list[np.ndarray], float]:  # fmt: skip
    """Up to ``cycles`` iterations of 1-5 batches, each left by a ``break``, until ``rows``
    batches are read or one iteration took longer than ``BOUND_S``: the batches read and the
    slowest iteration's seconds. ``before``/``after`` run around each iteration (a fault
    set, a count taken)."""
    got: list[np.ndarray] = []
    slowest = 0.0
    for _ in range(cycles):
        before()
        k, t0 = int(rng.integers(1, 6)), time.monotonic()
        for batch in loader:
            got.append(batch["input_ids"].numpy().copy())
            k -= 1
            if k == 0:
                break
        slowest = max(slowest, time.monotonic() - t0)
        after()
        if len(got) >= rows or slowest > BOUND_S:
            break
    return got, slowest


def _many_breaks(root: Path, want: list[np.ndarray], workers: int, persistent: bool,
                 seed: int) -> str:  # fmt: skip
    file_server, _ = test_servers()
    rng = np.random.default_rng(seed)
    before = {p.pid for p in mp.active_children()}
    with file_server(root) as server:
        server.faults.reset(delay=0.02)
        loader = Loader(server.base_url, num_workers=workers, persistent_workers=persistent,
                        **KW)  # fmt: skip
        got, slowest = short_iterations(loader, rng, len(want), 50)
        t0 = time.monotonic()
        if len(got) < len(want):  # an iteration that ran to the end finished the run
            got += [b["input_ids"].numpy().copy() for b in loader]
        outcome = _outcome(got, want, max(slowest, time.monotonic() - t0))
        del loader
    return "hang" if _left(before) else outcome


def iteration_breaks(work: Path, scale: float) -> Iterator[Attempt]:
    """Breaks at chosen steps, then the run read on; many short iterations."""
    root, want = _dataset(work)
    n, per_epoch = len(want), len(want) // 2
    points = [1, 5, per_epoch // 2, per_epoch - 1, per_epoch, n - 1]
    points = points[: max(2, round(len(points) * scale))]
    for workers in (2, 3):
        for persistent in (False, True):
            for then in ("closed", "held", "state"):
                for at in points:
                    label = f"{workers} workers{', persistent' if persistent else ''}, break at {at}, {then}"

                    def attempt(w: int = workers, p: bool = persistent, a: int = at,
                                t: str = then, label: str = label) -> str:  # fmt: skip
                        return labelled(label, _one_break(root, want, w, p, a, t))

                    yield attempt
            for seed in range(max(1, round(3 * scale))):
                label = f"{workers} workers{', persistent' if persistent else ''}, 1-5 batches an iteration, seed {seed}"

                def many(w: int = workers, p: bool = persistent, s: int = seed,
                         label: str = label) -> str:  # fmt: skip
                    return labelled(label, _many_breaks(root, want, w, p, s))

                yield many
