"""Open file descriptors stay bounded per process, whatever the number of shards, sources or
Loaders (alive or dropped but not yet collected): each mapped local shard holds one, and a
process past 1023 of them breaks ``select()`` and, at the usual limit of 1024, every
``open()``. The oracle is the same batches read with the bound out of the way."""

from __future__ import annotations

import gc
import itertools
import os
import resource
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.cli_server import _Server
from tests.open_files import open_descriptors
from wdstream import Loader
from wdstream.storage import local
from wdstream.testing import write_synthetic_dataset

OPTS = {"seq_len": 16, "shuffle_window": 8, "shuffle_lanes": 3, "seed": 3}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("fds")
    write_synthetic_dataset(str(root / "a"), n_docs=80, sample_tokens=17, samples_per_shard=4)
    write_synthetic_dataset(
        str(root / "b"), n_docs=60, sample_tokens=17, samples_per_shard=3, seed=1
    )
    return {name: str(root / name) for name in ("a", "b")}


def _shard_descriptors(roots: list[str]) -> int:
    """How many of this process's descriptors are open on a ``.tar`` under ``roots``."""
    return open_descriptors(lambda t: t.endswith(".tar") and t.startswith(tuple(roots)))


def _loaders(sources: dict[str, str]) -> Iterator[Loader]:
    """Three Loaders: each source alone, and the two as a mixture."""
    yield Loader(sources["a"], batch_size=4, num_workers=0, **OPTS)
    yield Loader(sources["b"], batch_size=4, num_workers=0, **OPTS)
    yield Loader(sources, batch_size=4, num_workers=0, weights={"a": 0.6, "b": 0.4}, **OPTS)


def _read(loader: Loader) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(loader, 40))


def test_mapped_shards_are_bounded_per_process_over_every_loader(
    sources: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = [_read(loader) for loader in _loaders(sources)]
    roots = [str(Path(r).resolve()) for r in sources.values()]
    monkeypatch.setattr(local._MAPPED, "limit", 5)
    kept = []  # alive, as Loaders dropped but not collected are
    gc.disable()
    try:
        for _ in range(2):
            for loader, want in zip(_loaders(sources), expected, strict=True):
                got = _read(loader)
                kept.append(loader)
                assert len(got) == len(want)
                for x, y in zip(got, want, strict=True):
                    assert all(torch.equal(x[k], y[k]) for k in y)
                assert _shard_descriptors(roots) <= 5
    finally:
        gc.enable()
    assert len(local._MAPPED) <= 5


def test_closing_a_store_unmaps_only_its_own_shards(sources: dict[str, str]) -> None:
    first, second = local.LocalStore(sources["a"]), local.LocalStore(sources["a"])
    name = sorted(n for n in os.listdir(sources["a"]) if n.endswith(".tar"))[0]
    view = bytes(first.read_range_view(name, 0, 512))
    assert bytes(second.read_range_view(name, 0, 512)) == view
    first.close()
    assert bytes(second.read_range_view(name, 0, 512)) == view  # still mapped for second
    assert bytes(first.read_range_view(name, 0, 512)) == view  # mapped again on use


def test_the_cli_server_answers_with_over_1023_descriptors_open() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    server = _Server()
    try:
        code, out, _, _ = server.run(["--version"], Path.cwd(), timeout=60)
        assert server.lines is not None and server.lines.proc.stdout is not None
        assert server.lines.proc.stdout.fileno() > 1023
    finally:
        for fd in held:
            os.close(fd)
        if server.lines is not None:
            server.lines.proc.kill()
            server.lines.proc.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert code == 0 and "wdstream" in out.lower()


def test_a_store_closed_while_its_own_thread_maps_never_waits(sources: dict[str, str]) -> None:
    """The cyclic collector runs ``__del__`` (which closes stores) wherever it is triggered,
    even inside a map's lookup on the thread holding the maps' lock: closing must not wait."""
    store = local.LocalStore(sources["a"])
    name = sorted(n for n in os.listdir(sources["a"]) if n.endswith(".tar"))[0]
    store.read_range_view(name, 0, 16)
    key = (store._token, name)
    closed = threading.Event()

    def close_holding_the_lock() -> None:
        with local._MAPPED._lock:
            store.close()
            closed.set()

    thread = threading.Thread(target=close_holding_the_lock, daemon=True)
    thread.start()
    thread.join(10)
    assert closed.is_set(), "closing a store waited for a lock its own thread held"
    assert key in local._MAPPED._maps  # still mapped: the lock was held
    local.LocalStore(sources["b"]).read_range_view(
        sorted(n for n in os.listdir(sources["b"]) if n.endswith(".tar"))[0], 0, 16
    )
    assert key not in local._MAPPED._maps  # unmapped at the next read


def test_a_store_dropped_unclosed_gives_its_maps_back(sources: dict[str, str]) -> None:
    """``open_store`` in a script, never closed: its maps go with it, not when 256 newer
    maps push them out of the process's LRU."""
    names = sorted(n for n in os.listdir(sources["b"]) if n.endswith(".tar"))[:5]
    root = str(Path(sources["b"]).resolve())
    gc.collect()
    gc.disable()
    try:
        before = _shard_descriptors([root])
        for name in names:
            store = local.LocalStore(sources["b"])
            store.read_range_view(name, 0, 16).release()
            del store
        assert _shard_descriptors([root]) == before
    finally:
        gc.enable()
