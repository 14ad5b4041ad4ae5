"""The s3/http backends are extras: a missing package names the extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "url,hidden,extra",
    [("s3://bucket/ds", "boto3", "s3"), ("http://127.0.0.1:9/ds", "requests", "http")],
)
def test_missing_backend_names_the_extra(url: str, hidden: str, extra: str) -> None:
    # A real interpreter where the package cannot be imported (None in sys.modules).
    code = (
        f"import sys; sys.modules[{hidden!r}] = None\n"
        "from wdstream.storage import open_store\n"
        "try:\n"
        f"    open_store({url!r})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"pip install 'wdstream[{extra}]'" in out.stdout
    assert hidden in out.stdout


def test_local_reads_import_no_remote_backend() -> None:
    code = (
        "import sys\n"
        "import wdstream, wdstream.storage\n"
        "wdstream.storage.open_store('.')\n"
        "print(sorted(m for m in ('boto3', 'requests') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
