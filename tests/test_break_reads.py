"""Leaving a remote iteration early (a ``break``) does not wait for the GETs in flight
(read/sources/fetches.py): a stalled GET at the break no longer holds the loop's end for
the store's read timeout, the GETs left behind never reach a later iteration's data, and
the threads they keep stay within the stated bound however often a loop breaks.

Real components: the repo's HTTP file server, made to cut every GET after 300 bytes and then
go silent (its header promised more) once the first batches are out. Oracle: the same
batches read from the local pack, with the same break.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.servers import FileServer
from wdstream import Loader
from wdstream.read.order.read_ahead import AHEAD_MAX
from wdstream.read.sources.fetches import DROPPED_MAX, REMOTE_READS, join_dropped

pytestmark = pytest.mark.timeout(180)

PACK_ARGS = ["--seq-len", "64", "--shard-size", "64KB", "--workers", "0", "-q"]
KW: dict[str, Any] = {"seq_len": 64, "batch_size": 4, "epochs": 1, "shuffle_window": 64,
                      "shuffle_lanes": 4}  # fmt: skip
STALL = {"cut_every": 1, "cut_at": 300, "stall": True, "methods": ("GET",)}


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import pack_cli_corpus

    return pack_cli_corpus(tmp_path_factory.mktemp("brk"), PACK_ARGS)


def _rows(batch: dict[str, Any]) -> list[list[int]]:
    return batch["input_ids"].tolist()


def _reader_threads() -> int:
    """The reader's threads alive: fetch and read-ahead (not the test server's)."""
    names = ("wdstream-fetch", "wdstream-readahead")
    return sum(t.name.startswith(names) for t in threading.enumerate())


def _leave(it: Iterator[Any]) -> float:
    """End iterator ``it`` as a ``break`` does (the loop drops it, which closes it); the
    seconds that took."""
    t0 = time.perf_counter()
    cast(Generator[Any, None, None], it).close()
    return time.perf_counter() - t0


def _until_a_get_stalls(it: Iterator[dict[str, Any]], server: FileServer) -> list[Any]:
    """Batches taken after the server began stalling, until a GET (a window read ahead)
    is in flight at it; that GET is then stalled (cut after 300 bytes, then silence)."""
    got: list[list[list[int]]] = []
    for _ in range(200):
        end = time.monotonic() + 0.3  # a read started behind the last batch shows up first
        while time.monotonic() < end:
            if any(m == "GET" for m, _, _ in server.faults.requests):
                time.sleep(0.2)  # its 300 bytes sent: stalled
                return got
            time.sleep(0.01)
        got.append(_rows(next(it)))
    raise AssertionError("no GET within 200 batches: nothing read ahead to stall")


def test_a_break_over_a_stalled_get_returns_at_once_and_the_next_iteration_is_right(
    pack: Path,
) -> None:
    """A GET stalled at the break (the server went silent mid-body; read timeout 10 s):
    leaving the loop takes well under the read timeout (it waited the whole timeout
    before), and the next iteration's batches, after the server heals, are those of the
    local pack with the same break: nothing the dropped GET brought reached them."""
    timeout = 10.0
    with FileServer(pack) as server:
        loader = Loader(server.base_url, num_workers=0, timeout=timeout, retries=1,
                        backoff=0.001, **KW)  # fmt: skip
        it = iter(loader)
        first = [_rows(next(it)) for _ in range(2)]
        server.faults.reset(**STALL)
        first += _until_a_get_stalls(it, server)
        took = _leave(it)
        server.faults.reset()
        again = [_rows(b) for b in loader]
    local = Loader(str(pack), num_workers=0, **KW)
    want_it = iter(local)
    want_first = [_rows(next(want_it)) for _ in range(len(first))]
    _leave(want_it)
    want_again = [_rows(b) for b in local]
    assert took < timeout / 4, f"the break took {took:.2f}s (read timeout {timeout:g}s)"
    assert first == want_first
    assert again == want_again


def test_many_breaks_keep_the_threads_bounded_and_they_all_end(pack: Path) -> None:
    """A loop broken again and again, a GET stalled at every break (read timeout 3 s, no
    retry): the first ``DROPPED_MAX`` breaks return at once, none waits longer than one
    stalled GET, the reader's threads never exceed the stated bound, and once the dropped
    GETs are joined (as before a fork) none is left."""
    timeout, cycles = 3.0, 5
    bound = (1 + DROPPED_MAX) * REMOTE_READS + AHEAD_MAX
    join_dropped()
    base = _reader_threads()
    took, seen = [], []
    with FileServer(pack) as server:
        loader = Loader(server.base_url, num_workers=0, timeout=timeout, retries=0,
                        backoff=0.001, **KW)  # fmt: skip
        for _ in range(cycles):
            server.faults.reset()
            it = iter(loader)
            next(it)
            server.faults.reset(**STALL)
            _until_a_get_stalls(it, server)
            took.append(_leave(it))
            seen.append(_reader_threads() - base)
        t0 = time.perf_counter()
        join_dropped()
        joined = time.perf_counter() - t0
        left = _reader_threads() - base
    assert max(seen) <= bound, (seen, bound)
    assert all(t < timeout / 4 for t in took[:DROPPED_MAX]), took
    assert all(t < timeout + 1.5 for t in took), took
    assert joined < timeout + 1.5 and left == 0, (joined, left)


def test_a_dropped_window_releases_its_takers_of_the_pieces_never_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch worker's window read dropped (its iteration ended) while pieces it claimed
    for a peer were still queued behind its fetch threads: the peer waiting for them is told
    at once that they will not come (a failure mark), as for the pieces its reads skipped.
    Dropping the fetch pool cancels the queued fetches, so they never ran the read's own
    ``abandon``, and the peer waited ``SHARE_WAIT_S`` (60 s) for each such piece, e.g. a
    persistent worker still filling a chunk while its peer went on to the next iteration.

    Real components: a ShardSource over the repo's HTTP file server (each shard's GET held
    0.5 s, so 16 GETs are in flight and the rest queued), the exchange's folder. Oracle:
    the taker's wall time per piece, and the bytes it gets against the local pack's."""
    from wdstream.read.sources import exchange
    from wdstream.read.sources.exchange import ReadShare, SharedPieces
    from wdstream.read.sources.packed import ShardSource
    from wdstream.testing import write_synthetic_dataset

    root = tmp_path / "ds"
    write_synthetic_dataset(str(root), n_docs=120, sample_tokens=65, samples_per_shard=40)
    pieces = [(s, k, k + 1) for s in range(3) for k in range(0, 40, 4)]  # 30 > 16 threads
    n = len(pieces)
    folder = str(tmp_path / "share")
    monkeypatch.setattr(exchange, "SHARE_WAIT_S", 4.0)
    with FileServer(root) as server:
        source = ShardSource(server.base_url)
        for s in range(3):
            source.sidecars.get(s)  # not fetched in the timed window below
        server.faults.reset(delay=0.5, methods=("GET",), only=".tar")
        shared = SharedPieces(ReadShare(folder, 0), (0, 0), [0] * n, [(1,)] * n)
        stop = threading.Event()
        failed: list[BaseException] = []

        def read() -> None:
            try:
                source.read(pieces, shared=shared, stop=stop)
            except BaseException as exc:  # noqa: BLE001 - the read's end is asserted below
                failed.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.2)  # 16 GETs in flight, the rest queued
        stop.set()
        shared.share.end()
        reader.join(5)
        source.end_fetches()
        taker = ReadShare(folder, 1)
        waits = []
        for j in range(n):
            t0 = time.perf_counter()
            taker.take((0, 0), j, 0)
            waits.append(time.perf_counter() - t0)
        join_dropped()
    assert failed and type(failed[0]).__name__ == "CancelledError", failed
    assert max(waits) < 2.0, [round(w, 2) for w in waits]
