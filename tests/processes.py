"""Real rank processes for the distributed tests: start them, SIGKILL them once they saved.

Ranks start from Python's fork server (:data:`START`), which :func:`start_rank_server`
starts with torch, wdstream and the rank tests' modules already imported: a spawned rank
imported them itself, ~2 s of CPU each (22 ranks in the suite), and so did each of their
loader workers (spawned too: a spawned process's start method is "spawn"). Each rank is
still a process of its own (forked from the server, not from pytest) in a real gloo group.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import time
from collections.abc import Callable
from typing import Any

# How :func:`start_ranks` and :func:`run_ranks` start the ranks.
START = "forkserver"

# The modules whose ``_rank_main`` the ranks run (a rank imports its target's module).
RANK_MODULES = (
    "tests.test_distributed",
    "tests.test_elastic_distributed",
    "tests.test_mesh",
    "tests.test_mixture_distributed",
    "tests.test_quarantine",
)


def start_rank_server() -> None:
    """Start this process's fork server, importing torch, its process groups and device
    mesh, wdstream (with the token pool's module, which the pack's workers also fork from
    this server) and :data:`RANK_MODULES` once; a server already running is kept.

    Call it before any pack with worker processes starts the server with its own, shorter
    list (conftest does, at collection).
    """
    multiprocessing.set_forkserver_preload(
        ["torch", "torch.distributed", "torch.distributed.device_mesh", "numpy", "wdstream",
         "wdstream.write.tokenpool", *RANK_MODULES]
    )  # fmt: skip
    multiprocessing.forkserver.ensure_running()


def _fresh_rank(first: Any, target: Callable[..., None], *rest: Any) -> None:
    """Run ``target(first, *rest)`` in a rank with the start method of a fresh process (the
    platform's default, "fork" on Linux before Python 3.14, as under torchrun), not the one
    the rank was started with: a rank's loader workers are its own children, as a spawned
    rank's were (not children of the rank's own fork server, which outlive a killed rank)."""
    multiprocessing.set_start_method(multiprocessing.get_all_start_methods()[0], force=True)
    target(first, *rest)


def run_ranks(target: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """``target(rank, *args)`` in ``nprocs`` rank processes from the fork server, joined
    (``torch.multiprocessing.start_processes``: a rank's exception fails the caller)."""
    import torch.multiprocessing as mp

    mp.start_processes(_fresh_rank, args=(target, *args), nprocs=nprocs, start_method=START)


def start_ranks(
    target: Callable[..., None], args: list[tuple[Any, ...]]
) -> list[multiprocessing.process.BaseProcess]:
    """One started rank process per ``args`` entry, running ``target(*args[r])``."""
    ctx = multiprocessing.get_context(START)
    procs = [ctx.Process(target=_fresh_rank, args=(a[0], target, *a[1:])) for a in args]
    for p in procs:
        p.start()
    return procs


def kill_ranks_after_state(
    target: Callable[..., None], args: list[tuple[Any, ...]], state_path: str, timeout: float = 150
) -> None:
    """Spawn one process per ``args`` entry running ``target(*args[r])``; once ``state_path``
    exists (a rank saved its state), SIGKILL them all, as a lost node would be lost."""
    procs = start_ranks(target, args)
    deadline = time.time() + timeout
    while not os.path.exists(state_path):
        assert time.time() < deadline and all(p.is_alive() for p in procs)
        time.sleep(0.1)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
