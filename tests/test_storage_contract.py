"""The Store contract, run against every backend: local folder, S3 (moto), HTTP server.

Every backend must behave the same for the writer and the reader: atomic writes, exact
ranged reads (short only at the end of the object), sizes, existence, listing, deletion.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import FileServer
from wdstream.storage import LocalStore, Store, open_store

# The fixtures (moto server, buckets, HTTP file server) live in one plugin module.
pytest_plugins = ["tests.fixtures_remote"]

pytestmark = pytest.mark.timeout(60)

BACKENDS = ["local", "s3", "http"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    kind = request.param
    if kind == "local":
        s: Store = open_store(str(tmp_path / "local"), create=True)
    elif kind == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        s = open_store(f"s3://{bucket}/ds/v1", retries=2, backoff=0.01, part_size=5 << 20)
    else:
        server: FileServer = request.getfixturevalue("http_server")
        s = open_store(f"{server.base_url}/ds/v1/", retries=2, backoff=0.01)
    yield s
    s.close()


def _data(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def test_write_read_size_exists(store: Store) -> None:
    data = _data(10_000)
    assert not store.exists("a.tar")
    store.write_bytes("a.tar", data)
    assert store.exists("a.tar")
    assert store.read("a.tar") == data
    assert store.size("a.tar") == len(data)


def test_empty_object(store: Store) -> None:
    store.write_bytes("empty.bin", b"")
    assert store.exists("empty.bin")
    assert store.size("empty.bin") == 0
    assert store.read("empty.bin") == b""
    assert store.read_range("empty.bin", 0, 10) == b""


def test_writer_is_atomic_on_exception(store: Store) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with store.writer("shard.tar") as out:
            out.write(b"x" * 1000)
            raise RuntimeError("boom")
    assert not store.exists("shard.tar")
    # An existing object is left as it was by a failed rewrite.
    store.write_bytes("shard.tar", b"old")
    with pytest.raises(RuntimeError):
        with store.writer("shard.tar") as out:
            out.write(b"new and longer")
            raise RuntimeError("boom")
    assert store.read("shard.tar") == b"old"


def test_writer_in_pieces(store: Store) -> None:
    pieces = [_data(n, seed=n) for n in (1, 100, 0, 65_536, 7)]
    with store.writer("p.bin") as out:
        for piece in pieces:
            out.write(piece)
    assert store.read("p.bin") == b"".join(pieces)


@pytest.mark.parametrize(
    ("start", "end"),
    [(0, 1), (0, 10_000), (123, 4567), (9_999, 10_000), (5_000, 20_000), (10_000, 10_010),
     (20_000, 30_000), (42, 42)],
)  # fmt: skip
def test_read_range(store: Store, start: int, end: int) -> None:
    data = _data(10_000)
    store.write_bytes("r.bin", data)
    assert store.read_range("r.bin", start, end) == data[start:end]
    assert bytes(store.read_range_view("r.bin", start, end)) == data[start:end]


def test_missing_object(store: Store) -> None:
    assert not store.exists("nope.tar")
    with pytest.raises(FileNotFoundError):
        store.read("nope.tar")
    with pytest.raises(FileNotFoundError):
        store.size("nope.tar")
    with pytest.raises(FileNotFoundError):
        store.read_range("nope.tar", 0, 10)


def test_list_and_delete(store: Store) -> None:
    for name in ("b.tar", "a.tar", ".hidden", "index.json"):
        store.write_bytes(name, name.encode())
    if store.url.startswith("http"):
        with pytest.raises(NotImplementedError, match="index.json"):
            store.list()
    else:
        assert store.list() == ["a.tar", "b.tar", "index.json"]
    store.delete("a.tar")
    store.delete("a.tar")  # deleting what is gone is fine
    assert not store.exists("a.tar")
    assert store.exists("b.tar")
    if not store.url.startswith("http"):
        assert store.list() == ["b.tar", "index.json"]


def test_iter_chunks(store: Store) -> None:
    data = _data(50_000)
    store.write_bytes("c.bin", data)
    chunks = list(store.iter_chunks("c.bin", chunk_size=16_384))
    assert [len(c) for c in chunks] == [16_384, 16_384, 16_384, 848]
    assert b"".join(chunks) == data


def test_large_object_multipart(store: Store) -> None:
    # 12 MB: three 5 MiB parts on S3 (the 20 MiB streamed HTTP PUT is in test_storage_http).
    data = _data(12_000_000)
    with store.writer("big.tar") as out:
        for i in range(0, len(data), 1 << 20):
            out.write(data[i : i + (1 << 20)])
    assert store.size("big.tar") == len(data)
    assert store.read_range("big.tar", 4_345_678, 11_000_000) == data[4_345_678:11_000_000]
    got = hashlib.sha256(b"".join(store.iter_chunks("big.tar"))).digest()
    assert got == hashlib.sha256(data).digest()


def test_pickle_round_trip(store: Store) -> None:
    data = _data(3_000)
    store.write_bytes("p.bin", data)
    store.read_range("p.bin", 0, 10)  # opens handles / clients that must not be pickled
    clone = pickle.loads(pickle.dumps(store))
    assert clone.read_range("p.bin", 100, 2_000) == data[100:2_000]
    clone.close()


def test_concurrent_read_range(store: Store) -> None:
    data = _data(200_000)
    store.write_bytes("t.bin", data)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(10):
                a = (k * 7919 + i * 104_729) % len(data)
                b = min(len(data), a + 5_000 + 1_000 * k)
                assert store.read_range("t.bin", a, b) == data[a:b]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize("form", ["path", "file-url"])
def test_local_store_is_the_local_backend(tmp_path: Path, form: str) -> None:
    """A local path or ``file://`` URL is a folder on disk: what the store writes is there as
    plain files (read back with pathlib, not the store), a file put there is an object,
    writes appear by an atomic rename of a hidden partial file, and the remote options are
    accepted and have nothing to change."""
    root = tmp_path / "new" / "ds"
    url = str(root) if form == "path" else f"file://{root}"
    store = open_store(url, create=True, retries=3, timeout=1.0)
    assert isinstance(store, LocalStore)
    assert root.is_dir()  # create=True made the folder itself
    assert store.url == str(root) and store.child_url("a.tar") == f"{root}/a.tar"

    data = _data(5_000)
    store.write_bytes("a.tar", data)
    assert sorted(os.listdir(root)) == ["a.tar"] and (root / "a.tar").read_bytes() == data
    (root / "b.bin").write_bytes(b"put there by hand")
    (root / ".hidden").write_bytes(b"not an object")
    assert store.list() == ["a.tar", "b.bin"]
    assert store.read("b.bin") == b"put there by hand" and store.size("b.bin") == 17
    assert store.read_range("a.tar", 10, 20) == data[10:20]

    # Atomic: while written, the object is a hidden partial file; then renamed into place.
    with store.writer("c.tar") as f:
        f.write(b"half")
        f.flush()
        during = sorted(set(os.listdir(root)) - {"a.tar", "b.bin", ".hidden"})
        assert len(during) == 1 and during[0].startswith(".c.tar.")
        assert during[0].endswith(".partial") and not store.exists("c.tar")
        partial_inode = os.stat(root / during[0]).st_ino
        f.write(b" and the rest")
    assert (root / "c.tar").read_bytes() == b"half and the rest"
    assert os.stat(root / "c.tar").st_ino == partial_inode  # renamed, not copied
    assert sorted(os.listdir(root)) == [".hidden", "a.tar", "b.bin", "c.tar"]
    with pytest.raises(RuntimeError), store.writer("d.tar") as f:
        f.write(b"never finished")
        raise RuntimeError("writer died")
    assert sorted(os.listdir(root)) == [".hidden", "a.tar", "b.bin", "c.tar"]

    # A killed writer's partial file is swept by remove_partials; delete removes the file.
    (root / ".e.tar.999.partial").write_bytes(b"left by a killed pack")
    assert store.remove_partials() == 1 and not (root / ".e.tar.999.partial").exists()
    store.delete("a.tar")
    assert not (root / "a.tar").exists()
    store.close()
