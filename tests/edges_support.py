"""Helpers of the edge tests (issue 33's items 6 and 9-12): the CLI in a process of its own,
and a dataset's stored samples decoded with tarfile + msgpack, not wdstream's reader."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import msgpack
import numpy as np

from tests import cli_server

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``wdstream ARGS`` in a child process (a process abort shows as its exit status),
    forked from :mod:`tests.cli_server`'s server rather than a fresh python."""
    return cli_server.run_cli(*args, timeout=timeout, cwd=ROOT)


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``Error:`` line of a command that failed cleanly (no traceback, no abort)."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("Error: "), proc.stderr
    return proc.stderr.strip()


def stored_samples(root: Path) -> list[list[int]]:
    """Every sample's stored tokens in shard and sample order (tarfile + msgpack)."""
    out = []
    for shard in json.loads((root / "index.json").read_text())["shards"]:
        with tarfile.open(root / shard["name"]) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m) if m.name.endswith((".mp", ".msgpack")) else None
                if f is not None:
                    x = msgpack.unpackb(f.read())
                    dt = {"uint16": "<u2", "uint32": "<u4"}[x["dtype"]]
                    out.append(np.frombuffer(x["tokens"], dtype=dt).astype(np.int64).tolist())
    return out


def index_stats(root: Path) -> dict:
    """``index.json``'s ``stats``, read with json."""
    return json.loads((root / "index.json").read_text())["stats"]
