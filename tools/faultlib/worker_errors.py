"""A Loader's torch workers when one fails: its error, their end, and the next iteration.

Attacked: a token byte flipped in a sample read on the first, second, a middle or the last
batch; a shard deleted under a live loader; a worker SIGKILLed mid-epoch; a
``KeyboardInterrupt`` while the loader waits on its workers; then a caller that keeps the
error (and its traceback) and calls ``iter()`` again or resumes a new loader from the state,
the data fixed in place. At 1, 2 and 4 workers, persistent or not, prefetch 1 or torch's
default. Oracles outside the code under test: the uninterrupted run without workers (its
batches), the shard's name and the sample's byte offset from its sidecar, and the attempt's
live child processes: a worker alive 2 s after the error, with the traceback still held, or
a zombie, is a ``hang``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import torch

from faultlib.common import Attempt
from wdstream import CorruptShardError, Loader
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.torch import handoff
from wdstream.testing import write_synthetic_dataset

OPTS: dict[str, Any] = dict(seq_len=16, batch_size=6, seed=7, chunk_batches=2,
                            shuffle_window=70, shuffle_lanes=3, epochs=1)  # fmt: skip
FAULTS = ("flip", "missing", "kill", "interrupt")
PLACES: dict[str, int | None] = {"first": 0, "second": 1, "middle": None, "last": -1}


def _clean(root: str) -> list[torch.Tensor]:
    return [b["input_ids"].clone() for b in Loader(root, num_workers=0, **OPTS)]


def _children_left(before: set[int], within: float = 2.0) -> str | None:
    """What is left of this process's children (other than ``before``) after ``within`` s:
    live ones or zombies; None when nothing is."""
    me = psutil.Process()
    deadline = time.monotonic() + within
    while True:
        mp.active_children()  # reaps the ended ones
        kids = [c for c in me.children() if c.pid not in before]
        live = [c.pid for c in kids if c.status() != psutil.STATUS_ZOMBIE]
        if not kids or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if live:
        return f"{len(live)} workers alive {within:g} s after the error, the traceback held"
    return f"{len(kids)} zombie workers" if kids else None


def _fault(fault: str, loader: Loader, dst: Path, name: str, offset: int, at: int) -> Any:
    """Arm ``fault`` for batch ``at``; returns what to do after each batch (or None)."""
    if fault == "flip":
        raw = bytearray((dst / name).read_bytes())
        raw[offset + 20] ^= 0x10
        (dst / name).write_bytes(bytes(raw))
    elif fault == "missing":
        (dst / name).rename(dst / f"{name}.away")
    elif fault == "interrupt":  # as if ^C came while the loader waits on its workers
        resolve, calls = handoff.WorkerHandoff.resolve, [0]

        def interrupted(self: handoff.WorkerHandoff, ref: Any) -> Any:
            calls[0] += 1
            if calls[0] > max(0, at // OPTS["chunk_batches"] - 1):
                raise KeyboardInterrupt
            return resolve(self, ref)

        handoff.WorkerHandoff.resolve = interrupted
        return lambda: setattr(handoff.WorkerHandoff, "resolve", resolve)
    return None


def _expected(fault: str, exc: BaseException, name: str, offset: int) -> bool:
    """Whether ``exc`` is the fault's own clear error (not a secondary one)."""
    said = str(exc)
    if fault == "flip":
        return isinstance(exc, CorruptShardError) and name in said and f"byte {offset}" in said
    if fault == "missing":
        return isinstance(exc, OSError) and name in said
    if fault == "kill":
        return isinstance(exc, RuntimeError) and "DataLoader worker" in said
    return isinstance(exc, KeyboardInterrupt)


def worker_errors(work: Path, scale: float) -> Iterator[Attempt]:
    """Each fault at each place, over worker counts, persistence, prefetch and what the
    caller does next, drawn (seeded)."""
    root = work / "worker-errors"
    if not root.exists():
        write_synthetic_dataset(str(root), n_docs=60, sample_tokens=17, samples_per_shard=7)

    def attempt(i: int, fault: str, place: str, workers: int, persistent: bool,
                prefetch: int | None, after: str) -> Attempt:  # fmt: skip
        def run() -> str:
            clean = _clean(str(root))
            n = len(clean)
            where = PLACES[place]
            at = n // 2 if where is None else where % n
            j = int(clean[at][0, 0]) // 17  # the sample of that batch's first row
            name = f"data-{j // 7:06d}.tar"
            sidecar = (root / name).with_suffix(".idx").read_bytes()
            offset = int(ShardSidecar.from_bytes(sidecar).offsets[j % 7])
            dst = work / f"worker-errors-{i}"
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(root, dst)
            kw = dict(OPTS, num_workers=workers, persistent_workers=persistent,
                      prefetch_factor=prefetch)  # fmt: skip
            before = {c.pid for c in psutil.Process().children()}
            loader = Loader(str(dst), **kw)
            undo = _fault(fault, loader, dst, name, offset, at)
            got: list[torch.Tensor] = []
            held: BaseException | None = None
            try:
                for k, b in enumerate(loader):
                    got.append(b["input_ids"].clone())
                    if fault == "kill" and k == at:
                        mine = [c.pid for c in psutil.Process().children() if c.pid not in before]
                        os.kill(max(mine), signal.SIGKILL)
                        time.sleep(0.2)
            except BaseException as exc:  # noqa: BLE001 - the caller keeps it, traceback too
                held = exc
            if undo is not None:
                undo()
            if held is None:  # a worker killed after the last batch: nothing left to lose
                same = len(got) == n and all(
                    torch.equal(a, b) for a, b in zip(got, clean, strict=True)
                )
                return "handled" if same else "silent wrong: no error, other batches"
            if not _expected(fault, held, name, offset):
                return f"crash: not the fault's own error: {type(held).__name__}: {held}"[:300]
            left = _children_left(before)
            if left:
                return f"hang: {left}"
            if not all(torch.equal(a, b) for a, b in zip(got, clean, strict=False)):
                return "silent wrong: batches before the error differ from the clean run's"
            if fault == "missing":  # fixed: back in place
                (dst / f"{name}.away").rename(dst / name)
            elif fault == "flip":  # fixed in place (the loader's open file sees it)
                with open(dst / name, "r+b") as f:
                    f.write((root / name).read_bytes())
            if after == "resume":
                state = loader.state_dict()
                loader = Loader(str(dst), **kw)
                loader.load_state_dict(state)
            rest = [b["input_ids"].clone() for b in loader]
            whole = got + rest
            same = len(whole) == n and all(
                torch.equal(a, b) for a, b in zip(whole, clean, strict=True)
            )
            del held
            return "clear error" if same else f"silent wrong: {after} gave other batches"

        return run

    rng = random.Random(17)
    combos = [(f, p, w, ps, pf, a) for f in FAULTS for p in PLACES for w in (1, 2, 4)
              for ps in (False, True) for pf in (None, 1) for a in ("iter", "resume")
              if not (f in ("kill", "interrupt") and p == "first")]  # fmt: skip
    for i, combo in enumerate(rng.sample(combos, max(12, int(len(combos) * 0.15 * scale)))):
        yield attempt(i, *combo)
