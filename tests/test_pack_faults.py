"""Real write faults in the middle of a pack, then a rerun: the result is the uninterrupted one.

- A shard that cannot be written (a directory in the way of ``data-000002.tar``): nothing after
  it is committed, and the rerun lists every shard once, in order.
- A full disk (a real tmpfs of 2 MB, needs root): the error names the object being written and
  says how to go on; after the filesystem grows, the rerun finishes byte-identical.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import wdstream
from tests.conftest import make_corpus, small_tmpfs
from tests.test_pack_resume import _files
from wdstream.errors import WdstreamError
from wdstream.format.index import ShardEntry
from wdstream.inputs import InputPosition
from wdstream.storage import LocalStore
from wdstream.storage.local import PARTIAL_SUFFIX
from wdstream.write.journal import Journal
from wdstream.write.lock import LOCK_NAME
from wdstream.write.pack import JOURNAL_NAME
from wdstream.write.shards import shard_names

KW: dict[str, object] = {"seq_len": 31, "workers": 0}


def _corpus(path: Path, n_docs: int) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for t in make_corpus(n_docs=n_docs, seed=5, stdlib_files=0):
            f.write(json.dumps({"text": t}) + "\n")
    return path


def _journal_shards(out: Path) -> list[str]:
    return [e["name"] for e in json.loads((out / JOURNAL_NAME).read_bytes())["shards"]]


def _assert_complete(out: Path, expected: dict[str, bytes]) -> None:
    """``out`` holds exactly the reference files; index.json lists shards 0..n-1 once each."""
    assert _files(out) == expected
    shards = json.loads(expected["index.json"])["shards"]
    assert [(s["name"], s["sidecar"]) for s in shards] == [
        shard_names("data", i) for i in range(len(shards))
    ]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no journal, lock


def test_failed_shard_write_then_rerun(tmp_path: Path) -> None:
    src = _corpus(tmp_path / "in.jsonl", 20)
    kw = {**KW, "shard_size": "8KB"}
    ref = tmp_path / "ref"
    wdstream.pack([str(src)], str(ref), **kw)  # type: ignore[arg-type]
    assert len(json.loads(_files(ref)["index.json"])["shards"]) > 5

    out = tmp_path / "out"
    (out / "data-000002.tar").mkdir(parents=True)  # the rename into place fails: EISDIR
    with pytest.raises(IsADirectoryError):
        wdstream.pack([str(src)], str(out), **kw)  # type: ignore[arg-type]
    # Shards 0 and 1 committed; 2 failed; later ones neither written nor committed.
    assert _journal_shards(out) == ["data-000000.tar", "data-000001.tar"]
    assert not (out / "data-000003.tar").exists() and not (out / "index.json").exists()

    (out / "data-000002.tar").rmdir()
    res = wdstream.pack([str(src)], str(out), **kw)  # type: ignore[arg-type]
    assert res.resumed_shards == 2
    _assert_complete(out, _files(ref))


def _entry(i: int) -> ShardEntry:
    tar, idx = shard_names("data", i)
    return ShardEntry(tar, idx, samples=1, tokens=1, documents=1, bytes=1, sha256="",
                      sidecar_sha256="")  # fmt: skip


def test_journal_never_records_a_gap(tmp_path: Path) -> None:
    """Whatever order shards are reported in, the journal only takes the next one; a gapped
    journal on disk (an older writer's) is refused on resume rather than published."""
    store = LocalStore(tmp_path)
    journal = Journal(store, {"name": "data"}, "data")
    end = (InputPosition(0, 0, 0, 0, 0, 0), 0)
    journal.commit(_entry(0), end, [])
    with pytest.raises(
        WdstreamError,
        match=r"data-000002.tar: committed out of order, the next shard to commit is data-000001",
    ):
        journal.commit(_entry(2), end, [])
    assert [e.name for e in journal.entries] == _journal_shards(tmp_path) == ["data-000000.tar"]

    body = json.loads((tmp_path / JOURNAL_NAME).read_bytes())
    body["shards"].append(_entry(2).__dict__)
    (tmp_path / JOURNAL_NAME).write_text(json.dumps(body))
    for i in (0, 2):
        (tmp_path / shard_names("data", i)[0]).write_bytes(b"x")  # present, right size
    with pytest.raises(WdstreamError, match=r"shard 1 is recorded as 'data-000002.tar'"):
        Journal(store, {"name": "data"}, "data").load()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs mounted on a fresh folder (root only); always unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk", "2m") as mnt:
        yield mnt


def test_disk_full_names_the_object_then_rerun(tmp_path: Path, small_disk: Path) -> None:
    src = _corpus(tmp_path / "in.jsonl", 400)
    # 8-token samples: each takes a 1 KB tar member, so 400 documents (~31K tokens) make ~4 MB of shards.
    kw = {**KW, "seq_len": 7, "shard_size": "256KB"}
    ref = tmp_path / "ref"
    wdstream.pack([str(src)], str(ref), **kw)  # type: ignore[arg-type]
    expected = _files(ref)
    assert sum(map(len, expected.values())) > 3 << 20  # more than the disk holds

    out = small_disk / "out"
    with pytest.raises(wdstream.WdstreamError) as info:
        wdstream.pack([str(src)], str(out), **kw)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"no space left on device while writing {out}/data-0000")
    assert message.endswith(
        ": free space and rerun the same command: it resumes from the last complete shard"
    )
    # Nothing half-written under a final name: what is visible is exactly the reference's.
    left = _files(out)
    assert left and all(expected[name] == data for name, data in left.items())
    assert not [p for p in out.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
    assert not (out / LOCK_NAME).exists()  # released on the error

    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    res = wdstream.pack([str(src)], str(out), **kw)  # type: ignore[arg-type]
    assert res.resumed_shards >= 1
    _assert_complete(out, expected)
