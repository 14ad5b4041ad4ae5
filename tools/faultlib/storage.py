"""Storage faults on the read side: a FIFO for a shard, an interrupted pack read."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from faultlib.common import Attempt, clean_dataset, compare, read_rows, run_cli

# ---------------------------------------------------------------- storage


def fifo_shard(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    dst = work / "fifo"
    shutil.copytree(root, dst)
    (dst / "data-000001.tar").unlink()
    os.mkfifo(dst / "data-000001.tar")
    yield lambda: compare(lambda: read_rows(str(dst)), want)


def interrupted_pack(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    dst = work / "interrupted"
    shutil.copytree(root, dst)
    (dst / "index.json").unlink()
    (dst / ".wdstream-pack.json").write_text("{}")
    yield lambda: compare(lambda: read_rows(str(dst)), want)
    yield lambda: run_cli(["stats", str(dst)], timeout=60)
