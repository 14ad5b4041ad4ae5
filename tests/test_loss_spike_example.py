"""``examples/loss_spike.py`` runs as written (a fresh process, CPU only): it finds the spike
its planted burst makes, traces it to the planted lines, skips it and checks itself against
the uninterrupted run (its own asserts); here its output is checked too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "loss_spike.py"


@pytest.mark.timeout(180)
def test_loss_spike_workflow(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=170, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout.splitlines()
    assert out[-1] == "OK"
    assert any("<- spike at steps" in line for line in out)
    top = out[out.index(next(x for x in out if x.endswith("highest:"))) + 1 :][:6]
    assert sorted(line.split(":")[-1] for line in top) == [str(n) for n in range(1201, 1207)]
    assert any(line.startswith("6 culprits") for line in out)
    # The workflow's artefacts: checkpoints with their loader states, the packed dataset.
    assert (tmp_path / "ckpt" / "ckpt-200.json").exists()
    assert (tmp_path / "data" / "index.json").exists()
