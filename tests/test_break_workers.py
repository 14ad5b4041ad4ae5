"""A ``break`` while a torch worker is blocked in a stalled read of its own chunk: the
training process's leaving reaches the worker's waiting reads through the loader's hand-off
(``WorkerHandoff.leave`` / ``left``, looked at by ``fetches.ReadStop``), so the worker ends
its chunk at once and takes torch's end, instead of being killed at torch's 5 s join after
the read's timeout (10.0 s at 2 workers before); persistent workers start the next
iteration clean.

Real components: the repo's HTTP file server, made to cut every GET after 300 bytes and then
go silent once the first batches are out; torch workers (fork, and spawn). Oracle: the same
loader over the local pack with the same break.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import FileServer
from tests.test_break_reads import KW, PACK_ARGS, STALL, _leave, _rows, _until_a_get_stalls
from wdstream import Loader
from wdstream.read.order.read_ahead import AHEAD_MAX
from wdstream.read.sources.fetches import DROPPED_MAX, REMOTE_READS

pytestmark = pytest.mark.timeout(240)

TIMEOUT = 10.0  # the store's read timeout; with retries=1 a stalled read holds 20 s
TORCH_THREADS = 8  # a worker's own threads besides the reader's (queue feeders, ...)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import pack_cli_corpus

    return pack_cli_corpus(tmp_path_factory.mktemp("brkw"), PACK_ARGS)


def _torch_workers(it: Iterator[Any]) -> list[Any]:
    """The worker processes of a Loader iterator's torch iterator (the local ``running``
    of ``TorchWorkers.chunks``, found down the generators' ``yield from`` chain)."""
    gen: Any = it
    while gen is not None:
        frame = gen.gi_frame
        if frame is not None:
            for value in frame.f_locals.values():
                if hasattr(value, "gi_frame") and value.gi_frame is not None:
                    running = value.gi_frame.f_locals.get("running")
                    if running is not None:
                        return list(running._workers)
        gen = gen.gi_yieldfrom
    raise AssertionError("no torch iterator under this Loader iterator")


def _tasks(pid: int) -> int:
    """Threads of process ``pid``."""
    return len(os.listdir(f"/proc/{pid}/task"))


def _run(root: str, persistent: bool, context: str, server: FileServer | None) -> dict[str, Any]:
    """Batches up to a break (over a stalled GET when ``server``), the break's time, the
    workers' fate, and the next iteration's batches."""
    opts: dict[str, Any] = {"timeout": TIMEOUT, "retries": 1, "backoff": 0.001} if server else {}
    loader = Loader(root, num_workers=2, persistent_workers=persistent,
                    multiprocessing_context=context, **opts, **KW)  # fmt: skip
    it = iter(loader)
    first = [_rows(next(it)) for _ in range(4)]
    if server is not None:
        server.faults.reset(**STALL)
        first += _until_a_get_stalls(it, server)
    workers = _torch_workers(it)
    took = _leave(it)
    if server is not None:
        server.faults.reset()
    for w in workers:
        if not persistent:
            w.join(timeout=10)
    codes = [w.exitcode for w in workers]
    t0 = time.perf_counter()
    it = iter(loader)
    again = [_rows(next(it))]
    wait = time.perf_counter() - t0  # the next iteration's first batch
    again += [_rows(b) for b in it]
    tasks = [_tasks(w.pid) for w in workers if w.is_alive()]
    return {"first": first, "took": took, "codes": codes, "again": again, "tasks": tasks,
            "wait": wait}  # fmt: skip


@pytest.mark.parametrize(
    ("persistent", "context"), [(False, "fork"), (True, "fork"), (True, "spawn")]
)
def test_a_break_over_a_workers_stalled_read_leaves_at_once(
    pack: Path, persistent: bool, context: str
) -> None:
    """At 2 workers, every GET stalled at the break (cut after 300 bytes, then silent; read
    timeout 10 s, one retry): leaving the loop takes well under torch's 5 s join (10.0 s
    before: both workers were killed), no worker is killed (those that end exit 0;
    persistent ones live on), a persistent worker's threads stay within the reader's bound,
    and the next iteration, after the server heals, equals the local pack's with the same
    break."""
    _check_break(pack, persistent, context)


@pytest.fixture(scope="module")
def docs_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import pack_docs_corpus

    return Path(pack_docs_corpus(tmp_path_factory.mktemp("brkwd"), 400, 3, 20))


@pytest.mark.parametrize("persistent", [False, True])
def test_a_break_over_a_stalled_sidecar_read_leaves_at_once(
    docs_pack: Path, persistent: bool
) -> None:
    """The same over a docs-mode pack (samples of varied length): a window's metadata needs
    its shards' sidecars (token counts), read in the worker's own thread as it picks the
    windows to read ahead, outside the window reads' stop. The sidecar read takes the
    hand-off's word too (``ShardSidecars.stop_when``): before, the break waited 5-10 s
    (torch's join, the worker killed) without persistent workers, and with them the next
    iteration's first batch waited ~10 s for the worker still in the stalled read."""
    _check_break(docs_pack, persistent, "fork")


def _check_break(pack: Path, persistent: bool, context: str) -> None:
    """:func:`_run` over ``pack`` served with the stall, against the local pack."""
    with FileServer(pack) as server:
        got = _run(server.base_url, persistent, context, server)
    n = len(got["first"])
    want = _run(str(pack), persistent, context, None) if n == 4 else None
    if want is None:  # the stall came later: the local loader breaks at the same batch
        loader = Loader(str(pack), num_workers=2, persistent_workers=persistent,
                        multiprocessing_context=context, **KW)  # fmt: skip
        it = iter(loader)
        want = {"first": [_rows(next(it)) for _ in range(n)]}
        _leave(it)
        want["again"] = [_rows(b) for b in loader]
    assert got["took"] < 2.0, f"the break took {got['took']:.2f}s"
    assert got["wait"] < 4.0, f"the next iteration's first batch took {got['wait']:.2f}s"
    if persistent:
        assert got["codes"] == [None, None], got["codes"]  # alive: not killed
        bound = TORCH_THREADS + (1 + DROPPED_MAX) * REMOTE_READS + AHEAD_MAX
        assert max(got["tasks"]) <= bound, (got["tasks"], bound)
    else:
        assert got["codes"] == [0, 0], got["codes"]  # ended, not terminated (-15)
    assert got["first"] == want["first"]
    assert got["again"] == want["again"]


def test_a_later_iteration_is_not_stopped_by_an_earlier_break(pack: Path) -> None:
    """Persistent workers, three iterations over a healthy server, each broken after a few
    batches, then one run to its end: each left at once and the last one equals the local
    pack's with the same breaks (a stop of an earlier iteration, still set, reaches none of
    the later iterations' reads: an iteration stopped at its start would end empty)."""

    def cycles(root: str) -> tuple[list[list[list[int]]], float]:
        loader = Loader(root, num_workers=2, persistent_workers=True, **KW)
        rows, slowest = [], 0.0
        for k in range(3):
            it = iter(loader)
            rows += [_rows(next(it)) for _ in range(3 + k)]
            slowest = max(slowest, _leave(it))
            time.sleep(0.05)
        rows += [_rows(b) for b in loader]
        return rows, slowest

    with FileServer(pack) as server:
        got, slowest = cycles(server.base_url)
    want, _ = cycles(str(pack))
    assert slowest < 2.0, slowest
    assert len(got) > 20 and got == want
