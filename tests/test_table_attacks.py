"""Regressions from the shard-table attacks (``tools/faultlib/tables.py``).

Each test is one hostile input that once hung, crashed or passed ``verify`` while readers of
the same file disagreed. Oracles: the clean dataset's own shard list read with ``json``, and
a table forged with ``struct`` and the ``crc32c`` package (not wdstream's writer).
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c

from tests.cli_server import run_cli
from wdstream.errors import IndexValidationError
from wdstream.format.shard_table import ShardRows
from wdstream.inspect import verify_dataset
from wdstream.read.sources.index_open import MappedRows, read_index
from wdstream.storage import open_store
from wdstream.testing import write_synthetic_dataset

TABLE = "index.shards"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tables") / "clean"
    write_synthetic_dataset(str(root), n_docs=12, sample_tokens=33, samples_per_shard=3)
    return root


def _copy(clean: Path, dst: Path, large: bool = False) -> Path:
    """A copy of ``clean``; ``large``: its index.json made 100 KB longer by an unknown key
    after the list, so readers take the head path (64 KiB head, the table mapped)."""
    shutil.copytree(clean, dst)
    if large:
        text = (dst / "index.json").read_text().rstrip()
        (dst / "index.json").write_text(text[:-1] + ', "zz": "' + "y" * 100_000 + '"}\n')
    return dst


def _listed(root: Path) -> list[dict[str, Any]]:
    return json.loads((root / "index.json").read_text())["shards"]


@pytest.fixture()
def no_hang() -> Iterator[None]:
    def stop(*_: object) -> None:
        raise TimeoutError("hung")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("kind", ["fifo", "devzero", "dir"])
def test_table_not_a_file_is_refused(
    clean: Path, tmp_path: Path, kind: str, large: bool, no_hang: None
) -> None:
    """A FIFO as index.shards blocked open() forever (Loader and verify hung)."""
    root = _copy(clean, tmp_path / "ds", large)
    (root / TABLE).unlink()
    if kind == "fifo":
        os.mkfifo(root / TABLE)
    elif kind == "devzero":
        (root / TABLE).symlink_to("/dev/zero")
    else:
        (root / TABLE).mkdir()
    with pytest.raises(IndexValidationError, match="index.shards: not a regular file"):
        read_index(open_store(str(root)))


def test_verify_of_a_refused_table_prints_no_traceback(clean: Path, tmp_path: Path) -> None:
    """A table refused before it was opened left ``MappedRows.__del__`` an AttributeError,
    printed as a traceback by the CLI ("Exception ignored in ...")."""
    root = _copy(clean, tmp_path / "ds")
    with open(root / TABLE, "ab") as f:
        f.write(b"x")  # one byte more than index.json says
    proc = run_cli("verify", str(root), timeout=120)
    assert proc.returncode != 0
    assert "index.shards" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_refused_table_raises_nothing_when_collected(clean: Path, tmp_path: Path) -> None:
    seen: list[object] = []
    old = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with pytest.raises(IndexValidationError, match="bytes, index.json says 1"):
            MappedRows(str(clean / TABLE), "t", 1)
        gc.collect()
    finally:
        sys.unraisablehook = old
    assert seen == []


def _forge_swapped(root: Path) -> bytes:
    """``root``'s table with the counts of its first and last shards swapped: the same size, a valid
    CRC32C (crc32c package), laid out by docs/FORMAT.md with struct."""
    data = bytearray((root / TABLE).read_bytes())
    n = struct.unpack_from("<Q", data, 16)[0]
    plen = struct.unpack_from("<I", data, 24)[0]
    at = 64 + plen + (-plen % 8)
    for column in range(4):
        a, b = at + 8 * n * column, at + 8 * n * column + 8 * (n - 1)
        data[a : a + 8], data[b : b + 8] = data[b : b + 8], data[a : a + 8]
    data[28:32] = struct.pack("<I", crc32c(bytes(data[64:])))
    return bytes(data)


def test_worker_refuses_a_table_replaced_after_the_parent_checked_it(
    clean: Path, tmp_path: Path
) -> None:
    """A spawned torch worker receives the table pickled by path and maps it again: a table
    replaced meanwhile by another of the same size (valid CRC32C) was used as if checked."""
    root = _copy(clean, tmp_path / "ds", large=True)
    rows = read_index(open_store(str(root))).shards.table
    assert isinstance(rows, MappedRows)
    sent = pickle.dumps(rows)
    pickle.loads(sent)  # unchanged: maps
    forged = _forge_swapped(root)
    assert forged != (root / TABLE).read_bytes() and len(forged) == rows.size
    (root / "t.tmp").write_bytes(forged)
    os.replace(root / "t.tmp", root / TABLE)
    remapped = pickle.loads(sent)  # refused where first used: torch hands that back
    with pytest.raises(IndexValidationError, match="index.shards: replaced since"):
        len(remapped)
    with pytest.raises(IndexValidationError, match="index.shards: replaced since"):
        remapped.row(0)


def test_sorted_keys_large_index_opens_whole(clean: Path, tmp_path: Path) -> None:
    """``json.dump(sort_keys=True)`` of a large index.json (``shards`` before ``stats``,
    ``tokenizer`` and ``version``) was refused as 'format version null'."""
    root = _copy(clean, tmp_path / "ds", large=True)
    obj = json.loads((root / "index.json").read_text())
    (root / "index.json").write_text(json.dumps(obj, sort_keys=True, indent=1))
    index = read_index(open_store(str(root)))
    assert [s.name for s in index.shards] == [s["name"] for s in _listed(clean)]
    assert index.version == 2 and index.tokenizer == obj["tokenizer"]
    assert verify_dataset(str(root)).ok


@pytest.mark.parametrize("large", [False, True])
def test_verify_refuses_a_known_key_after_the_list(
    clean: Path, tmp_path: Path, large: bool
) -> None:
    """``loss_mask`` after the list: a reader of a large index.json never sees it, a
    reader of the whole file does; verify passed both."""
    root = _copy(clean, tmp_path / "ds", large)
    text = (root / "index.json").read_text().rstrip()
    (root / "index.json").write_text(text[:-1] + ', "loss_mask": "bit31"}\n')
    report = verify_dataset(str(root))
    assert not report.ok
    assert "loss_mask: after the shard list" in report.problems[0]


def _one_listed_shard(name_offsets: tuple[int, int]) -> bytes:
    """A table of one shard named ``a.tar`` / ``a.idx`` (names listed), its name offsets
    replaced, laid out by docs/FORMAT.md with struct, CRC32C by the crc32c package."""
    body = struct.pack("<4Q", 1, 33, 1, 1024) + bytes(64)
    names = struct.pack("<2Q", *name_offsets) + b"a.tar" + bytes(3)
    names += struct.pack("<2Q", 0, 5) + b"a.idx" + bytes(3)
    body += names
    head = struct.pack("<8sIIQIIQ24x", b"WDSHARDS", 1, 2, 1, 0, crc32c(body), len(names))
    return head + body


def test_name_offsets_wrapping_past_2_63_are_refused() -> None:
    """Offsets were compared as int64: [2**64 - 1, 5] passed as non-decreasing, and shard 0
    was named '' (refused later by the name rule, not as the offsets it is)."""
    ShardRows(_one_listed_shard((0, 5)), "t")  # the honest table
    with pytest.raises(IndexValidationError, match="t: its name offsets run past the names"):
        ShardRows(_one_listed_shard(((1 << 64) - 1, 5)), "t")


def test_table_cut_while_open_is_refused_not_read_as_zeros(clean: Path, tmp_path: Path) -> None:
    """Rows are read with pread: a table cut under a reader read as zero counts."""
    root = _copy(clean, tmp_path / "ds", large=True)
    rows = read_index(open_store(str(root))).shards.table
    assert isinstance(rows, MappedRows)
    os.truncate(root / TABLE, 64)
    with pytest.raises(IndexValidationError, match="index.shards: cut to 64 bytes while open"):
        rows.row(rows.n - 1)


def test_node_cache_object_that_is_a_fifo_is_a_miss(clean: Path, tmp_path: Path) -> None:
    """The faults attack's 'node cache: tables and sidecars', objects/ replaced by a FIFO:
    the copy kept by digest must be fetched again (or refused), never waited on."""
    cache = tmp_path / "cache"
    sidecar = _listed(clean)[0]["sidecar"]
    digest = _listed(clean)[0]["sidecar_sha256"]
    (cache / "objects").mkdir(parents=True)
    os.mkfifo(cache / "objects" / digest)
    script = (
        "import sys; from wdstream.storage.cache import CachedStore; "
        "from wdstream.storage import open_store; "
        "s = CachedStore(open_store(sys.argv[1]), sys.argv[2]); "
        "sys.stdout.write(str(len(s.read_by_digest(sys.argv[3], sys.argv[4]))))"
    )
    args = [sys.executable, "-c", script, str(clean), str(cache), sidecar, digest]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("read_by_digest hung on a FIFO in cache_dir/objects")
    assert proc.stdout == str((clean / sidecar).stat().st_size), proc.stderr
