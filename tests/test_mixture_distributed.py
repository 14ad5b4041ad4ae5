"""A mixture under real gloo process groups: 2 ranks (rank 0 with a worker), an all_reduce
per step as DDP does, rank 0's state saved at step ``KILL_AT``, then SIGKILL. The run goes on
from that one state on 2 ranks and on 1 rank with the same global batch, across a schedule
boundary; every later step's rows and sources (all ranks, rank order) must equal the
uninterrupted run's."""

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

G = 6  # global batch: 2 x 3, 1 x 6
SCHEDULE = [(0, {"web": 0.5, "code": 0.5}), (9, {"web": 0.9, "code": 0.1})]
OPTS: dict[str, Any] = dict(
    seq_len=16, chunk_batches=2, shuffle_window=8, shuffle_lanes=2, seed=3, weights=SCHEDULE
)
KILL_AT = 5
AFTER = 8  # steps checked after the resume (cross the boundary at step 9)


def _rows(batch: dict[str, torch.Tensor]) -> np.ndarray:
    rows = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1)
    return torch.cat([rows, batch["source"][:, None]], dim=1).numpy()  # source as a column


def _rank_main(rank: int, world: int, sources: dict[str, str], out: str, phase: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/pg-{phase}", rank=rank, world_size=world
    )
    loader = Loader(sources, batch_size=G // world, num_workers=1 - rank % 2, **OPTS)
    assert (loader.rank, loader.world_size) == (rank, world)
    if phase != "killed":
        loader.load_state_dict(json.loads(Path(f"{out}/state.json").read_text()))
    got = []
    for step, batch in enumerate(loader):
        total = torch.tensor([float(batch["input_ids"].sum())])
        dist.all_reduce(total)  # a rank with fewer batches would hang here
        got.append(_rows(batch))
        if phase == "killed" and step + 1 == KILL_AT:
            if rank == 0:
                Path(f"{out}/state.tmp").write_text(json.dumps(loader.state_dict()))
                os.replace(f"{out}/state.tmp", f"{out}/state.json")
            time.sleep(600)  # the parent kills us here
        if phase != "killed" and len(got) == AFTER:
            break
    np.save(f"{out}/{phase}-{rank}.npy", np.stack(got))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(240)
def test_mixture_state_of_two_killed_ranks_continues_on_two_and_one(tmp_path: Path) -> None:
    sources = {"web": str(tmp_path / "web"), "code": str(tmp_path / "code")}
    write_synthetic_dataset(sources["web"], n_docs=20, sample_tokens=17, samples_per_shard=6)
    write_synthetic_dataset(sources["code"], n_docs=4, sample_tokens=33, seed=1)
    out = str(tmp_path)

    ranks = [(r, 2, sources, out, "killed") for r in range(2)]
    kill_ranks_after_state(_rank_main, ranks, f"{out}/state.json")

    reference = Loader(sources, batch_size=G, num_workers=0, **OPTS)
    want = []
    for batch in reference:
        want.append(_rows(batch))
        if len(want) == KILL_AT + AFTER:
            break
    assert len({int(r) for w in want for r in w[:, -1]}) == 2  # both sources appear

    for world in (2, 1):
        phase = f"resume{world}"
        run_ranks(_rank_main, (world, sources, out, phase), world)
        parts = [np.load(f"{out}/{phase}-{r}.npy") for r in range(world)]
        assert [len(p) for p in parts] == [AFTER] * world
        for j in range(AFTER):
            step_rows = np.concatenate([p[j] for p in parts])
            assert np.array_equal(step_rows, want[KILL_AT + j]), f"W={world}, step {KILL_AT + j}"
