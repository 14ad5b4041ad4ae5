"""The writer lock: two packs into one output never both run; a killed pack's lock is handled.

Real components: the concurrent and the killed packs are ``python -m wdstream.cli pack``
subprocesses (reruns and refused packs may run in this process), S3 is moto's server on
127.0.0.1, HTTP is the test file server. A pack reading its input from a pipe the test holds
stays alive, holding its lock, for exactly as long as the test wants.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Barrier

import boto3
import pytest
from click.testing import CliRunner

import wdstream
from tests.conftest import make_corpus
from tests.fixtures_remote import _s3_proxy, aws_env, moto_endpoint, s3_bucket, s3_proxy  # noqa: F401
from tests.servers import FaultProxy, FileServer
from tests.test_pack_resume import _files, _kill_after, _without_provenance
from wdstream.cli import main
from wdstream.errors import PackLockedError
from wdstream.storage import LocalStore, Store, open_store
from wdstream.write.lock import LOCK_NAME, LockOwner, OutputLock, acquire
from wdstream.write.pack import JOURNAL_NAME

OPTS = ["--seq-len", "31", "--shard-size", "8KB", "--workers", "0", "--quiet"]
KW: dict[str, object] = {"seq_len": 31, "shard_size": "8KB", "workers": 0}
_DEADLINE = 30  # seconds any one wait may take on a loaded machine


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~12 KB of JSONL: 9 shards of 8 KB (few, so the S3 packs stay quick)."""
    path = tmp_path_factory.mktemp("lock") / "in.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for t in make_corpus(n_docs=20, seed=3, stdlib_files=0):
            f.write(json.dumps({"text": t}) + "\n")
    return path


@pytest.fixture(scope="module")
def expected(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The files of a solo pack of ``corpus``."""
    ref = tmp_path_factory.mktemp("lock-ref") / "ref"
    wdstream.pack([str(corpus)], str(ref), **KW)  # type: ignore[arg-type]
    return _files(ref)


def _committed(store: Store) -> int:
    """Shards the pack writing to ``store`` has committed so far (its journal's count)."""
    try:
        return len(json.loads(store.read(JOURNAL_NAME))["shards"])
    except FileNotFoundError:
        return 0


def _pack_cmd(inp: str, out: str) -> list[str]:
    return [sys.executable, "-m", "wdstream.cli", "pack", inp, "-o", out, *OPTS]


def _wait_for(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + _DEADLINE
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@functools.cache
def _store(url: str) -> Store:
    return open_store(url)  # one per URL: polling must not build an S3 client per call


def _owner(url: str) -> LockOwner | None:
    try:
        return LockOwner.parse(_store(url).read(LOCK_NAME))
    except FileNotFoundError:
        return None


def _race(out: str, data: bytes) -> str:
    """Start two identical packs of stdin into ``out`` at once; neither gets input until one
    has given up, then the other gets ``data``. Checks that the one that gave up failed on
    the lock naming the other, and that the other finished; returns the failed one's stderr.
    """
    procs = [
        subprocess.Popen(_pack_cmd("-", out), stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    try:
        _wait_for("one pack to give up", lambda: any(p.poll() is not None for p in procs))
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        assert loser.stderr is not None
        err = loser.stderr.read().decode()
        assert loser.returncode != 0, err
        assert winner.poll() is None, "the lock holder died"
        owner = _owner(out)
        assert owner is not None and owner.pid == winner.pid
        assert f"another pack has been writing to {out} since {owner.started} " in err
        assert f"(pid {winner.pid} on host {socket.gethostname()})" in err
        _finish(winner, data)
        return err
    finally:
        for p in procs:
            _stop(p)


def _finish(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Give a pack waiting on stdin its input; it must succeed."""
    assert proc.stdin is not None
    proc.stdin.write(data)
    proc.stdin.close()
    assert proc.wait(_DEADLINE) == 0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_two_concurrent_local_packs_one_wins(
    tmp_path: Path, corpus: Path, expected: dict[str, bytes]
) -> None:
    out = tmp_path / "out"
    err = _race(str(out), corpus.read_bytes())
    assert "wait for it, or stop it" in err
    # A pack of stdin equals a pack of the file, but for the input name in the provenance.
    got = _files(out)
    assert _without_provenance(got) == _without_provenance(expected)
    assert got.keys() == expected.keys()
    assert not (out / LOCK_NAME).exists() and not (out / JOURNAL_NAME).exists()


def test_concurrent_s3_pack_is_refused(
    corpus: Path,
    expected: dict[str, bytes],
    s3_bucket: str,  # noqa: F811
) -> None:
    """A pack process holds the S3 lock; a second pack (in this process) is refused naming
    it, and the first finishes complete. The second starts once the first holds the lock:
    moto checks ``If-None-Match`` and stores the object in two steps, so only a real S3
    makes simultaneous conditional puts atomic."""
    url = f"s3://{s3_bucket}/ds"
    first = subprocess.Popen(_pack_cmd("-", url), stdin=subprocess.PIPE)
    try:
        _wait_for("the first pack's lock", lambda: _owner(url) is not None or _ended(first))
        owner = _owner(url)
        assert owner is not None and owner.pid == first.pid
        with pytest.raises(PackLockedError) as info:
            wdstream.pack([str(corpus)], url, **KW)  # type: ignore[arg-type]
        assert str(info.value) == (
            f"another pack has been writing to {url} {owner.describe()}; wait for it, or if "
            "it is dead run with --force-unlock"
        )
        assert first.poll() is None, "the lock holder died"
        _finish(first, corpus.read_bytes())
    finally:
        _stop(first)
    got = _s3_files(s3_bucket, "ds/")  # complete; no lock, no journal left
    assert _without_provenance(got) == _without_provenance(expected)  # stdin: input name
    assert got.keys() == expected.keys()


def _ended(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is not None


def _s3_files(bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix``, dotted names included (lock, journal)."""
    client = boto3.client("s3")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    return {k[len(prefix) :]: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def _take_at_once(store: LocalStore, takers: int) -> list[OutputLock | PackLockedError]:
    """``takers`` threads call :func:`acquire` together, each with its own descriptor, as
    separate processes would."""
    barrier = Barrier(takers)

    def take(_: int) -> OutputLock | PackLockedError:
        barrier.wait()
        try:
            return acquire(store)
        except PackLockedError as exc:
            return exc

    with ThreadPoolExecutor(takers) as ex:
        return list(ex.map(take, range(takers)))


def test_local_lock_contention_in_threads(tmp_path: Path) -> None:
    """Exactly one of many simultaneous takers holds the lock; once it releases, the next
    round again has exactly one (a released file is never locked by two)."""
    store = LocalStore(tmp_path, create=True)
    for _ in range(5):
        results = _take_at_once(store, 8)
        held = [r for r in results if isinstance(r, OutputLock)]
        assert len(held) == 1, results
        held[0].release()
        assert not (tmp_path / LOCK_NAME).exists()


def test_sigkilled_local_pack_is_taken_over(
    tmp_path: Path, corpus: Path, expected: dict[str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """The kernel dropped the dead pack's lock; its record names a pid that is gone on this
    host, so the rerun takes over (saying so) and finishes byte-identical."""
    out = tmp_path / "out"
    cmd = _pack_cmd(str(corpus), str(out))
    assert _kill_after(cmd, out, 2), "pack finished before it could be killed"
    dead = LockOwner.parse((out / LOCK_NAME).read_bytes())
    assert dead is not None and dead.is_gone()
    with caplog.at_level(logging.WARNING, "wdstream.write"):
        wdstream.pack([str(corpus)], str(out), **KW)  # type: ignore[arg-type]
    assert f"taking over the lock of a pack that is gone: {dead.describe()}" in caplog.messages
    assert _files(out) == expected
    assert not (out / LOCK_NAME).exists()


def test_sigkilled_s3_pack_needs_force_unlock(
    corpus: Path,
    expected: dict[str, bytes],
    s3_bucket: str,  # noqa: F811
    s3_proxy: FaultProxy,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A killed pack's lock object stays: the rerun is refused naming it, and takes over
    with --force-unlock, resuming to the uninterrupted result."""
    url = f"s3://{s3_bucket}/ds"
    store = _store(url)

    def committed() -> int:
        return _committed(store)

    # The pack to kill writes through a proxy that holds each journal PUT for 0.3 s, so its
    # 9 commits take >= 2.7 s and the test (reading moto directly) sees 2 of them with
    # seconds to spare, however loaded the machine: unslowed, it once finished first.
    s3_proxy.faults.reset(delay=0.3, methods=("PUT",), only=JOURNAL_NAME)
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_proxy.base_url}
    proc = subprocess.Popen(_pack_cmd(str(corpus), url), stderr=subprocess.DEVNULL, env=env)
    try:
        _wait_for("2 committed shards", lambda: committed() >= 2 or _ended(proc))
        assert proc.poll() is None, "pack finished before it could be killed"
    finally:
        proc.kill()
        proc.wait()
    # A journal PUT held by the proxy when the pack died still reaches moto afterwards:
    # let it land before the reruns, or it would bring back the journal they remove.
    assert s3_proxy.forwarding.wait_idle(_DEADLINE), "the proxy is still forwarding"
    puts = [p for m, p, _ in s3_proxy.faults.requests if m == "PUT" and JOURNAL_NAME in p]
    assert len(puts) >= 2, "the killed pack did not write through the slowing proxy"
    dead = _owner(url)
    assert dead is not None and dead.pid == proc.pid

    with pytest.raises(PackLockedError) as info:
        wdstream.pack([str(corpus)], url, **KW)  # type: ignore[arg-type]
    assert str(info.value) == (
        f"another pack has been writing to {url} {dead.describe()}; wait for it, or if it is "
        "dead run with --force-unlock"
    )
    assert _owner(url) == dead  # refused without touching anything

    with caplog.at_level(logging.WARNING, "wdstream.write"):
        wdstream.pack([str(corpus)], url, force_unlock=True, **KW)  # type: ignore[arg-type]
    assert f"--force-unlock: removing the lock of {dead.describe()}" in caplog.messages
    assert _s3_files(s3_bucket, "ds/") == expected  # no lock, no journal left


def test_force_unlock_never_takes_a_running_packs_lock(tmp_path: Path, corpus: Path) -> None:
    holder = acquire(LocalStore(tmp_path / "out", create=True))
    try:
        with pytest.raises(PackLockedError, match="still running.*--force-unlock cannot"):
            wdstream.pack([str(corpus)], str(tmp_path / "out"), force_unlock=True, **KW)  # type: ignore[arg-type]
        assert _owner(str(tmp_path / "out")) == holder.owner
    finally:
        holder.release()


def _left_behind(root: Path, **changes: object) -> LockOwner:
    """Write a lock record for this process with ``changes``, as a dead owner leaves it."""
    root.mkdir(parents=True, exist_ok=True)
    owner = LockOwner(**{**LockOwner.this_process().__dict__, **changes})
    (root / LOCK_NAME).write_bytes(owner.to_bytes())
    return owner


@pytest.mark.parametrize(
    ("changes", "taken"),
    [
        ({"host": "another-host"}, False),  # cannot be checked from here
        ({}, False),  # a live process of this host (this one) named, though its lock is free
        ({"pid_started": -1}, True),  # the pid now belongs to another process
    ],
)
def test_left_behind_local_lock(
    tmp_path: Path,
    corpus: Path,
    expected: dict[str, bytes],
    changes: dict[str, object],
    taken: bool,
) -> None:
    """Through the command line, so ``--force-unlock`` is exercised as users pass it."""
    out = tmp_path / "out"
    owner = _left_behind(out, **changes)
    cmd = ["pack", str(corpus), "-o", str(out), *OPTS]
    if not taken:
        refused = CliRunner().invoke(main, cmd)
        assert refused.exit_code == 1
        assert f"{owner.describe()}; wait for it, or if it is dead run with --force-unlock" in (
            refused.stderr
        )
        assert LockOwner.parse((out / LOCK_NAME).read_bytes()) == owner
        cmd.append("--force-unlock")
    done = CliRunner().invoke(main, cmd)
    assert done.exit_code == 0, done.output
    assert _files(out) == expected and not (out / LOCK_NAME).exists()


def test_http_lock(tmp_path: Path, corpus: Path, expected: dict[str, bytes]) -> None:
    root = tmp_path / "served"
    root.mkdir()
    with FileServer(root) as server:
        url = server.base_url + "/ds"
        holder = acquire(open_store(url))
        with pytest.raises(PackLockedError, match=rf"writing to {url} since .*--force-unlock"):
            wdstream.pack([str(corpus)], url, **KW)  # type: ignore[arg-type]
        wdstream.pack([str(corpus)], url, force_unlock=True, **KW)  # type: ignore[arg-type]
        with pytest.raises(PackLockedError, match="taken away while this pack ran;"):
            holder.verify()
        newer = acquire(open_store(url))
        holder.release()  # no longer its lock: leaves the newer owner's alone
        newer.verify()
        newer.release()
    assert {p.name: p.read_bytes() for p in (root / "ds").iterdir()} == expected


def test_lock_released_when_pack_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{broken\n')
    with pytest.raises(wdstream.InputError):
        wdstream.pack([str(bad)], str(tmp_path / "out"), **KW)  # type: ignore[arg-type]
    assert not (tmp_path / "out" / LOCK_NAME).exists()


def test_s3_lock_taken_over_midway_stops_publishing(
    corpus: Path,
    s3_bucket: str,  # noqa: F811
) -> None:
    """A real pack on the moto server has committed shards when another pack takes its lock
    with --force-unlock; it writes the rest of its shards but publishes no index.json, and
    fails naming the new owner, whose lock it leaves alone."""
    url = f"s3://{s3_bucket}/ds"
    store = _store(url)

    def committed() -> int:
        return _committed(store)

    # Small tokenisation batches, so shards commit while the input still arrives.
    code = (
        "import sys, wdstream; wdstream.pack(['-'], sys.argv[1], seq_len=31, "
        "shard_size='8KB', workers=0, batch_bytes=500, progress=False)"
    )
    lines = corpus.read_bytes().splitlines(keepends=True)
    first = subprocess.Popen(
        [sys.executable, "-c", code, url], stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )
    second = None
    try:
        assert first.stdin is not None and first.stderr is not None
        first.stdin.write(b"".join(lines[: len(lines) // 2]))
        first.stdin.flush()
        _wait_for("a committed shard", lambda: committed() >= 1 or _ended(first))
        assert first.poll() is None, "the first pack ended early"
        owner = _owner(url)
        assert owner is not None and owner.pid == first.pid
        # Another writer takes the output over and holds it, waiting for its input.
        second = subprocess.Popen(
            [*_pack_cmd("-", url), "--force-unlock"], stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        # (--force-unlock deletes the old lock, then creates its own: no owner in between)
        _wait_for(
            "the second pack's lock", lambda: _owner(url) not in (owner, None) or _ended(second)
        )
        taker = _owner(url)
        assert taker is not None and taker.pid == second.pid
        at_takeover = committed()
        first.stdin.write(b"".join(lines[len(lines) // 2 :]))
        first.stdin.close()
        assert first.wait(_DEADLINE) != 0
        err = first.stderr.read().decode()
        assert "PackLockedError" in err and f"by {taker.who}" in err, err
        assert committed() > at_takeover  # it went on writing shards after the takeover
        assert not store.exists("index.json")  # but published nothing
        assert _owner(url) == taker  # and left the new owner's lock in place
        assert second.poll() is None, "the new owner died"
    finally:
        for p in (first, second):
            if p is not None:
                _stop(p)
    assert not store.exists("index.json")
