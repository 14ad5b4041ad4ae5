"""kill -9 a real ``wdstream pack`` at several points, rerun it: byte-identical output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO

import pytest

import wdstream
import wdstream.write.journal as journal_module
from tests.cli_server import run_cli
from tests.conftest import make_corpus
from wdstream.format.shard_table import ShardRows
from wdstream.storage import LocalStore
from wdstream.testing import alive, committed_shards, live_descendants
from wdstream.write.pack import JOURNAL_NAME

OPTS = ["--seq-len", "31", "--shard-size", "8KB", "--quiet"]


def _cmd(src: Path, out: Path, workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "wdstream.cli",
        "pack",
        str(src),
        "-o",
        str(out),
        "--workers",
        str(workers),
        *OPTS,
    ]


def _pack(src: Path, out: Path, workers: int) -> None:
    """An uninterrupted ``wdstream pack`` (``_cmd``'s), in a process forked from
    :mod:`tests.cli_server`'s server; the packs to kill are fresh processes of their own."""
    done = run_cli(*_cmd(src, out, workers)[3:])
    assert done.returncode == 0, done.stderr


# ``python -c`` running the CLI with every journal commit followed by a pause: the pack's
# output is unchanged, but each commit lasts long enough to be seen and killed after.
# Unslowed, a small pack ended a few ms after the commit the test waited for, and a poll
# delayed that long on a loaded machine missed it.
_SLOW_COMMITS = """
import time
from wdstream.write.journal import Journal
_commit = Journal.commit
def _paused(self, *args, **kwargs):
    out = _commit(self, *args, **kwargs)
    time.sleep(0.05)
    return out
Journal.commit = _paused
from wdstream.cli import main
main()
"""


def _kill_after(cmd: list[str], out: Path, shards: int, timeout: float = 120) -> bool:
    """Run ``cmd`` (``python -m wdstream.cli pack ...``) with each journal commit followed
    by a 50 ms pause; SIGKILL it once the journal holds >= ``shards`` shards. True if
    killed.

    Also checks that the killed pack leaves no tokenizer processes behind.
    """
    assert cmd[1:3] == ["-m", "wdstream.cli"], cmd
    cmd = [cmd[0], "-c", _SLOW_COMMITS, *cmd[3:]]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if committed_shards(out) >= shards:
                helpers = live_descendants(proc.pid)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                gone_by = time.monotonic() + 10
                while any(alive(p) for p in helpers) and time.monotonic() < gone_by:
                    time.sleep(0.05)
                assert not [p for p in helpers if alive(p)], "pool processes outlived pack"
                return True
            time.sleep(0.002)
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if not p.name.startswith(".")}


def _without_provenance(files: dict[str, bytes]) -> dict[str, object]:
    """``files`` less the provenance tables and their index entries (which name the input)."""
    out: dict[str, object] = {k: v for k, v in files.items() if not k.endswith(".prov")}
    if "index.json" in files:
        index = json.loads(files["index.json"])
        for shard in index["shards"]:
            shard.pop("provenance", None)
            shard.pop("provenance_sha256", None)
        index.pop("shard_table", None)  # its hash covers the provenance hashes
        out["index.json"] = index
    if "index.shards" in files:
        rows = ShardRows(files["index.shards"], "index.shards")
        out["index.shards"] = [
            {k: v for k, v in r.items() if not k.startswith("provenance")} for r in rows
        ]
    return out


@pytest.fixture(scope="module")
def big_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("resume") / "in.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for t in make_corpus(n_docs=150, seed=1, stdlib_files=1):
            f.write(json.dumps({"text": t}) + "\n")
    return path


def test_sigkill_then_rerun_is_byte_identical(tmp_path: Path, big_input: Path) -> None:
    ref = tmp_path / "ref"
    _pack(big_input, ref, 0)
    expected = _files(ref)
    n_shards = len(json.loads(expected["index.json"])["shards"])
    assert n_shards > 30
    # The provenance tables are compared too: one per shard.
    assert sum(name.endswith(".prov") for name in expected) == n_shards

    out = tmp_path / "out"
    kills = 0
    # The middle run tokenises in a process pool: killing its parent must not matter either.
    for k, workers in ((1, 0), (n_shards // 3, 2), ((2 * n_shards) // 3, 0)):
        kills += _kill_after(_cmd(big_input, out, workers), out, k)
        assert not (out / "index.json").exists()
        assert committed_shards(out) >= k
    assert kills == 3, "pack finished before it could be killed"
    # Leftover partial files are swept; the rerun (with other workers) completes identically.
    _pack(big_input, out, 2)
    assert _files(out) == expected
    assert not (out / JOURNAL_NAME).exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".partial")]


def test_resume_in_process_after_interrupt(
    tmp_path: Path, big_input: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception in the middle (e.g. Ctrl-C) also resumes exactly, in docs mode too,
    with skipped bad records and empty documents counted identically.

    The interrupt is raised by the store while it writes the 7th shard, i.e. inside the
    shard writer's real write path, so the writer sees it as the failed write it is and
    commits nothing after it: exactly 6 shards are committed however the threads interleave.
    """
    lines = big_input.read_text().splitlines(keepends=True)
    for i in range(0, len(lines), 15):  # a bad record and an empty document every 15 lines
        lines[i] = "{broken\n" if i % 30 else json.dumps({"text": ""}) + "\n"
    messy = tmp_path / "messy.jsonl"
    messy.write_text("".join(lines))
    for mode in ("concat", "docs"):
        ref, out = tmp_path / f"ref-{mode}", tmp_path / f"out-{mode}"
        kw = dict(seq_len=31, shard_size="8KB", workers=0, mode=mode, on_error="skip")
        stats = wdstream.pack([str(messy)], str(ref), **kw).index.stats  # type: ignore[arg-type]
        assert stats["records_skipped"] == 5 and stats["empty_documents_skipped"] == 6
        with monkeypatch.context() as patch:
            patch.setattr(LocalStore, "writer", _interrupted_writer("data-000006.tar"))
            with pytest.raises(KeyboardInterrupt):
                wdstream.pack([str(messy)], str(out), **kw)  # type: ignore[arg-type]
        assert committed_shards(out) == 6 and not (out / "index.json").exists()
        assert not (out / "data-000006.tar").exists() and not (out / "data-000007.tar").exists()
        res = wdstream.pack([str(messy)], str(out), **kw)  # type: ignore[arg-type]
        assert res.resumed_shards == 6
        assert _files(out) == _files(ref)
        assert (out / "data-000006.prov").read_bytes() == (ref / "data-000006.prov").read_bytes()


def test_stopped_after_publishing_index_json_rerun_finishes(
    tmp_path: Path, big_input: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack stopped after writing index.json but before removing its journal (SIGKILL in
    that window; found by tools/faults.py): the rerun of the same command finishes it
    (exit 0, byte-identical), while another command is still refused."""
    kw = dict(seq_len=31, shard_size="8KB", workers=0)
    ref, out = tmp_path / "ref", tmp_path / "out"
    wdstream.pack([str(big_input)], str(ref), **kw)  # type: ignore[arg-type]
    real_delete = LocalStore.delete

    def delete(self: LocalStore, name: str) -> None:
        if name == JOURNAL_NAME:
            raise KeyboardInterrupt  # stopped right after index.json was published
        real_delete(self, name)

    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "delete", delete)
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(big_input)], str(out), **kw)  # type: ignore[arg-type]
    assert (out / "index.json").exists() and (out / JOURNAL_NAME).exists()
    with pytest.raises(wdstream.WdstreamError, match=r"different command"):
        wdstream.pack([str(big_input)], str(out), seq_len=63, shard_size="8KB", workers=0)
    res = wdstream.pack([str(big_input)], str(out), **kw)  # type: ignore[arg-type]
    assert res.resumed_shards == len(res.index.shards)
    assert _files(out) == _files(ref) and not (out / JOURNAL_NAME).exists()
    with pytest.raises(wdstream.WdstreamError, match=r"already holds a complete dataset"):
        wdstream.pack([str(big_input)], str(out), **kw)  # type: ignore[arg-type]


def _interrupted_writer(victim: str) -> Callable[..., AbstractContextManager[BinaryIO]]:
    """``LocalStore.writer`` that raises KeyboardInterrupt once ``victim``'s bytes are written
    (before the rename that would publish it), as a Ctrl-C in the middle of a write would."""
    real = LocalStore.writer

    @contextmanager
    def writer(self: LocalStore, name: str) -> Iterator[BinaryIO]:
        with real(self, name) as out:
            yield out
            if name == victim:
                raise KeyboardInterrupt

    return writer


def test_different_command_is_refused(tmp_path: Path, big_input: Path) -> None:
    out = tmp_path / "out"
    assert _kill_after(_cmd(big_input, out, 0), out, 2)
    with pytest.raises(
        wdstream.WdstreamError, match=r"different command \(differs in: seq_len\).*--overwrite"
    ):
        wdstream.pack([str(big_input)], str(out), seq_len=63, shard_size="8KB", workers=0)
    res = wdstream.pack(
        [str(big_input)], str(out), seq_len=63, shard_size="8KB", workers=0, overwrite=True
    )
    assert res.resumed_shards == 0
    assert len(list(wdstream.documents(str(out)))) == res.index.total_documents


def test_journal_in_segments_resumes_exactly(
    tmp_path: Path, big_input: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal keeps every SEGMENT committed shards in a segment written once (so a
    pack of n shards writes O(n) journal bytes, not O(n^2)): with SEGMENT = 3, a pack
    interrupted at its 8th shard leaves 2 segments and a live journal of 1 shard, and the
    rerun is byte-identical to an uninterrupted pack; the commit removes every part."""
    kw = dict(seq_len=31, shard_size="8KB", workers=0)
    ref, out = tmp_path / "ref", tmp_path / "out"
    wdstream.pack([str(big_input)], str(ref), **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(journal_module, "SEGMENT", 3)
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer("data-000007.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(big_input)], str(out), **kw)  # type: ignore[arg-type]
    live = json.loads((out / ".wdstream-pack.json").read_text())
    assert live["sealed"] == 2 and len(live["shards"]) == 1
    segment = json.loads((out / ".wdstream-pack-000001.json").read_text())
    assert [s["name"] for s in segment["shards"]] == [f"data-00000{i}.tar" for i in (3, 4, 5)]
    res = wdstream.pack([str(big_input)], str(out), **kw)  # type: ignore[arg-type]
    assert res.resumed_shards == 7
    assert _files(out) == _files(ref)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".wdstream-pack-0")]
