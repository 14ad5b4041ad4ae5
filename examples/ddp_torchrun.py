"""Data-parallel training input under torchrun: every rank reads its own part, same batch count.

    torchrun --nproc-per-node 2 examples/ddp_torchrun.py data/

Each rank builds the same ``Loader``; rank and world size come from the initialised process
group. The epoch plan is computed locally from ``index.json`` so that every rank yields
exactly ``len(loader)`` batches: the all_reduce below (what DDP does on every backward)
never waits for a rank that ran out of data.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import wdstream


def main() -> None:
    dist.init_process_group("gloo")
    loader = wdstream.Loader(sys.argv[1], seq_len=256, batch_size=4, epochs=1, num_workers=0)
    tokens_seen = torch.zeros(1, dtype=torch.int64)
    for batch in loader:
        tokens_seen += batch["input_ids"].numel()
        dist.all_reduce(tokens_seen.clone())  # stands in for DDP's gradient all_reduce
    total = tokens_seen.clone()
    dist.all_reduce(total)
    print(f"rank {dist.get_rank()}: {len(loader)} batches, {int(total)} tokens over all ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
