"""The read side when local storage runs out or is changed under it: the node cache on a full
disk (a real tmpfs, root only) or cleared while read, a cached block cut short by another
process while this one holds it (a SIGBUS where it was mapped) or a FIFO in its place, a
torch worker's exchanged piece of the wrong length, a full ``/dev/shm`` at the workers'
start. Oracle: the same reads from the local folder (``torch.equal`` on every batch), the
object's bytes; a crash is a child's exit by signal.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.conftest import small_tmpfs
from tests.servers import FileServer
from wdstream import Loader
from wdstream.read.sources.exchange import ReadShare, SharedPieces
from wdstream.storage import open_store
from wdstream.storage.cache import CachedStore
from wdstream.testing import write_synthetic_dataset

pytestmark = pytest.mark.timeout(120)

KW = {"seq_len": 32, "batch_size": 4, "shuffle": True, "seed": 3, "epochs": 1}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """``(folder, URL of it on the tests' HTTP file server)``: 6 shards and a shard table."""
    root = tmp_path_factory.mktemp("cachefaults") / "ds"
    write_synthetic_dataset(str(root), n_docs=60, sample_tokens=33, samples_per_shard=20)
    with FileServer(root) as server:
        yield root, server.base_url


def _batches(url: str, **kw: object) -> list[torch.Tensor]:
    return [b["input_ids"] for b in Loader(url, **KW, **kw)]  # type: ignore[arg-type]


def _in_child(fn: Callable[[], None], timeout: float = 60.0) -> int | None:
    """``fn`` run in a forked child; its exit code (-7: killed by SIGBUS; None: still running
    at ``timeout``, then killed)."""
    proc = multiprocessing.get_context("fork").Process(target=fn)
    proc.start()
    proc.join(timeout)
    code = proc.exitcode
    if code is None:
        proc.kill()
        proc.join()
    return code


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs (root only), filled to the last byte; unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk", "1m") as mnt:
        (mnt / "cache").mkdir()
        fd = os.open(mnt / "fill", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError, match="No space"):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        yield mnt


@pytest.mark.parametrize("workers", [0, 2])
def test_a_full_cache_disk_reads_the_same_batches(
    dataset: tuple[Path, str], full_disk: Path, workers: int
) -> None:
    """Before: ``Loader()`` raised ``OSError: [Errno 28] No space left on device`` (no path)
    writing the shard table into the cache; blocks were already skipped."""
    root, url = dataset
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = _batches(url, num_workers=workers, cache_dir=str(full_disk / "cache"))
    want = _batches(str(root), num_workers=0)
    assert len(got) == len(want) and all(map(torch.equal, got, want))
    assert any("shard table" in str(w.message) and "full" in str(w.message) for w in said)
    assert not list((full_disk / "cache").rglob("*.tmp"))


def test_a_cache_cleared_while_read_is_made_again(
    dataset: tuple[Path, str], tmp_path: Path
) -> None:
    """Before: the next block's write raised ``FileNotFoundError`` and ended the run."""
    root, url = dataset
    store = CachedStore(open_store(url), str(tmp_path / "c"))
    assert (
        store.read_range("data-000000.tar", 0, 100) == (root / "data-000000.tar").read_bytes()[:100]
    )
    shutil.rmtree(tmp_path / "c")  # a cleanup while the loader runs
    assert (
        store.read_range("data-000001.tar", 5, 50) == (root / "data-000001.tar").read_bytes()[5:50]
    )
    assert len(list((tmp_path / "c").rglob("*.blk"))) == 1


def test_a_block_cut_short_under_its_reader_is_no_sigbus(
    dataset: tuple[Path, str], tmp_path: Path
) -> None:
    """A verified block kept by this process, then truncated in place by another (``cp``
    or ``open(.., "wb")`` over it): its bytes stay right. Mapped, the next slice was a
    SIGBUS that killed the process."""
    root, url = dataset
    want = (root / "data-000002.tar").read_bytes()

    def child() -> None:
        store = CachedStore(open_store(url), str(tmp_path / "c"))
        store.read_range("data-000002.tar", 0, 10)  # fetched and cached
        view = store.read_range_view("data-000002.tar", 0, len(want))  # read from the cache
        for block in (tmp_path / "c").rglob("*.blk"):
            os.truncate(block, 0)
        assert bytes(view) == want
        assert store.read_range("data-000002.tar", 0, len(want)) == want
        again = CachedStore(open_store(url), str(tmp_path / "c"))  # a new process's view
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert again.read_range("data-000002.tar", 0, len(want)) == want
        assert again.dropped == 1

    assert _in_child(child) == 0


def test_a_fifo_in_place_of_a_block_is_dropped_not_waited_on(
    dataset: tuple[Path, str], tmp_path: Path
) -> None:
    """Before: opening the block blocked until some process opened the FIFO to write."""
    root, url = dataset
    want = (root / "data-000003.tar").read_bytes()[:100]

    def child() -> None:
        CachedStore(open_store(url), str(tmp_path / "c")).read_range("data-000003.tar", 0, 10)
        (block,) = (tmp_path / "c").rglob("*.blk")
        block.unlink()
        os.mkfifo(block)
        store = CachedStore(open_store(url), str(tmp_path / "c"))
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert store.read_range("data-000003.tar", 0, 100) == want
        assert store.dropped == 1 and block.is_file()

    assert _in_child(child, timeout=20) == 0


def test_a_piece_of_the_wrong_length_is_fetched_by_its_taker(tmp_path: Path) -> None:
    """Before: a piece cut short in ``/dev/shm`` was taken as it was, and the read failed
    with ``CorruptShardError: short read`` naming the shard, which was fine."""
    data = os.urandom(5000)
    owner = SharedPieces.split(ReadShare(str(tmp_path / "s"), 0), (0, 0), [9], [0, 1])
    assert owner.owner == [0]
    owner.fetch(0, lambda: memoryview(data), len(data))  # fetched and offered to worker 1
    os.truncate(tmp_path / "s" / "0-0-0.1", 1000)
    taker = SharedPieces.split(ReadShare(str(tmp_path / "s"), 1), (0, 0), [9], [0, 1])
    fetched: list[int] = []

    def get() -> memoryview:
        fetched.append(1)
        return memoryview(data)

    assert bytes(taker.fetch(0, get, len(data))) == data and fetched == [1]


_FULL_SHM_CHILD = """
import os, sys
from wdstream import Loader, WdstreamError
from wdstream.testing import write_synthetic_dataset
write_synthetic_dataset("/dev/shm/ds", n_docs=20, sample_tokens=33, samples_per_shard=20)
fd = os.open("/dev/shm/fill", os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, bytes(4096))
except OSError:
    pass
try:
    list(Loader("/dev/shm/ds", seq_len=32, batch_size=4, num_workers=2))
except WdstreamError as exc:
    sys.exit(f"WdstreamError: {exc}")
"""


def test_a_full_dev_shm_at_the_workers_start_is_said(tmp_path: Path) -> None:
    """torch's workers need ``/dev/shm`` for their queues' semaphores; full, that was
    multiprocessing's bare ``OSError: [Errno 28] No space left on device`` (no file named).
    Run in a mount namespace of its own with a 1 MB ``/dev/shm`` (the host's untouched)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs on /dev/shm in a namespace needs root")
    script = 'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$@"'
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", sys.executable, "-c",
                           _FULL_SHM_CHILD], capture_output=True, text=True, timeout=90,
                          env=env)  # fmt: skip
    if "unshare" in proc.stderr or "mount" in proc.stderr:
        pytest.skip(f"no mount namespace here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().startswith("WdstreamError: cannot start the torch workers")
    assert "/dev/shm" in proc.stderr and "num_workers=0" in proc.stderr
