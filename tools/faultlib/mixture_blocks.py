"""The mixture's cached Block per place in the period, attacked with prime periods (session 44).

Session 43 made a rank's consecutive mixture rows come from a :class:`Block` cached per
(place in the period, rows) (``Interleave.block``; ``fill.fill_block`` / ``block_runs``)
instead of a lookup and a sort per chunk. Weights here need long prime periods (7,919 and
65,521 rows: 3001/2003/2915 and 30011/20011/15499) or short ones (97, 2 sources; a schedule
switching from one to another at step 7), so the chunks meet many places and places near
the period's end, and the rows of one block run across a period's end.

Oracles: (1) the uninterrupted run with every block located row by row (``fill_block``
replaced by the older lookup-and-sort path, ``_fill_located``): the same batches and
sources; (2) a new loader resumed from ``state_dict()`` at several steps: the uninterrupted
run's next batches; (3) across world sizes: ranks 0..W-1's batches at a step, in rank order,
are the one-rank run's batch of the global batch (W x b rows).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import wdstream.read.mixture.fill as fill
import wdstream.read.mixture.reader as reader
from faultlib.common import Attempt
from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

WEIGHTS: dict[str, dict[str, Any]] = {
    "period 7919": {"weights": {"a": 3001, "b": 2003, "c": 2915}},
    "period 65521": {"weights": {"a": 30011, "b": 20011, "c": 15499}},
    "period 97, 2 sources": {"weights": [(0, {"a": 60, "b": 37, "c": 0})]},
    "schedule 7919 -> 97 at step 7": {
        "weights": [(0, {"a": 3001, "b": 2003, "c": 2915}), (7, {"a": 60, "b": 37, "c": 0})]
    },
}
STEPS = 40


def _batches(
    sources: dict[str, str], mix: dict[str, Any], b: int, rank: int, world: int,
    chunk: int, state: dict | None = None, steps: int = STEPS, skip: int = 0,
) -> tuple[list[np.ndarray], list[dict]]:  # fmt: skip
    """``steps`` batches (input_ids, last label and source) and the state before each,
    after ``skip`` steps skipped (``skip_steps``: to a place near the period's end)."""
    loader = Loader(sources, **mix, seq_len=16, batch_size=b, chunk_batches=chunk, seed=5,
                    num_workers=0, rank=rank, world_size=world, shuffle_window=64)  # fmt: skip
    if state is not None:
        loader.load_state_dict(state)
    if skip:
        loader.skip_steps(skip)
    out, states = [], []
    it = iter(loader)
    for _ in range(steps):
        states.append(loader.state_dict())
        batch = next(it)
        src = np.asarray(batch["source"]).reshape(-1, 1)
        out.append(np.concatenate([batch["input_ids"], batch["labels"][:, -1:], src], axis=1))
    return out, states


def _located(sched: Any, orders: Any, row: int, n: int, tokens: Any, doc: Any) -> Any:
    """``fill_block`` without the cached Block: each row located, then sorted."""
    rows = np.arange(row, row + n, dtype=np.int64)
    return fill._fill_located(sched, orders, rows, tokens, doc)


def _attempt(sources: dict[str, str], label: str, b: int, world: int, chunk: int,
             seed: int, skip: int) -> Attempt:  # fmt: skip
    mix = WEIGHTS[label]

    def attempt() -> str:
        rng = random.Random(seed)
        ranks = [_batches(sources, mix, b, r, world, chunk, skip=skip) for r in range(world)]
        real = reader.fill_block
        reader.fill_block = _located  # the oracle's path (patched in this child only)
        try:
            plain = [_batches(sources, mix, b, r, world, chunk, skip=skip)[0]
                     for r in range(world)]  # fmt: skip
        finally:
            reader.fill_block = real
        for r in range(world):
            for s, (x, y) in enumerate(zip(ranks[r][0], plain[r], strict=True)):
                if not np.array_equal(x, y):
                    return f"silent wrong: {label}, rank {r}/{world}: step {s} differs from rows located one by one"
        if world > 1:
            one, _ = _batches(sources, mix, b * world, 0, 1, chunk, skip=skip)
            for s in range(STEPS):
                joined = np.concatenate([ranks[r][0][s] for r in range(world)])
                if not np.array_equal(joined, one[s]):
                    return f"silent wrong: {label}: step {s} of {world} ranks is not 1 rank's global batch"
        for s in sorted(rng.sample(range(1, STEPS), 4)):
            r = rng.randrange(world)
            got, _ = _batches(sources, mix, b, r, world, chunk, ranks[r][1][s], STEPS - s)
            for k, (x, y) in enumerate(zip(got, ranks[r][0][s:], strict=True)):
                if not np.array_equal(x, y):
                    return f"silent wrong: {label}, rank {r}/{world}: resumed at {s}, step {s + k} differs"
        return "handled"

    return attempt


def mixture_blocks(work: Path, scale: float) -> Iterator[Attempt]:
    sources = {}
    for i, name in enumerate(("a", "b", "c")):
        root = work / f"mixture-blocks-{name}"
        if not root.exists():
            write_synthetic_dataset(str(root), n_docs=120 + 50 * i, sample_tokens=17,
                                    samples_per_shard=30, seed=i)  # fmt: skip
        sources[name] = str(root)
    rng = random.Random(4444)
    n = max(len(WEIGHTS), int(24 * scale))
    for k in range(n):
        label = list(WEIGHTS)[k % len(WEIGHTS)]
        b, chunk = rng.choice([1, 2, 3, 5, 7]), rng.choice([1, 2, 4])
        world = 1 if k % 2 else rng.choice([2, 3])  # one rank: the cached blocks' path
        period = 97 if "97" in label else int(label.split()[1])
        # Past the period's end within the run (skipped to a few steps before it), or not.
        skip = max(0, period // (b * world) - rng.randrange(1, 6)) if k % 3 else 0
        yield _attempt(sources, label, b, world, chunk, 4444 + k, skip)
