"""Elastic resume under real gloo process groups (``order="global"``).

A 2-rank run (2 workers each, an all_reduce per step as DDP does) saves rank 0's state at
step ``KILL_AT`` and is SIGKILLed. The run then continues from that one state on 1 rank and on
4 ranks with the same global batch. For every later step, the rows of all ranks together
(in rank order) must equal the rows of that step in the uninterrupted 2-rank run.
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

from tests.processes import kill_ranks_after_state, run_ranks
from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

G = 8  # global batch: 2 x 4, 1 x 8, 4 x 2
OPTS: dict[str, Any] = dict(
    seq_len=20, chunk_batches=3, shuffle_window=8, shuffle_lanes=3, seed=11, order="global"
)
KILL_AT = 7
AFTER = 12  # steps checked after the resume (crosses the epoch end)


def _rows(batch: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).numpy()


def _rank_main(rank: int, world: int, root: str, out: str, phase: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/pg-{phase}", rank=rank, world_size=world
    )
    workers = 2 if world == 2 else rank % 2
    loader = Loader(root, batch_size=G // world, num_workers=workers, **OPTS)
    assert (loader.rank, loader.world_size) == (rank, world)  # from torch.distributed
    if phase != "killed":
        loader.load_state_dict(json.loads(Path(f"{out}/state.json").read_text()))
    got = []
    for step, batch in enumerate(loader):
        total = torch.tensor([float(batch["input_ids"].sum())])
        dist.all_reduce(total)  # a rank with fewer batches would hang here
        got.append(_rows(batch))
        if phase == "killed" and step + 1 == KILL_AT and rank == 0:
            Path(f"{out}/state.tmp").write_text(json.dumps(loader.state_dict()))
            os.replace(f"{out}/state.tmp", f"{out}/state.json")
        if phase == "killed" and step + 1 == KILL_AT:
            time.sleep(600)  # the parent kills us here
        if phase != "killed" and len(got) == AFTER:
            break
    np.save(f"{out}/{phase}-{rank}.npy", np.stack(got))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_state_of_two_ranks_continues_on_one_and_on_four(tmp_path: Path) -> None:
    root, out = str(tmp_path / "ds"), str(tmp_path)
    write_synthetic_dataset(root, n_docs=16, sample_tokens=21, samples_per_shard=6)
    steps_per_epoch = len(Loader(root, batch_size=G, num_workers=0, **OPTS))
    assert KILL_AT < steps_per_epoch < KILL_AT + AFTER  # the checked steps cross an epoch

    ranks = [(r, 2, root, out, "killed") for r in range(2)]
    kill_ranks_after_state(_rank_main, ranks, f"{out}/state.json")

    # The uninterrupted 2-rank run, step by step (each rank's reader alone computes it).
    full = []
    for r in range(2):
        ld = Loader(root, batch_size=G // 2, rank=r, world_size=2, num_workers=0, **OPTS)
        it = iter(ld)
        full.append([_rows(next(it)) for _ in range(KILL_AT + AFTER)])
    want = [np.concatenate([full[0][k], full[1][k]]) for k in range(KILL_AT + AFTER)]

    for world in (1, 4):
        phase = f"resume{world}"
        run_ranks(_rank_main, (world, root, out, phase), world)
        parts = [np.load(f"{out}/{phase}-{r}.npy") for r in range(world)]
        assert [len(p) for p in parts] == [AFTER] * world
        for j in range(AFTER):
            step_rows = np.concatenate([p[j] for p in parts])
            assert np.array_equal(step_rows, want[KILL_AT + j]), f"W={world}, step {KILL_AT + j}"
