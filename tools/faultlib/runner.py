"""Each attempt in a forked child with a time limit."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

from faultlib.common import Attempt


def _child(attempt: Attempt, conn: object) -> None:
    os.setpgid(0, 0)  # its own process group: a hang takes the commands it started with it
    try:
        outcome = attempt()
    except Exception as exc:  # noqa: BLE001 - classify, never propagate
        outcome = f"crash: {type(exc).__name__}: {exc}"[:300]
    conn.send(outcome)  # type: ignore[attr-defined]


def run_attempt(attempt: Attempt, timeout: float) -> str:
    """Run one attempt in a forked child; a child still running at ``timeout`` is a hang."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(attempt, child))
    proc.start()
    child.close()
    if parent.poll(timeout):
        outcome = parent.recv()
        proc.join(10)
        return outcome
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and every command it started
    except ProcessLookupError:  # not yet in its own group
        proc.kill()
    proc.join()
    return "hang"
