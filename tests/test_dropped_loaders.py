"""A Loader the caller drops is freed at once, by reference counting, with everything it
holds: a process making Loaders again and again (evaluation), possibly with the cyclic
collector off or rarely run, must not accumulate their descriptors (each dataset's mapped
shard table holds two), read-ahead threads and sockets. The oracles are outside the code:
this process's ``/proc/self/fd`` and ``/proc/self/task``, and the collector finding no
reader object left to free."""

from __future__ import annotations

import gc
import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.open_files import open_descriptors
from tests.servers import FileServer
from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

OPTS = {"seq_len": 16, "shuffle_window": 8, "shuffle_lanes": 3, "seed": 3, "num_workers": 0}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    top = tmp_path_factory.mktemp("dropped")
    for k, name in enumerate(("a", "b")):
        write_synthetic_dataset(
            str(top / name), n_docs=60, sample_tokens=17, samples_per_shard=3, seed=k
        )
    return {name: str((top / name).resolve()) for name in ("a", "b")}


def _open_under(root: str) -> int:
    """Descriptors of this process open on anything under ``root``."""
    return open_descriptors(lambda target: target.startswith(root + os.sep))


def _sockets() -> int:
    return open_descriptors(lambda target: target.startswith("socket:"))


def _reader_garbage() -> list[str]:
    """The reader objects the cyclic collector frees now (those kept alive only by a
    reference cycle); the garbage is kept aside and released."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = sorted({type(o).__qualname__ for o in gc.garbage
                        if type(o).__module__.startswith("wdstream.")})  # fmt: skip
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return found


def _settles(value: Callable[[], object], want: object) -> bool:
    """Whether ``value()`` comes to ``want`` within 10 s (a loaded host): the last Loader's
    read-ahead (order="streams", remote GETs) may still be in flight, holding what it read
    with until it ends."""
    stop = time.monotonic() + 10
    while value() != want and time.monotonic() < stop:
        time.sleep(0.01)
    return value() == want


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _iterate(loader: Loader) -> None:
    for _ in itertools.islice(loader, 6):
        pass


def _raise_mid(loader: Loader) -> None:
    with pytest.raises(RuntimeError):
        for i, _ in enumerate(loader):
            if i == 3:
                raise RuntimeError("the training step failed")


USES: dict[str, Callable[[dict[str, str]], None]] = {
    "iterated": lambda r: _iterate(Loader(r["a"], batch_size=4, **OPTS)),
    "mixture": lambda r: _iterate(Loader(r, batch_size=4, weights={"a": 2, "b": 1}, **OPTS)),
    "streams order": lambda r: _iterate(Loader(r["a"], batch_size=4, order="streams", **OPTS)),
    "batch_at": lambda r: Loader(r["b"], batch_size=4, **OPTS).batch_at(7) and None,
    "raised mid-iteration": lambda r: _raise_mid(Loader(r["a"], batch_size=4, **OPTS)),
}


@pytest.mark.usefixtures("no_collector")
@pytest.mark.parametrize("use", list(USES))
def test_a_dropped_loader_is_freed_without_the_collector(roots: dict[str, str], use: str) -> None:
    before = {name: _open_under(root) for name, root in roots.items()}
    for _ in range(20):
        USES[use](roots)
    assert _settles(lambda: {name: _open_under(root) for name, root in roots.items()}, before)
    assert _reader_garbage() == []


@pytest.mark.usefixtures("no_collector")
def test_a_dropped_remote_loader_leaves_no_thread_or_socket(
    roots: dict[str, str], tmp_path: Path
) -> None:
    shutil.copytree(roots["a"], tmp_path / "a")
    with FileServer(tmp_path) as server:
        url = f"{server.base_url}/a"
        _iterate(Loader(url, batch_size=4, **OPTS))  # imports, the server's first threads
        threads, sockets = len(os.listdir("/proc/self/task")), _sockets()
        for _ in range(8):
            _iterate(Loader(url, batch_size=4, **OPTS))
        # The last Loaders' dropped GETs may still be in flight on a loaded host (their
        # fetch threads end, and free their sockets, when the answers come).
        assert _settles(lambda: _sockets() <= sockets, True), _sockets()
        assert _settles(lambda: len(os.listdir("/proc/self/task")) <= threads, True)
        assert _reader_garbage() == []
