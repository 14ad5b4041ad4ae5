"""Rows as served: shards opened by URL, short last samples, bucketed long documents."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from faultlib.common import Attempt, compare, corpus_lines, read_rows, stored_samples
from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

# ---------------------------------------------------------------- rows


def shard_url_openings(work: Path, scale: float) -> Iterator[Attempt]:
    """A best-fit pack opened by its root, a brace pattern, a glob and a list must give the
    same rows and targets (padding and document ends masked: the index beside the shards
    says so); a stray shard, one of another pack, or folders with and without an index
    must be refused, never read under a guessed meaning."""
    packs = work / "url-openings"
    if not packs.exists():
        packs.mkdir()
        src = packs / "in.jsonl"
        src.write_text("\n".join(corpus_lines(120)) + "\n")
        for name in ("bf", "other"):
            args = ["pack", str(src), "-o", str(packs / name), "--mode", "bestfit",
                    "--seq-len", "63", "--shard-size", "8KB", "--workers", "0", "-q"]  # fmt: skip
            if name == "other":
                args[1] = str(packs / "in2.jsonl")
                (packs / "in2.jsonl").write_text("\n".join(corpus_lines(121)[1:]) + "\n")
            subprocess.run([sys.executable, "-m", "wdstream.cli", *args], check=True)
    root, other = packs / "bf", packs / "other"
    names = sorted(p.name for p in root.glob("*.tar"))
    opts = dict(seq_len=63, batch_size=2, num_workers=0, seed=1, epochs=1)

    def targets(source: object) -> np.ndarray:
        return np.concatenate([b["labels"].numpy() for b in Loader(source, **opts)])

    want = targets(str(root))
    n = len(names)
    for opening in (str(root / f"data-{{000000..{n - 1:06d}}}.tar"), str(root / "*.tar"),
                    [str(root / x) for x in names]):  # fmt: skip
        yield lambda opening=opening: compare(lambda: targets(opening), want)

    def refused(setup: Callable[[Path], object]) -> Attempt:
        def attempt() -> str:
            d = Path(tempfile.mkdtemp(dir=work))
            shutil.copytree(root, d / "bf")
            source = setup(d)
            return compare(lambda: targets(source), np.zeros(0))  # any data is wrong here

        return attempt

    def stray(d: Path) -> object:
        for suffix in ("tar", "idx"):
            shutil.copy(other / f"data-000000.{suffix}", d / "bf" / f"stray-000000.{suffix}")
        return str(d / "bf" / "*.tar")

    def same_name(d: Path) -> object:
        for suffix in ("tar", "idx"):
            shutil.copy(other / f"data-000001.{suffix}", d / "bf" / f"data-000001.{suffix}")
        return str(d / "bf" / "data-00000{0,1}.tar")

    def mixed_folders(d: Path) -> object:
        (d / "bare").mkdir()
        for suffix in ("tar", "idx"):
            shutil.copy(root / f"data-000000.{suffix}", d / "bare" / f"data-000000.{suffix}")
        return [str(d / "bf" / "data-000001.tar"), str(d / "bare" / "data-000000.tar")]

    for setup in (stray, same_name, mixed_folders):
        yield refused(setup)


def shuffled_short_sample(work: Path, scale: float) -> Iterator[Attempt]:
    """The dataset's short last sample must never splice two samples into one row."""
    root = work / "short-last"
    if not root.exists():
        write_synthetic_dataset(str(root), n_docs=30, sample_tokens=33, samples_per_shard=4)
    for seed in range(max(2, int(8 * scale))):
        for order in ("global", "streams"):

            def attempt(seed: int = seed, order: str = order) -> str:
                rows = read_rows(str(root), seed=seed, order=order, epochs=2)
                whole = (rows[:, 0] % 33 == 0) & (np.diff(rows, axis=1) == 1).all(axis=1)
                return "handled" if whole.all() else "silent wrong"

            yield attempt


def bucketed_tokens(work: Path, scale: float) -> Iterator[Attempt]:
    """``max_tokens`` batches of a docs-mode pack with documents longer than ``seq_len``:
    every row served at 1-3 ranks, plus the rows ``epoch_stats`` counts as left out, must be
    every piece of every document (decoded with tarfile + msgpack) exactly once."""
    root = work / "docs-pack"
    if not root.exists():
        src = work / "docs-in.jsonl"
        src.write_text("\n".join(corpus_lines(150)) + "\n")
        subprocess.run([sys.executable, "-m", "wdstream.cli", "pack", str(src), "-o", str(root),
                        "--mode", "docs", "--workers", "0", "-q"], check=True)  # fmt: skip
    cases = [(seq, w, seed) for seq in (16, 64) for w in (1, 2, 3) for seed in (0, 1)]
    for seq, world, seed in cases[: max(2, int(len(cases) * scale))]:

        def attempt(seq: int = seq, world: int = world, seed: int = seed) -> str:
            want: Counter = Counter()
            for d in stored_samples(str(root)):
                for k in range(0, len(d) - 1, seq):
                    want[tuple(d[k : k + seq + 1].tolist())] += 1
            got: Counter = Counter()
            left = 0
            for rank in range(world):
                ld = Loader(str(root), seq_len=seq, max_tokens=4 * seq, seed=seed, rank=rank,
                            world_size=world, epochs=1)  # fmt: skip
                left = ld.epoch_stats(0)["left_out_rows"]
                for bt in ld:
                    for r in range(len(bt["input_ids"])):
                        n = int(bt["attention_mask"][r].sum())
                        got[
                            tuple(bt["input_ids"][r, :n].tolist() + [int(bt["labels"][r, n - 1])])
                        ] += 1
            missing = want - got
            if got - want or sum(missing.values()) != left:
                return f"silent wrong: {sum((got - want).values())} rows extra, {sum(missing.values())} missing, {left} counted"
            return "handled"

        yield attempt
