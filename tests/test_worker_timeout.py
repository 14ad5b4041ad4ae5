"""A Loader's ``worker_timeout``: a stopped torch worker is a clear error, not a hang.

Oracles outside the code under test: the uninterrupted run without workers (its batches),
the test process's live children (``multiprocessing.active_children``) and ``/proc`` (the
stopped worker's state), and time. A worker stopped with SIGSTOP mid-epoch (as a debugger,
a cgroup freeze or a swapped-out node leaves it) made the loader wait forever: with
``worker_timeout`` it raises :class:`~wdstream.WorkerTimeoutError` naming the worker and its
state, leaves no worker behind (a stopped process never takes torch's SIGTERM), and the
next ``iter()`` gives exactly the uninterrupted run's batches after the last one handed out.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
import torch

from wdstream import Loader, WorkerTimeoutError
from wdstream.read.torch import handoff
from wdstream.testing import write_synthetic_dataset

OPTS = dict(seq_len=16, batch_size=6, seed=7, chunk_batches=2, shuffle_window=70,
            shuffle_lanes=3, epochs=1, prefetch_factor=1)  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("data"))
    write_synthetic_dataset(d, n_docs=400, sample_tokens=17, samples_per_shard=20)
    return d


@pytest.fixture(scope="module")
def clean(root: str) -> list[torch.Tensor]:
    """The uninterrupted run's input_ids (one epoch)."""
    loader = Loader(root, num_workers=0, **OPTS)  # type: ignore[arg-type]
    return [b["input_ids"].clone() for b in loader]


@pytest.mark.parametrize("persistent", [False, True])
def test_a_stopped_worker_times_out_and_the_next_iter_resumes(
    root: str, clean: list[torch.Tensor], persistent: bool
) -> None:
    before = set(mp.active_children())
    loader = Loader(root, num_workers=2, worker_timeout=2, persistent_workers=persistent, **OPTS)  # type: ignore[arg-type]
    got, stopped = [], 0
    t = 0.0
    with pytest.raises(WorkerTimeoutError) as info:
        for i, b in enumerate(loader):
            got.append(b["input_ids"].clone())
            if i == 3:
                stopped = min(p.pid for p in set(mp.active_children()) - before if p.pid)
                os.kill(stopped, signal.SIGSTOP)
                t = time.monotonic()
    waited = time.monotonic() - t
    assert 0 < len(got) < len(clean) - 4, "the stopped worker's turn never came"
    assert f"{stopped}: stopped" in str(info.value) and "2 s" in str(info.value)
    assert "start-up" not in str(info.value)  # chunks had come from the workers
    assert waited < 15, f"the timeout took {waited:.1f} s"
    assert set(mp.active_children()) <= before  # the stopped worker was killed, not left
    rest = [b["input_ids"].clone() for b in loader]
    assert len(got) + len(rest) == len(clean)
    assert all(torch.equal(a, b) for a, b in zip(got + rest, clean, strict=True))


def test_a_timeout_does_not_change_a_healthy_epoch(root: str, clean: list[torch.Tensor]) -> None:
    loader = Loader(root, num_workers=2, worker_timeout=30, **OPTS)  # type: ignore[arg-type]
    got = [b["input_ids"].clone() for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(got, clean, strict=True))


@pytest.mark.parametrize(
    "value, error",
    [("5", TypeError), (None, TypeError), (True, TypeError), (-1, ValueError),
     (-0.5, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
     (1e308, ValueError), (2**31, ValueError), (10**400, ValueError)],
)  # fmt: skip
def test_a_timeout_that_is_no_wait_is_refused_before_any_worker(
    root: str, value: object, error: type[Exception]
) -> None:
    """Before, torch checked it only as the workers started, after the first batch (made
    here) was handed out: a str or a negative value raised then, inf and 1e308 raised an
    OverflowError at the first wait, NaN waited forever, None broke the error path."""
    before = set(mp.active_children())
    for workers in (0, 2):
        with pytest.raises(error, match="worker_timeout"):
            Loader(root, num_workers=workers, worker_timeout=value, **OPTS)  # type: ignore[arg-type]
    assert set(mp.active_children()) <= before


def test_a_workers_own_timed_out_error_is_not_the_loaders_timeout(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's RuntimeError that says "timed out" (a socket's, a lock's) comes back as
    itself, not as a WorkerTimeoutError claiming no chunk came for ``timeout`` seconds."""
    take = handoff.RingBuffers.take

    def failing(self: handoff.RingBuffers, i: int, rows: int) -> object:
        if i == 1:  # (forked workers inherit the patch; the first chunk is made here)
            raise RuntimeError("read of shard 3 timed out")
        return take(self, i, rows)

    monkeypatch.setattr(handoff.RingBuffers, "take", failing)
    before = set(mp.active_children())
    loader = Loader(root, num_workers=2, worker_timeout=30, multiprocessing_context="fork", **OPTS)  # type: ignore[arg-type]
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="read of shard 3 timed out") as info:
        for _ in loader:
            pass
    assert not isinstance(info.value, WorkerTimeoutError)
    assert time.monotonic() - t < 20
    deadline = time.monotonic() + 5
    while set(mp.active_children()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(mp.active_children()) <= before


def test_a_persistent_worker_stopped_between_iterations_times_out_at_iter(
    root: str, clean: list[torch.Tensor]
) -> None:
    """Persistent workers, one stopped after a ``break``: torch's reset at the next
    ``iter()`` waits for every worker, and timed out there with its own RuntimeError, after
    a 5 s join per worker, the stopped worker left alive (a SIGTERM it never takes)."""
    before = set(mp.active_children())
    loader = Loader(root, num_workers=2, worker_timeout=2, persistent_workers=True, **OPTS)  # type: ignore[arg-type]
    got = []
    for i, b in enumerate(loader):
        got.append(b["input_ids"].clone())
        if i == 3:
            break
    stopped = min(p.pid for p in set(mp.active_children()) - before if p.pid)
    os.kill(stopped, signal.SIGSTOP)
    t = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=f"{stopped}: stopped"):
        for b in loader:
            got.append(b["input_ids"].clone())
    assert time.monotonic() - t < 6, "the timeout waited on torch's joins"
    assert set(mp.active_children()) <= before
    rest = [b["input_ids"].clone() for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(got + rest, clean, strict=True))


def test_a_timeout_before_any_workers_chunk_says_it_covers_start_up(
    root: str, clean: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers that never sent a chunk (hung here in a sleep; spawned workers importing
    torch take 3-5 s on a busy host) are named as starting: the timeout covers start-up.
    Workers that did send one are not (the caller's timeout is then about a chunk)."""
    take = handoff.RingBuffers.take

    def hung(self: handoff.RingBuffers, i: int, rows: int) -> object:
        time.sleep(600)
        return take(self, i, rows)

    monkeypatch.setattr(handoff.RingBuffers, "take", hung)
    before = set(mp.active_children())
    loader = Loader(root, num_workers=2, worker_timeout=1, multiprocessing_context="fork", **OPTS)  # type: ignore[arg-type]
    got = []
    with pytest.raises(WorkerTimeoutError, match="start-up") as info:
        for b in loader:
            got.append(b["input_ids"].clone())
    assert "sleeping" in str(info.value) and len(got) == 1  # the first step, made here
    assert set(mp.active_children()) <= before
    monkeypatch.setattr(handoff.RingBuffers, "take", take)
    rest = [b["input_ids"].clone() for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(got + rest, clean, strict=True))
