"""A Loader's torch workers after an error: ended at once, replaced at the next ``iter()``.

Oracles outside the code under test: the uninterrupted run without workers (its batches),
the test process's live children (``multiprocessing.active_children``), and time. A worker's
error, a worker killed, or a ``KeyboardInterrupt`` while the loader waits must leave no
worker alive while the caller still holds the traceback, and the next ``iter()`` must give
exactly the batches the uninterrupted run gives from the last one handed out, with
persistent workers too (torch's ``DataLoader`` would otherwise hand the next ``iter()`` the
same iterator, with its dead worker). A Loader with persistent workers that ends up in a
reference cycle is ended without torch's 5 s wait for each worker.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from wdstream import CorruptShardError, Loader
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.torch import handoff
from wdstream.testing import write_synthetic_dataset

OPTS = dict(seq_len=16, batch_size=6, seed=7, chunk_batches=2, shuffle_window=70,
            shuffle_lanes=3, epochs=1)  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("data"))
    write_synthetic_dataset(d, n_docs=60, sample_tokens=17, samples_per_shard=7)
    return d


@pytest.fixture(scope="module")
def clean(root: str) -> list[torch.Tensor]:
    """The uninterrupted run's input_ids, two epochs (each ``iter()`` runs one)."""
    loader = Loader(root, num_workers=0, **OPTS)  # type: ignore[arg-type]
    return [b["input_ids"].clone() for _ in range(2) for b in loader]


def _children() -> set[mp.process.BaseProcess]:
    return set(mp.active_children())


def _same(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=False))


def test_a_workers_error_ends_persistent_workers_and_the_next_iter_resumes(
    root: str, clean: list[torch.Tensor], tmp_path: Path
) -> None:
    """A flipped token byte mid-epoch: refused naming shard and byte, no worker left while
    the traceback is held; the byte restored, the next ``iter()`` gives the rest exactly."""
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    n = len(clean) // 2
    j = int(clean[n // 2][0, 0]) // 17  # the sample of a mid-epoch batch's first row
    name, k = f"data-{j // 7:06d}", j % 7
    offset = int(ShardSidecar.from_bytes((copy / f"{name}.idx").read_bytes()).offsets[k])
    good = (copy / f"{name}.tar").read_bytes()
    bad = bytearray(good)
    bad[offset + 20] ^= 0x10
    (copy / f"{name}.tar").write_bytes(bytes(bad))
    before = _children()
    loader = Loader(str(copy), num_workers=2, persistent_workers=True, **OPTS)  # type: ignore[arg-type]
    got = []
    with pytest.raises(CorruptShardError) as info:
        for b in loader:
            got.append(b["input_ids"].clone())
    assert f"{name}.tar" in str(info.value) and f"at byte {offset}" in str(info.value)
    assert _children() <= before  # ended with the error, the traceback still held
    with open(copy / f"{name}.tar", "r+b") as f:  # fixed in place
        f.write(good)
    rest = [b["input_ids"].clone() for b in loader]
    assert _same(got + rest, clean[:n])


def test_a_killed_persistent_worker_is_an_error_and_the_next_iter_resumes(
    root: str, clean: list[torch.Tensor]
) -> None:
    """A persistent worker SIGKILLed mid-epoch: torch's error, no worker left; the next
    ``iter()`` starts new workers from the last batch handed out (torch's DataLoader gave it
    the same iterator, which raised the same error again)."""
    n = len(clean) // 2
    before = _children()
    loader = Loader(root, num_workers=2, persistent_workers=True, **OPTS)  # type: ignore[arg-type]
    got = []
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        for i, b in enumerate(loader):
            got.append(b["input_ids"].clone())
            if i == 5:
                os.kill(max(p.pid for p in _children() - before if p.pid), signal.SIGKILL)
                time.sleep(0.2)
    assert _children() <= before
    rest = [b["input_ids"].clone() for b in loader]
    assert _same(got + rest, clean[:n])


def test_a_persistent_worker_killed_between_iterations_is_replaced(
    root: str, clean: list[torch.Tensor]
) -> None:
    """A persistent worker killed while idle (between two ``iter()``): the next ``iter()``
    starts new workers and gives the next epoch exactly."""
    before = _children()
    loader = Loader(root, num_workers=2, persistent_workers=True, **OPTS)  # type: ignore[arg-type]
    first = [b["input_ids"].clone() for b in loader]
    try:  # torch's SIGCHLD handler may raise here, as the worker dies
        os.kill(max(p.pid for p in _children() - before if p.pid), signal.SIGKILL)
        time.sleep(0.3)
    except RuntimeError:
        pass
    second = [b["input_ids"].clone() for b in loader]
    assert _same(first + second, clean)


def test_a_keyboard_interrupt_while_waiting_ends_the_workers(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``KeyboardInterrupt`` raised while the loader takes a worker's chunk ends the
    workers as an error does (not left to the garbage collector: 5 s each)."""
    resolve, calls = handoff.WorkerHandoff.resolve, []

    def interrupted(self: handoff.WorkerHandoff, ref: object) -> object:
        calls.append(ref)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return resolve(self, ref)

    monkeypatch.setattr(handoff.WorkerHandoff, "resolve", interrupted)
    before = _children()
    loader = Loader(root, num_workers=2, **OPTS)  # type: ignore[arg-type]
    held = None
    try:
        for _ in loader:
            pass
    except KeyboardInterrupt as exc:
        held = exc  # the caller keeps the error (and its traceback)
    assert held is not None
    time.sleep(0.3)
    assert _children() <= before


def test_persistent_workers_in_a_reference_cycle_end_promptly(root: str) -> None:
    """A Loader with persistent workers collected by the cyclic garbage collector (a
    trainer's cycle, a held traceback's) ends them at once: torch's queues were closed
    first and it waited 5 s for each worker."""
    before = _children()
    loader = Loader(root, num_workers=2, persistent_workers=True, **OPTS)  # type: ignore[arg-type]
    loader.cycle = loader  # type: ignore[attr-defined]
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert len(_children() - before) == 2
    del loader
    t = time.monotonic()
    gc.collect()
    assert time.monotonic() - t < 3.0
    assert _children() <= before
