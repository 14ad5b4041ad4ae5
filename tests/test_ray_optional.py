"""Ray is an extra: without it wdstream imports and packs locally, and --engine ray names
the extra to install. A real interpreter in which ``import ray`` fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_HIDE_RAY = "import sys; sys.modules['ray'] = None\n"


@pytest.mark.parametrize("hide", [True, False], ids=["ray-missing", "ray-installed"])
def test_local_pack_never_imports_ray(tmp_path: Path, hide: bool) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(50)))
    code = (
        (_HIDE_RAY if hide else "import sys\n") + "import wdstream\n"
        f"r = wdstream.pack([{str(src)!r}], {str(tmp_path / 'out')!r}, seq_len=63, workers=0,"
        " progress=False)\n"
        "loaded = [m for m, v in sys.modules.items() if m.split('.')[0] == 'ray' and v]\n"
        "print(r.index.total_documents, sorted(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["50", "[]"]


def test_ray_engine_without_ray_names_the_extra(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "one document"}) + "\n")
    code = (
        _HIDE_RAY + "import wdstream\n"
        "try:\n"
        f"    wdstream.pack([{str(src)!r}], {str(tmp_path / 'out')!r}, engine='ray',"
        " workers=0, progress=False)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'wdstream[ray]'" in out.stdout and "ray" in out.stdout
