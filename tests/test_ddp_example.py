"""examples/ddp_torchrun.py for real: ``python -m torch.distributed.run --nproc_per_node=2
--standalone`` (gloo, CPU), two ranks with two loader workers each, on a small dataset.

The dataset is written through the real shard writer with recognisable tokens (token ``t``
is the integer ``t``) and sized so the epoch plan leaves nothing out: one row is one whole
sample, and the sample count is a multiple of ``batch * world * streams``. So the example's
claims can be checked exactly from its per-rank records: every rank ran the same number of
steps (``len(loader)``), the ranks read disjoint rows, and together every sample once.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wdstream.testing import synthetic_doc_lengths, write_synthetic_dataset

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_torchrun.py"
WORLD, WORKERS, BATCH, SEQ_LEN = 2, 2, 3, 31
SAMPLE_TOKENS = SEQ_LEN + 1
LIMIT_S = 60


def _dataset(root: Path) -> int:
    """Write the dataset; return its sample count."""
    lens = synthetic_doc_lengths(50)
    lens[-1] += -sum(lens) % (SAMPLE_TOKENS * BATCH * WORLD * WORKERS)
    index = write_synthetic_dataset(
        str(root), doc_lens=lens, sample_tokens=SAMPLE_TOKENS, samples_per_shard=7
    )
    assert index.total_tokens % (SAMPLE_TOKENS * BATCH * WORLD * WORKERS) == 0
    return index.total_tokens // SAMPLE_TOKENS


def _sample_hash(k: int) -> str:
    """What the example records for a row holding sample ``k``: sha256 of its int64 tokens."""
    tokens = np.arange(k * SAMPLE_TOKENS, (k + 1) * SAMPLE_TOKENS, dtype="<i8")
    return hashlib.sha256(tokens.tobytes()).hexdigest()


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in its own process group; on timeout kill the whole group (torchrun's
    rank processes and their loader workers too) and fail."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in {LIMIT_S} s (a rank hung?)\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.timeout(LIMIT_S + 30)
def test_ddp_example_equal_steps_disjoint_complete(tmp_path: Path) -> None:
    n_samples = _dataset(tmp_path / "ds")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}",
        "--standalone", str(EXAMPLE), str(tmp_path / "ds"), "--seq-len", str(SEQ_LEN),
        "--batch-size", str(BATCH), "--workers", str(WORKERS), "--record", str(tmp_path / "rec"),
    ]  # fmt: skip
    done = _run(cmd, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads((tmp_path / "rec" / f"rank-{r}.json").read_text()) for r in range(WORLD)]

    # Every rank ran the same number of steps: one epoch's share, computed independently.
    steps = n_samples // (WORLD * BATCH)
    for r, rec in enumerate(records):
        assert (rec["rank"], rec["world_size"]) == (r, WORLD)
        assert rec["steps"] == rec["batches_per_epoch"] == steps
        assert rec["step_counts"] == [steps] * WORLD
        assert len(rec["rows"]) == steps and all(len(b) == BATCH for b in rec["rows"])
        assert rec["tokens_all_ranks"] == n_samples * SEQ_LEN
        assert f"rank {r}: {steps} steps ({steps} batches per epoch)" in done.stdout
    # Disjoint: no row read twice, within a rank or across ranks ...
    per_rank = [[h for batch in rec["rows"] for h in batch] for rec in records]
    assert all(len(set(rows)) == len(rows) for rows in per_rank)
    assert not set(per_rank[0]) & set(per_rank[1])
    # ... and complete: each row is one whole sample, and together the ranks read them all.
    assert set(per_rank[0]) | set(per_rank[1]) == {_sample_hash(k) for k in range(n_samples)}


def test_ddp_example_steps_option(tmp_path: Path) -> None:
    """``--steps`` stops every rank at the same step, before the epoch ends."""
    _dataset(tmp_path / "ds")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}",
        "--standalone", str(EXAMPLE), str(tmp_path / "ds"), "--seq-len", str(SEQ_LEN),
        "--batch-size", str(BATCH), "--steps", "5", "--record", str(tmp_path / "rec"),
    ]  # fmt: skip
    done = _run(cmd, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for r in range(WORLD):
        rec = json.loads((tmp_path / "rec" / f"rank-{r}.json").read_text())
        assert rec["steps"] == 5 and rec["step_counts"] == [5, 5] and len(rec["rows"]) == 5
