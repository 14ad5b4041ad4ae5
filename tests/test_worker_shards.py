"""Shards built in the token pool's workers (``wdstream/write/worker_shards.py``): the same
bytes as the packing process's own pipeline, no shard built in the packing process, a killed
pack resumes exactly and leaves no shared memory behind."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import wdstream
import wdstream.write.local as local_engine
from tests.conftest import make_corpus
from tests.fixtures_remote import aws_env, moto_endpoint, s3_bucket  # noqa: F401 - fixtures
from tests.test_pack_faults import _corpus, small_disk  # noqa: F401 - a fixture
from tests.test_pack_lock import _s3_files
from tests.test_pack_resume import _cmd, _files, _kill_after, _pack

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")


def _inputs(tmp_path: Path) -> list[str]:
    """Two JSONL files with blank, empty and malformed lines among the documents."""
    docs = make_corpus(n_docs=90, seed=3, stdlib_files=1)
    paths = []
    for k, part in enumerate((docs[:50], docs[50:])):
        lines = [json.dumps({"text": t}) for t in part]
        lines[7:7] = ["", "   ", '{"text": ""}', "{not json", '{"other": 1}']
        path = tmp_path / f"in{k}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


@pytest.mark.parametrize(
    "options",
    [
        dict(mode="concat", seq_len=100, shard_size="20KB"),
        dict(mode="docs", seq_len=4000, shard_size="30KB", shard_samples=5),
        dict(mode="concat", seq_len=63, shard_size="8KB", bos=True, eos=False),
    ],
)
def test_workers_write_the_packing_processes_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    """A fresh 2-worker pack builds no shard in the packing process, and its files (shards,
    sidecars, provenance, index.json, the shard table) equal a 0-worker pack's."""
    inputs = _inputs(tmp_path)
    kw: dict[str, Any] = dict(backend="tiktoken", batch_bytes=4096, on_error="skip", **options)
    wdstream.pack(inputs, str(tmp_path / "ref"), workers=0, **kw)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the packing process built a shard")

    monkeypatch.setattr(local_engine, "ShardWriter", refused)
    res = wdstream.pack(inputs, str(tmp_path / "out"), workers=2, **kw)
    assert res.pool == "processes"
    ref, out = _files(tmp_path / "ref"), _files(tmp_path / "out")
    assert len(ref) > 9
    assert out == ref


def test_a_bad_record_stops_it_naming_the_line(tmp_path: Path) -> None:
    """``on_error="raise"``: the first bad line in input order is the error, as ever."""
    inputs = _inputs(tmp_path)
    with pytest.raises(wdstream.InputError, match=r"in0\.jsonl:11: "):
        wdstream.pack(inputs, str(tmp_path / "out"), workers=2, seq_len=100,
                      shard_size="8KB", backend="tiktoken", batch_bytes=4096)  # fmt: skip


def _segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("wds")}


def test_killed_fresh_pack_resumes_exactly_and_leaves_no_segments(tmp_path: Path) -> None:
    """SIGKILL a fresh 2-worker pack after some commits: its token segments go with it, and
    the rerun (which resumes) ends byte-identical to an uninterrupted pack."""
    src = tmp_path / "in.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for t in make_corpus(n_docs=150, seed=1, stdlib_files=1):
            f.write(json.dumps({"text": t}) + "\n")
    ref = tmp_path / "ref"
    _pack(src, ref, 0)
    expected = _files(ref)
    before = _segments()
    out = tmp_path / "out"
    assert _kill_after(_cmd(src, out, 2), out, 5), "pack finished before it could be killed"
    assert not (out / "index.json").exists()
    deadline = time.monotonic() + 10
    while _segments() - before and time.monotonic() < deadline:
        time.sleep(0.05)  # the killed pack's resource tracker unlinks them
    assert not _segments() - before
    _pack(src, out, 2)
    assert _files(out) == expected


def test_full_disk_in_a_worker_names_the_shard_then_rerun(
    tmp_path: Path,
    small_disk: Path,  # noqa: F811 - the fixture imported above
) -> None:
    """A worker's write that runs out of space: the error names the shard, nothing
    half-written stays, and the rerun (with room again) resumes to the same bytes."""
    src = _corpus(tmp_path / "in.jsonl", 400)
    kw: dict[str, Any] = dict(seq_len=7, shard_size="256KB", backend="tiktoken", batch_bytes=4096)
    wdstream.pack([str(src)], str(tmp_path / "ref"), workers=0, **kw)
    expected = _files(tmp_path / "ref")
    out = small_disk / "out"
    with pytest.raises(wdstream.WdstreamError) as info:
        wdstream.pack([str(src)], str(out), workers=2, **kw)
    message = str(info.value)
    assert message.startswith(f"no space left on device while writing {out}/data-0000"), message
    assert message.endswith("it resumes from the last complete shard")
    left = _files(out)
    assert left and all(expected[name] == data for name, data in left.items())
    assert not [p for p in out.iterdir() if p.name.endswith(".partial")]
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    assert wdstream.pack([str(src)], str(out), workers=2, **kw).resumed_shards >= 1
    assert _files(out) == expected


def test_s3_output_keeps_the_usual_pipeline(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_bucket: str,  # noqa: F811 - the fixture imported above
) -> None:
    """An object store as the output is written by the packing process, as before: the
    pool's workers fork from a server that may predate the credentials (here it is started
    without them, by a local pack), and would fail to write with the server's environment."""
    inputs = _inputs(tmp_path)
    kw: dict[str, Any] = dict(
        seq_len=63, shard_size="16KB", backend="tiktoken", on_error="skip", batch_bytes=4096
    )
    wdstream.pack(inputs, str(tmp_path / "ref"), workers=0, **kw)
    creds = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    saved = {k: os.environ[k] for k in creds}
    for k in creds:
        monkeypatch.delenv(k)
    wdstream.pack(inputs, str(tmp_path / "local"), workers=2, **kw)  # the fork server starts
    for k, v in saved.items():
        monkeypatch.setenv(k, v)
    wdstream.pack(inputs, f"s3://{s3_bucket}/ds", workers=2, **kw)
    assert _s3_files(s3_bucket, "ds/") == _files(tmp_path / "ref")


def test_relative_output_after_a_chdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative output is the packing process's: the workers, forked from a server
    started in another directory, write under the absolute path it resolves to."""
    inputs = _inputs(tmp_path)
    kw: dict[str, Any] = dict(seq_len=100, shard_size="20KB", backend="tiktoken", batch_bytes=4096)
    wdstream.pack(inputs, str(tmp_path / "ref"), workers=2, on_error="skip", **kw)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    wdstream.pack(inputs, "out", workers=2, on_error="skip", **kw)
    assert _files(here / "out") == _files(tmp_path / "ref")


def _shm_full(*args: object, **kwargs: object) -> None:
    raise OSError(28, "No space left on device")  # what SemLock raises on a full /dev/shm


@pytest.mark.parametrize("pool", ["workers' shards", "usual pipeline"])
def test_a_full_dev_shm_at_the_pool_start_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: str
) -> None:
    """A /dev/shm with no room for the pool's semaphores (found by the faults harness: a
    bare ``OSError`` and ``multiprocessing``'s traceback) is a WdstreamError naming it,
    whichever pipeline the pack takes."""
    import wdstream.write.tokenpool as tokenpool

    if pool == "usual pipeline":
        monkeypatch.setattr(local_engine, "workers_can_write", lambda *a: False)
    monkeypatch.setattr(tokenpool, "ProcessPoolExecutor", _shm_full)
    with pytest.raises(wdstream.WdstreamError, match=r"/dev/shm.*full.*workers=0"):
        wdstream.pack(_inputs(tmp_path), str(tmp_path / "out"), workers=2, pool="processes",
                      seq_len=100, backend="tiktoken", on_error="skip")  # fmt: skip


@pytest.mark.parametrize(
    ("refusal", "blamed"),
    [((28, "No space left on device"), True), ((13, "Permission denied"), True),
     ((24, "Too many open files"), False), ((12, "Cannot allocate memory"), False)],
)  # fmt: skip
def test_only_a_refusal_of_dev_shm_is_blamed_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: tuple[int, str], blamed: bool
) -> None:
    """Too many open files, or no memory, at the pool's start is not /dev/shm's fault: the
    error is raised as it is, not worded as a full /dev/shm."""
    import wdstream.write.tokenpool as tokenpool

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(*refusal)

    monkeypatch.setattr(tokenpool, "ProcessPoolExecutor", refuse)
    with pytest.raises((OSError, wdstream.WdstreamError)) as caught:
        wdstream.pack(_inputs(tmp_path), str(tmp_path / "out"), workers=2, pool="processes",
                      seq_len=100, backend="tiktoken", on_error="skip")  # fmt: skip
    assert isinstance(caught.value, wdstream.WdstreamError) == blamed
    assert ("/dev/shm" in str(caught.value)) == blamed
