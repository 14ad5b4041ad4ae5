"""Real 2-rank gloo run: 2 ranks x 2 workers, an all_reduce per step, a kill and a resume."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

WORLD = 2
OPTS = dict(
    seq_len=24,
    batch_size=2,
    num_workers=2,
    epochs=1,
    chunk_batches=3,
    shuffle_window=8,
    shuffle_lanes=3,
    seed=7,
)
KILL_AT = 11


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
        x = batch["input_ids"]
        total = torch.tensor([float(x.sum())])
        dist.all_reduce(total)  # as DDP does every step: a rank with fewer batches would hang
        got.append(torch.cat([x, batch["labels"][:, -1:]], dim=1).numpy())
        if phase == "killed" and step + 1 == KILL_AT:
            Path(f"{out}/state-{rank}.json.tmp").write_text(json.dumps(loader.state_dict()))
            os.replace(f"{out}/state-{rank}.json.tmp", f"{out}/state-{rank}.json")
            time.sleep(600)  # the parent kills us here
    np.save(f"{out}/{phase}-{rank}.npy", np.stack(got))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_two_ranks_two_workers_kill_and_resume(tmp_path: Path) -> None:
    root, out = str(tmp_path / "ds"), str(tmp_path)
    index = write_synthetic_dataset(root, n_docs=60, sample_tokens=25, samples_per_shard=5)
    mp.spawn(_rank_main, args=(root, out, "full"), nprocs=WORLD, join=True)
    full = [np.load(f"{out}/full-{r}.npy") for r in range(WORLD)]
    assert len(full[0]) == len(full[1]) > KILL_AT  # equal batch counts: nobody hung
    toks = np.concatenate([f.ravel() for f in full])
    assert len(np.unique(toks)) == len(toks)  # no duplicate across ranks and workers
    missing = index.total_tokens - len(toks)
    assert 0 <= missing < WORLD * 2 * (OPTS["batch_size"] * 25 + 2 * 25)  # bounded remainder

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, root, out, "killed")) for r in range(WORLD)]
    for p in procs:
        p.start()
    deadline = time.time() + 120
    while not all(os.path.exists(f"{out}/state-{r}.json") for r in range(WORLD)):
        assert time.time() < deadline and all(p.is_alive() for p in procs)
        time.sleep(0.1)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.join()

    mp.spawn(_rank_main, args=(root, out, "resume"), nprocs=WORLD, join=True)
    for r in range(WORLD):
        rest = np.load(f"{out}/resume-{r}.npy")
        # exact order: the resumed run delivers exactly the uninterrupted run's remaining batches
        assert np.array_equal(rest, full[r][KILL_AT:])
