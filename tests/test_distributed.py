"""Real 2-rank gloo run: 2 ranks x 2 workers, an all_reduce per step, a kill and a resume.

The dataset is built so that nothing may be left out: with ``seq_len + 1 == sample_tokens``
one row is one whole sample, and the sample count is a multiple of ``2 * world * streams``, so
every one of the 4 streams gets the same even number of samples (whole batches). Token ``t``
is the integer ``t`` (``write_synthetic_dataset``), so the rows themselves say which samples
were read. The run is killed after ``KILL_AT`` steps and resumed from the saved cursors;
what the ranks saw before the kill plus after the resume is checked separately for
equal step counts, no duplicate, no missing sample and exact order.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.processes import run_ranks, start_ranks
from wdstream import Loader
from wdstream.testing import synthetic_doc_lengths, write_synthetic_dataset

WORLD = 2
WORKERS = 2
SAMPLE_TOKENS = 25
OPTS: dict[str, Any] = dict(
    seq_len=SAMPLE_TOKENS - 1,
    batch_size=2,
    num_workers=WORKERS,
    epochs=1,
    chunk_batches=3,
    shuffle_window=8,
    shuffle_lanes=3,
    seed=7,
    order="streams",  # per-rank streams; the global order: tests/test_elastic_distributed.py
)
KILL_AT = 11


def _rows(batch: dict[str, torch.Tensor]) -> np.ndarray:
    """The batch's rows of ``seq_len + 1`` tokens (inputs plus the last label)."""
    return torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).numpy()


def _rank_main(rank: int, root: str, out: str, phase: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/pg-{phase}", rank=rank, world_size=WORLD
    )
    loader = Loader(root, **OPTS)  # rank/world size from torch.distributed
    assert (loader.rank, loader.world_size) == (rank, WORLD)
    if phase == "resume":
        loader.load_state_dict(json.loads(Path(f"{out}/state-{rank}.json").read_text()))
    got = []
    for step, batch in enumerate(loader):
        total = torch.tensor([float(batch["input_ids"].sum())])
        dist.all_reduce(total)  # as DDP does every step: a rank with fewer batches would hang
        got.append(_rows(batch))
        if phase == "killed" and step + 1 == KILL_AT:
            np.save(f"{out}/killed-{rank}.npy", np.stack(got))
            Path(f"{out}/state-{rank}.json.tmp").write_text(json.dumps(loader.state_dict()))
            os.replace(f"{out}/state-{rank}.json.tmp", f"{out}/state-{rank}.json")
            time.sleep(600)  # the parent kills us here
    np.save(f"{out}/{phase}-{rank}.npy", np.stack(got))
    dist.barrier()
    dist.destroy_process_group()


def _doc_lens() -> list[int]:
    """60 synthetic documents, the last lengthened so the token count is a multiple of
    ``SAMPLE_TOKENS * 2 * WORLD * WORKERS``: whole samples, whole batches in every stream."""
    lens = synthetic_doc_lengths(60)
    unit = SAMPLE_TOKENS * OPTS["batch_size"] * WORLD * WORKERS
    lens[-1] += -sum(lens) % unit
    return lens


@pytest.mark.timeout(180)
def test_two_ranks_two_workers_kill_and_resume(tmp_path: Path) -> None:
    root, out = str(tmp_path / "ds"), str(tmp_path)
    index = write_synthetic_dataset(
        root, doc_lens=_doc_lens(), sample_tokens=SAMPLE_TOKENS, samples_per_shard=5
    )
    n_samples = index.total_tokens // SAMPLE_TOKENS
    assert n_samples * SAMPLE_TOKENS == index.total_tokens and n_samples % 8 == 0

    procs = start_ranks(_rank_main, [(r, root, out, "killed") for r in range(WORLD)])
    deadline = time.time() + 120
    while not all(os.path.exists(f"{out}/state-{r}.json") for r in range(WORLD)):
        assert time.time() < deadline and all(p.is_alive() for p in procs)
        time.sleep(0.1)
    for p in procs:
        p.kill()  # SIGKILL: no clean-up, as a crashed node
        p.join()
    run_ranks(_rank_main, (root, out, "resume"), WORLD)

    before = [np.load(f"{out}/killed-{r}.npy") for r in range(WORLD)]
    after = [np.load(f"{out}/resume-{r}.npy") for r in range(WORLD)]
    seen = [np.concatenate([before[r], after[r]]) for r in range(WORLD)]  # [batches, B, T+1]

    # Equal step counts (nobody hung): every rank ran the epoch's share of whole batches.
    steps = n_samples // (WORLD * OPTS["batch_size"])
    assert [len(s) for s in seen] == [steps] * WORLD
    assert [len(b) for b in before] == [KILL_AT] * WORLD

    rows = np.concatenate([s.reshape(-1, SAMPLE_TOKENS) for s in seen])
    # Every row is one whole sample: tokens k*25 .. k*25+24.
    keys = rows[:, 0] // SAMPLE_TOKENS
    assert np.array_equal(rows, keys[:, None] * SAMPLE_TOKENS + np.arange(SAMPLE_TOKENS))
    # No duplicate: no sample twice, across ranks, workers and the kill.
    assert len(np.unique(keys)) == len(keys)
    # No missing: with these counts the plan leaves nothing out, so every sample was read.
    assert sorted(keys.tolist()) == list(range(n_samples))

    # Exact order: each rank's batches, across the kill, are the order that (seed, rank,
    # streams) defines, as one process without workers or process group computes it.
    for r in range(WORLD):
        ref = Loader(root, **{**OPTS, "num_workers": 0}, streams=WORKERS, rank=r, world_size=WORLD)
        want = np.stack([_rows(b) for b in ref])
        assert np.array_equal(seen[r], want), f"rank {r} order"
