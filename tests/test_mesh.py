"""Tensor parallelism: 4 real gloo ranks as a 2 (dp) x 2 (tp) ``DeviceMesh``.

``Loader(mesh=device_mesh["dp"])`` takes the data-parallel coordinates from the mesh, so
both tensor-parallel ranks of a data-parallel rank get identical batches and the two
data-parallel ranks disjoint ones. The oracle is independent of the mesh: one process
reading the same data with one rank and the global batch (``2 x batch_size``), whose rows
are split between the data-parallel ranks in order (the global order's promise). Each rank
saves its state after ``SAVE_AT`` steps and a fresh loader per rank resumes from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.processes import run_ranks
from wdstream import Loader
from wdstream.testing import synthetic_doc_lengths, write_synthetic_dataset

DP, TP = 2, 2
SAMPLE_TOKENS = 17
OPTS: dict[str, Any] = dict(seq_len=SAMPLE_TOKENS - 1, batch_size=3, num_workers=1, epochs=1,
                            seed=5, order="global", shuffle_window=8)  # fmt: skip
SAVE_AT = 4


def _rows(batch: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).numpy()


def _rank_main(rank: int, root: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=rank,
                            world_size=DP * TP)  # fmt: skip
    mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
    loader = Loader(root, mesh=mesh["dp"], **OPTS)
    got, state = [], None
    for step, batch in enumerate(loader):
        got.append(_rows(batch))
        if step + 1 == SAVE_AT:
            state = json.loads(json.dumps(loader.state_dict()))
    resumed = Loader(root, mesh=mesh["dp"], **OPTS)
    resumed.load_state_dict(state)
    after = [_rows(b) for b in resumed]
    np.save(f"{out}/rank-{rank}.npy", np.stack(got))
    np.save(f"{out}/resumed-{rank}.npy", np.stack(after))
    coords = (
        loader.rank,
        loader.world_size,
        mesh["dp"].get_local_rank(),
        mesh["tp"].get_local_rank(),
    )
    Path(f"{out}/coords-{rank}.json").write_text(json.dumps(coords))
    dist.barrier()
    dist.destroy_process_group()


def test_tensor_parallel_ranks_share_batches_data_parallel_ranks_split_them(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "data")
    lens = synthetic_doc_lengths(50)
    lens[-1] += -sum(lens) % (SAMPLE_TOKENS * OPTS["batch_size"] * DP)
    write_synthetic_dataset(root, doc_lens=lens, sample_tokens=SAMPLE_TOKENS, samples_per_shard=5)
    out = tmp_path / "out"
    out.mkdir()
    run_ranks(_rank_main, (root, str(out)), DP * TP)
    one = Loader(root, **{**OPTS, "batch_size": OPTS["batch_size"] * DP, "num_workers": 0},
                 rank=0, world_size=1)  # fmt: skip
    oracle = np.stack([_rows(b) for b in one])  # [steps, DP * batch, row]
    b = OPTS["batch_size"]
    got = {r: np.load(out / f"rank-{r}.npy") for r in range(DP * TP)}
    for r in range(DP * TP):
        dp, world, mesh_dp, tp = json.loads((out / f"coords-{r}.json").read_text())
        assert (dp, world) == (mesh_dp, DP)
        want = oracle[:, dp * b : (dp + 1) * b]
        assert got[r].shape == want.shape and (got[r] == want).all(), (r, dp, tp)
        assert (np.load(out / f"resumed-{r}.npy") == want[SAVE_AT:]).all(), r
    # tp ranks of a dp rank: identical; dp ranks: disjoint rows (token t is the integer t)
    assert (got[0] == got[1]).all() and (got[2] == got[3]).all()
    first = {tuple(row) for step in got[0] for row in step}
    second = {tuple(row) for step in got[2] for row in step}
    assert not first & second


def test_mesh_must_be_one_dimension_and_not_beside_rank(tmp_path: Path) -> None:
    root = str(tmp_path / "data")
    write_synthetic_dataset(root, doc_lens=[40] * 20, sample_tokens=SAMPLE_TOKENS)

    class TwoD:
        ndim = 2

        def get_local_rank(self) -> int:
            return 0

    with pytest.raises(ValueError, match=r"mesh=device_mesh\['dp'\]"):
        Loader(root, mesh=TwoD(), **OPTS)
    with pytest.raises(ValueError, match="not both"):
        Loader(root, mesh=TwoD(), rank=0, **OPTS)


def test_a_global_batch_too_large_names_the_mesh_option(tmp_path: Path) -> None:
    root = str(tmp_path / "data")
    write_synthetic_dataset(root, doc_lens=[40] * 5, sample_tokens=SAMPLE_TOKENS)
    with pytest.raises(ValueError, match=r"mesh=device_mesh\['dp'\]"):
        Loader(root, rank=0, world_size=64, **OPTS)
