"""Data-parallel training input under torchrun: every rank reads its own part, same batch count.

    torchrun --nproc-per-node 2 examples/ddp_torchrun.py data/
    torchrun --nproc-per-node 2 examples/ddp_torchrun.py data/ --seq-len 64 --record out/

Each rank builds the same ``Loader``; rank and world size come from the initialised process
group. The epoch plan is computed locally from ``index.json`` so that every rank yields
exactly ``len(loader)`` batches: the all_reduce every step below (what DDP does on every
backward) never waits for a rank that ran out of data.

``--record DIR`` writes ``DIR/rank-R.json`` per rank: its step count, every rank's step count
as gathered from the others, and the sha256 of every row it read. ``tests/test_ddp_example.py``
runs this file under ``torch.distributed.run`` and checks from those records that the ranks
ran the same number of steps and read disjoint rows that together cover the dataset.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os

import torch
import torch.distributed as dist

import wdstream


def row_hashes(batch: dict[str, torch.Tensor]) -> list[str]:
    """sha256 of each row's ``seq_len + 1`` tokens (inputs plus the last label), int64 LE."""
    rows = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).to(torch.int64)
    return [hashlib.sha256(r.numpy().astype("<i8").tobytes()).hexdigest() for r in rows]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="packed dataset: folder, s3:// or http(s):// URL")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many (0: epochs)")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="gloo", help="torch.distributed backend")
    parser.add_argument("--record", help="folder for one JSON record per rank")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = wdstream.Loader(
        args.data,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        epochs=args.epochs,
        seed=args.seed,
        num_workers=args.workers,
    )
    batches = itertools.islice(loader, args.steps) if args.steps else loader
    steps, tokens, rows = 0, 0, []
    for batch in batches:
        # Stands in for DDP's gradient all_reduce: it returns only when every rank has
        # reached this step, so a rank with fewer batches would hang the others here.
        present = torch.ones(1)
        dist.all_reduce(present)
        assert int(present) == world, f"rank {rank}: {int(present)} ranks at step {steps}"
        steps += 1
        tokens += batch["input_ids"].numel()
        if args.record:
            rows.append(row_hashes(batch))
    total = torch.tensor([tokens], dtype=torch.int64)
    dist.all_reduce(total)
    step_counts: list[int | None] = [None] * world
    dist.all_gather_object(step_counts, steps)
    print(
        f"rank {rank}: {steps} steps ({len(loader)} batches per epoch), "
        f"{int(total)} tokens over all ranks, steps per rank {step_counts}",
        flush=True,
    )
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        record = {
            "rank": rank,
            "world_size": world,
            "batches_per_epoch": len(loader),
            "steps": steps,
            "step_counts": step_counts,
            "tokens_all_ranks": int(total),
            "rows": rows,
        }
        with open(os.path.join(args.record, f"rank-{rank}.json"), "w") as f:
            json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
