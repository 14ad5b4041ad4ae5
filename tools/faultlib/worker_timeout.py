"""A Loader's ``worker_timeout`` against torch workers that stop, hang or come back.

Attacked: one worker or all of them stopped (SIGSTOP) mid-epoch; one stopped and continued
(SIGCONT) well before the timeout or just after it fired; one hung in a sleep inside its
chunk (the read patched in the workers only); persistent workers of which one is stopped
after a ``break``, between iterations; a training step sleeping longer than the timeout
(must not trigger it); a worker's own RuntimeError that says "timed out" (must come back
as itself). Over 1, 2 and 4 workers, persistent or not, forked or spawned, one dataset, a
mixture or an HTTP store; then the caller, still holding the error and its traceback, calls
``iter()`` again or resumes a new loader from ``state_dict()``. Oracles outside the code
under test: the uninterrupted run without workers (its batches), ``/proc`` through
``multiprocessing.active_children`` (a worker alive 2 s after the error is a ``hang``), and
the wall time from the fault to the error (past the timeout plus 5 s is a ``hang``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from faultlib.common import Attempt, labelled, test_servers
from wdstream import Loader, WorkerTimeoutError
from wdstream.read.torch import handoff
from wdstream.testing import write_synthetic_dataset

OPTS: dict[str, Any] = dict(seq_len=16, batch_size=4, seed=5, chunk_batches=2,
                            shuffle_window=40, shuffle_lanes=3, prefetch_factor=1)  # fmt: skip
FAULTS = ("stop one", "stop all", "continued before", "continued after", "hang",
          "stopped between iterations", "slow consumer", "worker's own 'timed out'")  # fmt: skip
TIMED_OUT = ("stop one", "stop all", "continued after", "hang", "stopped between iterations")
PATCHED = ("hang", "worker's own 'timed out'")  # a patch forked workers inherit, spawned do not
AT = 3  # the batch after which the fault is made
LIMIT = 5.0  # seconds past the timeout the error may take (one join)


def _live(before: set[int], within: float = 2.0) -> list[int]:
    """This process's workers (not ``before``) still alive after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        live = [p.pid for p in mp.active_children() if p.pid not in before]
        if not live or time.monotonic() > deadline:
            return [p for p in live if p is not None]
        time.sleep(0.05)


def _patch(fault: str, workers: int) -> Any:
    """Patch the workers' chunk fill for ``fault``; returns the undo (or None)."""
    if fault not in PATCHED:
        return None
    take = handoff.RingBuffers.take

    def patched(self: handoff.RingBuffers, i: int, rows: int) -> Any:
        if self.worker == workers - 1 and i == AT:
            if fault == "hang":
                time.sleep(600)
            raise RuntimeError("read of shard 3 timed out")
        return take(self, i, rows)

    handoff.RingBuffers.take = patched  # type: ignore[method-assign]
    return lambda: setattr(handoff.RingBuffers, "take", take)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _read(loader: Loader, fault: str, timeout: float, before: set[int]) -> tuple[Any, ...]:
    """Read ``loader`` making ``fault``: (batches, the error or None, seconds from the
    fault to the error)."""
    got: list[torch.Tensor] = []
    held: BaseException | None = None
    made = time.monotonic()
    try:
        for k, b in enumerate(loader):
            got.append(b["input_ids"].clone())
            if fault == "slow consumer" and k < AT:
                time.sleep(timeout * 1.3)
            if k != AT or fault in ("slow consumer", *PATCHED):
                continue
            made = time.monotonic()
            pids = sorted(p.pid for p in mp.active_children() if p.pid and p.pid not in before)
            if fault == "stopped between iterations":
                break
            _signal(pids if fault == "stop all" else pids[:1], signal.SIGSTOP)
            if fault.startswith("continued"):
                when = timeout * 0.4 if fault == "continued before" else timeout + 0.3
                threading.Timer(when, _signal, (pids[:1], signal.SIGCONT)).start()
        if fault == "stopped between iterations":
            _signal(pids[:1], signal.SIGSTOP)
            made = time.monotonic()
            got.extend(b["input_ids"].clone() for b in loader)
    except BaseException as exc:  # noqa: BLE001 - the caller keeps it, traceback too
        held = exc
    return got, held, time.monotonic() - made


def _judged(fault: str, held: BaseException | None, took: float, timeout: float) -> str | None:
    """What is wrong with the error (or its absence) for ``fault``; None if nothing."""
    if fault in TIMED_OUT:
        if not isinstance(held, WorkerTimeoutError):
            return f"crash: not a WorkerTimeoutError: {type(held).__name__}: {held}"[:300]
        if fault in ("stop one", "stop all", "stopped between iterations"):
            if "stopped" not in str(held):
                return f"crash: the error does not say a worker was stopped: {held}"[:300]
        if took > timeout + LIMIT:
            return f"hang: the error came {took:.1f} s after the fault (timeout {timeout:g} s)"
        return None
    if fault == "worker's own 'timed out'":
        own = isinstance(held, RuntimeError) and not isinstance(held, WorkerTimeoutError)
        if own and "read of shard 3 timed out" in str(held):
            return None
        return f"crash: not the worker's own error: {type(held).__name__}: {held}"[:300]
    if held is not None:  # continued in time, a slow consumer: no error is due
        return f"crash: {fault}: {type(held).__name__}: {held}"[:300]
    return None


def _same(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=False))


def worker_timeouts(work: Path, scale: float) -> Iterator[Attempt]:
    """Each fault over worker counts, persistence, start method, source and what the caller
    does next, drawn (seeded)."""
    root = work / "worker-timeout"
    if not root.exists():
        write_synthetic_dataset(str(root), n_docs=120, sample_tokens=17, samples_per_shard=10)
    mix = {}
    for name, docs, seed in (("web", 80, 0), ("code", 40, 1)):
        mix[name] = work / f"worker-timeout-{name}"
        if not mix[name].exists():
            write_synthetic_dataset(str(mix[name]), n_docs=docs, sample_tokens=17,
                                    samples_per_shard=10, seed=seed)  # fmt: skip

    def attempt(fault: str, source: str, workers: int, persistent: bool, context: str,
                after: str) -> Attempt:  # fmt: skip
        def run() -> str:
            with contextlib.ExitStack() as stack:
                kw: dict[str, Any] = dict(OPTS, epochs=1)
                src: Any = str(root)
                if source == "mixture":
                    src, kw = {k: str(v) for k, v in mix.items()}, dict(OPTS, epochs=None)
                    kw.update(weights={"web": 0.6, "code": 0.4}, stop="first_exhausted")
                elif source == "http":
                    src = stack.enter_context(test_servers()[0](str(root))).base_url
                clean = [b["input_ids"].clone() for b in Loader(src, num_workers=0, **kw)]
                timeout = 10.0 if context == "spawn" else 1.5  # spawned: 3-5 s to start
                kw.update(num_workers=workers, worker_timeout=timeout, persistent_workers=persistent,
                          multiprocessing_context=context)  # fmt: skip
                before = {p.pid for p in mp.active_children() if p.pid}
                loader = Loader(src, **kw)
                undo = _patch(fault, workers)
                got, held, took = _read(loader, fault, timeout, before)
                if undo is not None:
                    undo()
                wrong = _judged(fault, held, took, timeout)
                if wrong:
                    return wrong
                live = _live(before)  # (persistent ones stay after an epoch without error)
                if live and (held is not None or not persistent):
                    return f"hang: workers {live} alive 2 s after the error, traceback held"
                if held is None:  # continued in time, a slow consumer: the whole epoch read
                    return "handled" if _same(got, clean) else "silent wrong: other batches"
                if after == "resume":
                    state = loader.state_dict()
                    loader = Loader(src, **kw)
                    loader.load_state_dict(state)
                rest = [b["input_ids"].clone() for b in loader]
                del held
                if not _same(got + rest, clean):
                    return f"silent wrong: {after} after the error gave other batches"
                return "clear error"

        label = (
            f"{fault}, {source}, {workers} {context}ed workers, persistent {persistent}, {after}"
        )
        return lambda: labelled(label, run())

    rng = random.Random(43)
    combos = [(f, s, w, p, c, a) for f in FAULTS for s in ("local", "mixture", "http")
              for w in (1, 2, 4) for p in (False, True) for c in ("fork", "spawn")
              for a in ("iter", "resume")
              if (f != "stopped between iterations" or p)
              and (c == "fork" or (f not in PATCHED and s == "local" and w <= 2))]  # fmt: skip
    for fault in FAULTS:  # every fault drawn, over the other axes
        mine = [c for c in combos if c[0] == fault]
        for combo in rng.sample(mine, max(2, int(len(mine) * 0.2 * scale))):
            yield attempt(*combo)
