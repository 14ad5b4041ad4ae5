"""The first step made by the training process: a ``Loader`` with workers (global order,
mixtures) makes the iteration's first step itself and forks its workers only when the
second batch is asked for, from the position after it.

Attacked: corrupt bytes in the samples that step reads (``on_corrupt`` raise and mask, fork
and spawn), what a caller does between the first and the second batch (state and resume at
0-3 workers, a break and a new ``iter()``, ``skip_steps``, ``batch_at``, ``len``, epochs of
1-2 steps, ranks, document boundaries, mixtures, persistent workers), and an HTTP store
failing during that step. Every fork is watched: a reader thread alive at it (the child
would wait on a thread it does not have) is a ``hang``. Oracles outside the code under
test: the uninterrupted run without workers (equal tensors, quarantine events, states) and
the damaged sample's shard named by hand.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import random
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from faultlib.common import Attempt, test_servers
from wdstream import Loader, WdstreamError
from wdstream.errors import CorruptShardError
from wdstream.format.sidecar import ShardSidecar
from wdstream.testing import write_synthetic_dataset

OPTS: dict[str, Any] = dict(seq_len=20, batch_size=2, seed=3, chunk_batches=2)
Batches = list[dict[str, torch.Tensor]]


def _dataset(work: Path, name: str, **kw: Any) -> str:
    root = work / f"first-step-{name}"
    if not root.exists():
        write_synthetic_dataset(str(root), **kw)
    return str(root)


def _watched(attempt: Callable[[], str]) -> Attempt:
    """``attempt`` with ``os.fork`` watched: a fork beside a reader thread is a hang."""

    def run() -> str:
        alive: list[str] = []
        fork = os.fork

        def watched() -> int:
            names = [t.name for t in threading.enumerate() if t.name.startswith("wdstream-")]
            if names:
                alive.extend(names)
                raise RuntimeError(f"forked beside the reader's threads {names}")
            return fork()

        os.fork = watched  # this attempt's own child process
        try:
            outcome = attempt()
        except Exception:
            if alive:
                return f"hang: a worker forked beside reader threads {sorted(set(alive))}"
            raise
        finally:
            os.fork = fork
        return outcome

    return run


def _same(got: Batches, want: Batches) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} batches, the run without workers has {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in b):
            return f"batch {i} differs from the run without workers"
    return None


# ---------------------------------------------------------------- corrupt first-step samples


def _flip(root: str, dst: Path, shard: dict[str, Any], k: int, back: int) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(root, dst)
    sc = ShardSidecar.from_bytes((Path(root) / shard["sidecar"]).read_bytes())
    raw = bytearray((dst / shard["name"]).read_bytes())
    raw[int(sc.offsets[k]) + int(sc.sizes[k]) - back] ^= 0x10
    (dst / shard["name"]).write_bytes(bytes(raw))


def _first_step_samples(root: str, work: Path) -> list[tuple[dict[str, Any], int]]:
    """The samples the first step reads: each flipped in turn, read masked without workers."""
    found = []
    for shard in json.loads((Path(root) / "index.json").read_text())["shards"]:
        for k in range(shard["samples"]):
            _flip(root, work / "first-step-probe", shard, k, 3)
            probe = Loader(str(work / "first-step-probe"), num_workers=0, epochs=1,
                           on_corrupt="mask", **OPTS)  # fmt: skip
            next(iter(probe))
            if probe.quarantined:
                found.append((shard, k))
    shutil.rmtree(work / "first-step-probe", ignore_errors=True)
    return found


def _masked(root: str, workers: int, **kw: Any) -> tuple[Batches, list[Any], dict[str, Any]]:
    loader = Loader(root, num_workers=workers, epochs=1, on_corrupt="mask",
                    max_quarantined=10**6, **OPTS, **kw)  # fmt: skip
    got = [{k: v.clone() for k, v in b.items()} for b in loader]
    events = [(e.step, e.row, e.shard, e.sample) for e in loader.quarantined]
    return got, events, loader.state_dict()


def first_step_corruption(work: Path, scale: float) -> Iterator[Attempt]:
    """A byte flipped in each sample the first step reads (and in 4 it does not): raised
    in the training process before any fork, naming the shard and byte, at 1-3 workers
    (fork, spawn, forkserver); masked: rows, events and state those of no workers."""
    root = _dataset(work, "data", n_docs=40, sample_tokens=33, samples_per_shard=5)
    shards = json.loads((Path(root) / "index.json").read_text())["shards"]
    firsts = _first_step_samples(root, work)
    rng = random.Random(7)
    others = [(s, rng.randrange(s["samples"])) for s in rng.sample(shards, 4)]
    targets = [(s, k, True) for s, k in firsts] + [(s, k, False) for s, k in others]
    contexts = (None, "spawn", "forkserver")

    def attempt(
        i: int, shard: dict[str, Any], k: int, first: bool, workers: int, mode: str
    ) -> Attempt:
        def run() -> str:
            dst = work / f"first-step-flip-{i}"
            _flip(root, dst, shard, k, 3 + i % 5)
            if mode == "mask":
                clean, masked = _masked(str(dst), 0), _masked(str(dst), workers)
                wrong = _same(masked[0], clean[0])
                if wrong or masked[1] != clean[1] or masked[2] != clean[2]:
                    return f"silent wrong: {wrong or 'quarantine events or state differ'}"
                return "handled"
            context = contexts[i % 3]
            loader = Loader(str(dst), num_workers=workers, epochs=1,
                            multiprocessing_context=context, **OPTS)  # fmt: skip
            children = set(mp.active_children())  # an earlier attempt's, still exiting
            try:
                got = [b["input_ids"].clone() for b in loader]
            except CorruptShardError as exc:
                said = str(exc)
                # the first step's sample: raised by the training process, before any fork
                here = "worker" not in said and set(mp.active_children()) <= children
                if shard["name"] not in said or "byte" not in said or (first and not here):
                    return f"crash: not the training process's error naming the shard: {said}"[:300]
                return "clear error"
            want = [b["input_ids"] for b in Loader(str(dst), num_workers=0, epochs=1, **OPTS)]
            ok = len(got) == len(want) and all(
                torch.equal(a, b) for a, b in zip(got, want, strict=False)
            )
            return "handled" if ok else "silent wrong: read without an error, rows differ"

        return _watched(run)

    n = 0
    for shard, k, first in targets[: max(2, int(len(targets) * scale))]:
        for workers, mode in ((1, "raise"), (2, "raise"), (3, "raise"), (2, "mask"), (3, "mask")):
            yield attempt(n, shard, k, first, workers, mode)
            n += 1


# ---------------------------------------------------------------- between batch 1 and 2


def _play(root: Any, workers: int, plan: list[tuple[Any, ...]], **kw: Any) -> list[Any]:
    """Run ``plan`` on a loader: ``take n`` (an ``iter()`` closed after n batches; None: to
    its end), ``state``, ``resume w`` (a new loader at w workers from the state), ``skip
    n``, ``batch_at s``, ``len``, ``at s`` (``batch_at`` inside the running iterator, after
    its first batch)."""
    loader = Loader(root, num_workers=workers, **{**OPTS, **kw})
    out: list[Any] = []
    for op, arg in plan:
        if op == "take":
            out += [{k: v.clone() for k, v in b.items()} for b in itertools.islice(loader, arg)]
        elif op == "at":
            it = iter(loader)  # a generator: closed below
            out += [{k: v.clone() for k, v in b.items()} for b in itertools.islice(it, 1)]
            out.append(dict(loader.batch_at(arg)))
            out += [{k: v.clone() for k, v in b.items()} for b in itertools.islice(it, 4)]
            it.close()  # type: ignore[attr-defined]
        elif op == "state":
            out.append(json.dumps(loader.state_dict(), sort_keys=True))
        elif op == "resume":
            state = loader.state_dict()
            loader = Loader(root, num_workers=arg, **{**OPTS, **kw})
            loader.load_state_dict(state)
        elif op == "skip":
            loader.skip_steps(arg)
        elif op == "batch_at":
            out.append(dict(loader.batch_at(arg)))
        elif op == "len":
            out.append(str(len(loader)))
    return out


def _differs(got: list[Any], want: list[Any]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} items, the run without workers has {len(want)}"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if isinstance(b, str):
            if a != b:
                return f"item {i} (state or len) differs: {str(a)[:120]} vs {b[:120]}"
        elif _same([a], [b]):
            return f"item {i}: a batch differs from the run without workers"
    return None


PLANS: dict[str, list[tuple[Any, ...]]] = {
    "state after the first batch, resume": [("take", 1), ("state", 0), ("resume", "W"),
                                            ("take", None), ("state", 0)],
    "break after the first batch, iter() again": [("take", 1), ("state", 0), ("take", 1),
                                                  ("take", 3), ("state", 0), ("take", None)],
    "skip_steps, first batch, skip again": [("skip", 3), ("take", 1), ("state", 0), ("take", 2),
                                            ("skip", 2), ("take", 2), ("state", 0)],
    "batch_at between batch 1 and 2": [("at", 7), ("state", 0), ("at", 0), ("take", 2)],
    "batch_at, then the first batch": [("batch_at", 5), ("take", 2), ("len", 0), ("take", 1)],
    "whole epochs, len": [("len", 0), ("take", None), ("state", 0), ("len", 0), ("take", None)],
}  # fmt: skip


def between_batches(work: Path, scale: float) -> Iterator[Attempt]:
    """Each plan at 1-3 workers against the same plan without workers, over variants of the
    data and options drawn (seeded) from epochs of 1-2 steps to mixtures."""
    data = _dataset(work, "data", n_docs=40, sample_tokens=33, samples_per_shard=5)
    tiny = _dataset(work, "tiny", n_docs=2, sample_tokens=21, samples_per_shard=1)
    short = _dataset(work, "short", n_docs=6, sample_tokens=21, samples_per_shard=2)
    mix = {n: _dataset(work, f"mix-{n}", n_docs=d, sample_tokens=17, samples_per_shard=5, seed=s)
           for n, d, s in (("web", 50, 0), ("code", 6, 1), ("books", 30, 2))}  # fmt: skip
    variants: dict[str, tuple[Any, dict[str, Any]]] = {
        "one epoch": (data, {"epochs": 1}),
        "two epochs, document boundaries": (data, {"epochs": 2, "return_doc_boundaries": True}),
        "rank 1 of 3, epochs None": (data, {"epochs": None, "rank": 1, "world_size": 3}),
        "a 1-step epoch": (tiny, {"epochs": 1}),
        "2-step epochs, twice": (short, {"epochs": 2}),
        "persistent workers": (data, {"epochs": 1, "persistent_workers": True}),
        "spawned workers": (data, {"epochs": 1, "multiprocessing_context": "spawn"}),
        "mixture, first_exhausted": (mix, {"weights": {"web": 0.5, "code": 0.3, "books": 0.2},
                                           "stop": "first_exhausted", "epochs": None}),
    }  # fmt: skip

    def attempt(root: Any, kw: dict[str, Any], plan: list[tuple[Any, ...]], w: int) -> Attempt:
        def run() -> str:
            steps = [(o, w if a == "W" else a) for o, a in plan]
            if kw.get("epochs", 1) is None and "stop" not in kw:
                steps = [(o, 5 if o == "take" and a is None else a) for o, a in steps]
            steps = [s for s in steps if s[0] != "len" or kw.get("epochs", 1) is not None]
            plain = {k: v for k, v in kw.items()
                     if k not in ("persistent_workers", "multiprocessing_context")}  # fmt: skip
            try:
                want = _play(root, 0, [(o, 0 if o == "resume" else a) for o, a in steps], **plain)
            except (WdstreamError, IndexError, TypeError, ValueError) as exc:
                want = [f"error {type(exc).__name__}"]
            try:
                got = _play(root, w, steps, **kw)
            except (WdstreamError, IndexError, TypeError, ValueError) as exc:
                got = [f"error {type(exc).__name__}"]
            wrong = _differs(got, want)
            return f"silent wrong: {wrong}" if wrong else "handled"

        return _watched(run)

    rng = random.Random(11)
    combos = [(v, p, w) for v in variants for p in PLANS for w in (1, 2, 3)]
    for v, p, w in rng.sample(combos, max(8, int(len(combos) * 0.5 * scale))):
        root, kw = variants[v]
        yield attempt(root, kw, PLANS[p], w)


# ---------------------------------------------------------------- an HTTP store failing


def first_step_http(work: Path, scale: float) -> Iterator[Attempt]:
    """An HTTP store (tests/servers.py) failing while the training process makes the first
    step: 503s, cut and stalled bodies, a trickle, ignored ranges, aimed at the first
    step's shards or at every request; 2 workers, read to the end; oracle: the local rows."""
    root = _dataset(work, "data", n_docs=40, sample_tokens=33, samples_per_shard=5)
    file_server, _ = test_servers()
    firsts = sorted({s["name"] for s, _ in _first_step_samples(root, work)})
    limits: dict[str, Any] = {
        "retries": 2,
        "timeout": 1.0,
        "deadline": 2.0,
        "budget": 4.0,
        "backoff": 0.02,
    }
    knobs: list[dict[str, Any]] = [
        {"fail_first": 2}, {"fail_first": 50}, {"fail_every": 3}, {"cut_first": 2, "cut_at": 100},
        {"cut_every": 2, "cut_at": 300}, {"cut_first": 1, "cut_at": 50, "stall": True},
        {"delay": 0.3}, {"trickle": 0.3}, {"ignore_range": True}, {"fail_status": 404, "fail_first": 3},
    ]  # fmt: skip

    def attempt(knob: dict[str, Any], only: str, workers: int) -> Attempt:
        def run() -> str:
            want = [b["input_ids"] for b in Loader(root, num_workers=0, epochs=1, **OPTS)]
            with file_server(root) as server:
                server.faults.reset(**knob, only=only)
                try:
                    loader = Loader(server.base_url, num_workers=workers, epochs=1,
                                    **OPTS, **limits)  # fmt: skip
                    got = [b["input_ids"].clone() for b in loader]
                except (WdstreamError, OSError) as exc:  # an OSError must name the object
                    said = str(exc)
                    named = isinstance(exc, WdstreamError) or server.base_url in said
                    return "clear error" if said and named else f"crash: {said}"[:300]
            ok = len(got) == len(want) and all(
                torch.equal(a, b) for a, b in zip(got, want, strict=False)
            )
            return "handled" if ok else "silent wrong: rows differ from the local read"

        return _watched(run)

    for i, knob in enumerate(knobs[: max(3, int(len(knobs) * scale))]):
        for only in ("", firsts[i % len(firsts)]):
            yield attempt(knob, only, 2 if i % 2 == 0 else 3)
