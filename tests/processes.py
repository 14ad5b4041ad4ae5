"""Real rank processes for the distributed tests: start them, SIGKILL them once they saved."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def kill_ranks_after_state(
    target: Callable[..., None], args: list[tuple[Any, ...]], state_path: str, timeout: float = 150
) -> None:
    """Spawn one process per ``args`` entry running ``target(*args[r])``; once ``state_path``
    exists (a rank saved its state), SIGKILL them all, as a lost node would be lost."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=a) for a in args]
    for p in procs:
        p.start()
    deadline = time.time() + timeout
    while not os.path.exists(state_path):
        assert time.time() < deadline and all(p.is_alive() for p in procs)
        time.sleep(0.1)
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
