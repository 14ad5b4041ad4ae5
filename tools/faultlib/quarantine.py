"""``on_corrupt="mask"``: damaged samples read as masked rows, each recorded."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from faultlib.common import READ, Attempt, clean_dataset, flipped
from wdstream import Loader, WdstreamError
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store

# ---------------------------------------------------------------- quarantine


def _masked_outcome(got: list[dict], events: list, want: list[dict], sample_of: Callable) -> str:
    """``handled: N rows masked`` when every row of ``got`` is the clean row of ``want`` or, recorded in
    ``events``, masked whole (``input_ids`` 0, ``labels`` -100) and holding a token of a
    sample an event names (clean token ``t`` is of sample ``t // 33``); else what is wrong."""
    if len(got) != len(want):
        return f"silent wrong: {len(got)} batches, the clean run has {len(want)}"
    named: dict[tuple[int, int], set[int]] = {}
    for e in events:
        named.setdefault((e.step, e.row), set()).add(sample_of(e))
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        rows = np.concatenate([w["input_ids"], w["labels"][:, -1:]], axis=1)
        for r, row in enumerate(rows):
            masked = bool((g["input_ids"][r] == 0).all() and (g["labels"][r] == -100).all())
            if (step, r) in named:
                if not masked or not named[(step, r)] <= set((row // 33).tolist()):
                    return f"silent wrong: step {step} row {r} recorded but not masked as named"
            elif not (np.array_equal(g["input_ids"][r], w["input_ids"][r])
                      and np.array_equal(g["labels"][r], w["labels"][r])):  # fmt: skip
                return f"silent wrong: step {step} row {r} differs from the clean run, unrecorded"
    return f"handled: {len(named)} rows masked"


def quarantined_rows(work: Path, scale: float) -> Iterator[Attempt]:
    """Bit flips in samples, anywhere in a tar, in a sidecar, and shards cut at a random byte,
    read with ``on_corrupt="mask"`` at 0 and 2 workers and rows of 21 tokens (across samples)."""
    root, _ = clean_dataset(work)
    opts = {**READ, "seq_len": 20}
    want = list(Loader(root, **opts))
    shards = read_index(open_store(root)).shards
    names = [s.name for s in shards]
    firsts = np.cumsum([0] + [s.samples for s in shards]).tolist()

    def sample_of(e: object) -> int:
        return firsts[names.index(e.shard.rsplit("/", 1)[1])] + e.sample  # type: ignore[attr-defined]

    rng = np.random.default_rng(11)
    for i in range(max(4, int(60 * scale))):
        kind, workers = ("sample", "tar", "idx", "cut")[i % 4], 2 * ((i // 4) % 2)
        shard = shards[int(rng.integers(len(shards)))]
        name = shard.sidecar if kind == "idx" else shard.name
        sc = ShardSidecar.from_bytes((Path(root) / shard.sidecar).read_bytes())
        k = int(rng.integers(len(sc)))
        size = (Path(root) / name).stat().st_size
        at = (int(sc.offsets[k]) * 8 + int(rng.integers(int(sc.sizes[k]) * 8)) if kind == "sample"
              else int(rng.integers(size * 8)))  # fmt: skip
        dst = work / f"quarantine-{i}"

        def attempt(dst: Path = dst, name: str = name, at: int = at, kind: str = kind,
                    workers: int = workers) -> str:  # fmt: skip
            if kind == "cut":
                shutil.copytree(root, dst)
                (dst / name).write_bytes((dst / name).read_bytes()[: at // 8])
            else:
                flipped(root, dst, name, at)
            # no practical limit: this attack checks the masking (the default limit has its own)
            loader = Loader(str(dst), **{**opts, "num_workers": workers}, on_corrupt="mask",
                            max_quarantined=10**12)  # fmt: skip
            try:
                got = list(loader)
            except WdstreamError as exc:
                return "clear error" if str(exc) else "crash"
            return _masked_outcome(got, loader.quarantined, want, sample_of)

        yield attempt
