"""Bit flips in shards and sidecars, and edits of index.json."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from faultlib.common import Attempt, clean_dataset, compare, flipped, read_rows, run_cli
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store


def flips(
    kind: str, n: int, seed: int, **read: object
) -> Callable[[Path, float], Iterator[Attempt]]:
    """Random single-bit flips in sample bytes of tars, anywhere in tars, or in sidecars;
    the epoch read with ``read``'s Loader options on top of ``READ`` (e.g. 2 workers, which
    verify the samples they copy)."""

    def attempts(work: Path, scale: float) -> Iterator[Attempt]:
        root, want = clean_dataset(work)
        shards = read_index(open_store(root)).shards
        rng = np.random.default_rng([seed, n])
        for i in range(max(1, int(n * scale))):
            shard = shards[int(rng.integers(len(shards)))]
            name = shard.sidecar if kind == "idx" else shard.name
            if kind == "sample":
                sc = ShardSidecar.from_bytes((Path(root) / shard.sidecar).read_bytes())
                k = int(rng.integers(len(sc)))
                bit = int(sc.offsets[k]) * 8 + int(rng.integers(int(sc.sizes[k]) * 8))
            else:
                bit = int(rng.integers((Path(root) / name).stat().st_size * 8))
            dst = work / f"{kind}-{seed}-{i}"  # one folder per attempt of every attack

            def attempt(dst: Path = dst, name: str = name, bit: int = bit) -> str:
                return compare(lambda: read_rows(flipped(root, dst, name, bit), **read), want)

            yield attempt

    return attempts


# ---------------------------------------------------------------- index.json edits


def _edits() -> dict[str, Callable[[dict], None]]:
    def shard(i: int, key: str, value: object) -> Callable[[dict], None]:
        return lambda ix: ix["shards"][i].__setitem__(key, value)

    def swap(ix: dict) -> None:
        ix["shards"][0], ix["shards"][1] = ix["shards"][1], ix["shards"][0]

    return {
        "tokens = -1": shard(1, "tokens", -1),
        "tokens reduced": lambda ix: ix["shards"][1].__setitem__(
            "tokens", ix["shards"][1]["tokens"] - 40
        ),
        "samples = 0": shard(1, "samples", 0),
        "samples = -5": shard(1, "samples", -5),
        "shard listed twice": lambda ix: ix["shards"].__setitem__(
            2, copy.deepcopy(ix["shards"][1])
        ),
        "two shards swapped": swap,
        "tokens = inf": shard(0, "tokens", float("inf")),
        "tokens = NaN": shard(0, "tokens", float("nan")),
        "no shards key": lambda ix: ix.pop("shards"),
        "sample_tokens = 10**30": lambda ix: ix.__setitem__("sample_tokens", 10**30),
        "name ../other/x.tar": shard(1, "name", "../other/data-000001.tar"),
        "absolute sidecar name": shard(1, "sidecar", "/etc/passwd"),
        "tokens a string": shard(0, "tokens", "297"),
        "version 3": lambda ix: ix.__setitem__("version", 3),
    }


def index_edits(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    for i, (label, edit) in enumerate(_edits().items()):
        dst = work / f"index-{i}"
        shutil.copytree(root, dst)
        obj = json.loads((dst / "index.json").read_text())
        edit(obj)
        (dst / "index.json").write_text(json.dumps(obj))  # inf/NaN as JSON's Infinity/NaN

        def via_loader(dst: Path = dst) -> str:
            return compare(lambda: read_rows(str(dst)), want)

        def via_verify(dst: Path = dst) -> str:
            return run_cli(["verify", str(dst)], timeout=60)

        yield via_loader
        yield via_verify
        del label
