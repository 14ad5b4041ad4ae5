"""Each torch worker verifies the samples its own chunks use, and together they verify all.

A window is read whole by every worker that cuts chunks from it; checking only the samples a
worker uses divides the checksum work by the worker count. These tests hold the two halves
of that promise: the workers' checked rows partition the rank's rows (for fresh, resumed and
re-based positions, several ranks and worker counts), and a flipped byte in any sample an
epoch reads is still refused with several workers.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import shutil
from pathlib import Path

import numpy as np
import pytest

from wdstream import CorruptShardError, Loader
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.mixture.checks import MixtureOwnRows
from wdstream.read.order.global_sequence import GlobalPosition, GlobalReader, _OwnRows
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store
from wdstream.testing import write_synthetic_dataset

WIN = {"shuffle_window": 10, "shuffle_lanes": 3}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("concat"))
    write_synthetic_dataset(d, n_docs=80, sample_tokens=17, samples_per_shard=7)
    return d


def loader(root: str, world: int, rank: int, **kw: object) -> Loader:
    opts = dict(seq_len=16, batch_size=6 // world, rank=rank, world_size=world, seed=7,
                num_workers=0, order="global", chunk_batches=2, **WIN)  # fmt: skip
    return Loader(root, **{**opts, **kw})  # type: ignore[arg-type]


def rank_rows(reader: GlobalReader, position: GlobalPosition) -> set[tuple[int, int]]:
    """``(epoch, row)`` of every row this rank reads from ``position`` to the iteration end."""
    order, B = reader.order, reader.batch_size
    assert position.iter_stop is not None
    end = order.epoch_end_step(position.iter_stop - 1, position.origin)
    out = set()
    for step in range(position.step, end):
        epoch, row = order.locate(step, position.origin)
        out |= {(epoch, row + reader.rank * B + i) for i in range(B)}
    return out


def checked_rows(
    reader: GlobalReader, position: GlobalPosition, worker: int, workers: int
) -> set[tuple[int, int]]:
    """``(epoch, row)`` of the rows ``worker`` verifies, asked window by window."""
    own = _OwnRows(reader, position.copy(), worker, workers)
    T1, order = reader.row_tokens, reader.order
    assert position.iter_stop is not None
    out = set()
    for epoch in range(position.iter_stop):
        end = order.rows_per_epoch * T1
        for a, b in own.spans(epoch, 0, end):
            assert a % T1 == 0 and b % T1 == 0  # whole rows
            out |= {(epoch, r) for r in range(a // T1, b // T1)}
    return out


@pytest.mark.parametrize("world,rank", [(1, 0), (2, 1), (3, 2)])
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("start", ["fresh", "resumed", "other global batch"])
def test_workers_checked_rows_partition_the_ranks_rows(
    root: str, world: int, rank: int, workers: int, start: str
) -> None:
    ld = loader(root, world, rank)
    if start != "fresh":
        saver = loader(root, 1, 0, batch_size=4 if start == "other global batch" else 6)
        it = iter(saver)
        for _ in range(5):
            next(it)
        ld.load_state_dict(json.loads(json.dumps(saver.state_dict())))
    reader = ld.dataset.sequence
    assert reader is not None and isinstance(ld.dataset.position, GlobalPosition)
    position = ld.dataset.position.copy()
    reader.begin(position, 2)
    want = rank_rows(reader, position)
    parts = [checked_rows(reader, position, w, workers) for w in range(workers)]
    assert sum(len(p) for p in parts) == len(set().union(*parts))  # disjoint
    assert set().union(*parts) == want


def test_a_flip_in_any_sample_an_epoch_reads_is_refused_with_workers(
    root: str, tmp_path: Path
) -> None:
    """Refused, and the workers end with the error."""
    clean = [b for b in loader(root, 1, 0, epochs=1)]
    read = sorted({int(t) // 17 for b in clean for t in b["input_ids"][:, 0]})
    index = read_index(open_store(root))
    firsts = np.cumsum([0] + [s.samples for s in index.shards])
    for k in read[:: max(1, len(read) // 6)]:  # six samples spread over the epoch
        shard = int(np.searchsorted(firsts, k, side="right")) - 1
        entry, j = index.shards[shard], k - int(firsts[shard])
        sidecar = ShardSidecar.from_bytes((Path(root) / entry.sidecar).read_bytes())
        copy = tmp_path / f"flip{k}"
        shutil.copytree(root, copy)
        data = bytearray((copy / entry.name).read_bytes())
        data[int(sidecar.offsets[j]) + 20] ^= 0x10  # a token byte
        (copy / entry.name).write_bytes(bytes(data))
        children = set(mp.active_children())  # an earlier test's in this process
        with pytest.raises(CorruptShardError) as info:
            for _ in loader(str(copy), 1, 0, epochs=1, num_workers=2):
                pass
        assert f"sample {j} at byte {int(sidecar.offsets[j])}" in str(info.value)
        # The workers have ended with the error, though its traceback (held here) keeps the
        # iteration alive: left to the garbage collector, torch waited 5 s for each one.
        assert set(mp.active_children()) <= children


@pytest.fixture(scope="module")
def mixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mix")
    write_synthetic_dataset(str(root / "web"), n_docs=50, sample_tokens=17, samples_per_shard=9)
    write_synthetic_dataset(str(root / "code"), n_docs=6, sample_tokens=17, samples_per_shard=5)
    write_synthetic_dataset(str(root / "books"), n_docs=40, sample_tokens=33, samples_per_shard=6)
    return {name: str(root / name) for name in ("web", "code", "books")}


@pytest.mark.parametrize("world,rank", [(1, 0), (2, 1)])
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("resumed", [False, True])
def test_mixture_workers_checked_rows_partition_the_ranks_rows(
    mixture: dict[str, str], world: int, rank: int, workers: int, resumed: bool
) -> None:
    """Each source's rows this rank reads in 60 steps, across a schedule boundary, are
    verified by exactly one worker."""
    weights = [
        (0, {"web": 0.5, "code": 0.3, "books": 0.2}),
        (23, {"web": 1, "code": 3, "books": 1}),
    ]
    opts = dict(seq_len=16, shuffle_window=12, shuffle_lanes=2, seed=5, chunk_batches=2)
    ld = Loader(mixture, weights=weights, batch_size=6 // world, rank=rank, world_size=world,
                **opts)  # type: ignore[arg-type]  # fmt: skip
    if resumed:
        saver = Loader(mixture, weights=weights, batch_size=6, **opts)  # type: ignore[arg-type]
        it = iter(saver)
        for _ in range(7):
            next(it)
        ld.load_state_dict(json.loads(json.dumps(saver.state_dict())))
    reader, position = ld.dataset.mixture, ld.dataset.position
    assert reader is not None and isinstance(position, GlobalPosition)
    steps = range(position.step, position.step + 60)
    want = set()
    for s in steps:
        src, idx = reader.schedule(position).locate(reader.rank_rows(s, 1, position.origin))
        want |= set(zip(src.tolist(), idx.tolist(), strict=True))
    T1 = reader.row_tokens
    parts = []
    for w in range(workers):
        own = MixtureOwnRows(reader, position, w, workers)
        got = set()
        for i, R in enumerate(reader.rows_per_epoch):
            for epoch in range(1 + max(k for j, k in want if j == i) // R):
                for a, b in own.spans(i, epoch, 0, R * T1):
                    assert a % T1 == 0 and b % T1 == 0  # whole rows
                    got |= {(i, epoch * R + k) for k in range(a // T1, b // T1)}
        parts.append(got & want)
    assert sum(len(p) for p in parts) == len(set().union(*parts))  # disjoint
    assert set().union(*parts) == want


def test_a_flip_in_a_mixture_source_is_refused_with_workers(
    mixture: dict[str, str], tmp_path: Path
) -> None:
    opts = dict(weights={"web": 0.5, "code": 0.3, "books": 0.2}, batch_size=6, seq_len=16,
                shuffle_window=12, shuffle_lanes=2, seed=5, chunk_batches=2)  # fmt: skip
    batches = list(itertools.islice(Loader(mixture, **opts), 30))  # type: ignore[arg-type]
    web = sorted({int(t) // 17 for b in batches for t, s in
                  zip(b["input_ids"][:, 0], b["source"], strict=True) if s == 0})  # fmt: skip
    index = read_index(open_store(mixture["web"]))
    firsts = np.cumsum([0] + [s.samples for s in index.shards])
    for k in web[:: max(1, len(web) // 3)]:
        shard = int(np.searchsorted(firsts, k, side="right")) - 1
        entry, j = index.shards[shard], k - int(firsts[shard])
        sidecar = ShardSidecar.from_bytes((Path(mixture["web"]) / entry.sidecar).read_bytes())
        copy = tmp_path / f"web{k}"
        shutil.copytree(mixture["web"], copy)
        data = bytearray((copy / entry.name).read_bytes())
        data[int(sidecar.offsets[j]) + 20] ^= 0x10  # a token byte
        (copy / entry.name).write_bytes(bytes(data))
        sources = {**mixture, "web": str(copy)}
        with pytest.raises(CorruptShardError) as info:
            for _ in itertools.islice(Loader(sources, num_workers=2, **opts), 30):  # type: ignore[arg-type]
                pass
        assert f"sample {j} at byte {int(sidecar.offsets[j])}" in str(info.value)


def test_a_flip_is_refused_with_workers_when_a_window_mixes_unchecked_shards(
    root: str, tmp_path: Path
) -> None:
    """A shard read without checksums (here: no sidecar, so it is scanned) in the same window
    as checked shards must not turn the checks off for the others' samples."""
    copy = tmp_path / "mixed"
    shutil.copytree(root, copy)
    index = read_index(open_store(root))
    (copy / index.shards[0].sidecar).unlink()  # shard 0: scanned, read unchecked
    # ... which only shards opened without an index.json may be: one that promises a sidecar
    # with checksums for every shard refuses a missing one (issue 33 item 5).
    (copy / "index.json").unlink()
    entry = index.shards[2]
    sidecar = ShardSidecar.from_bytes((copy / entry.sidecar).read_bytes())
    data = bytearray((copy / entry.name).read_bytes())
    data[int(sidecar.offsets[3]) + 20] ^= 0x10  # a token byte of a checked shard's sample
    (copy / entry.name).write_bytes(bytes(data))
    urls = [str(copy / s.name) for s in index.shards]
    # shuffle_window 1000: one window holds every shard's samples.
    opts = dict(seq_len=16, batch_size=6, seed=7, order="global", chunk_batches=2, epochs=1,
                shuffle_window=1000, shuffle_lanes=3)  # fmt: skip
    with pytest.warns(UserWarning, match="read unchecked"):
        with pytest.raises(CorruptShardError) as info:
            for _ in Loader(urls, num_workers=2, **opts):  # type: ignore[arg-type]
                pass
    assert entry.name in str(info.value)
    assert f"sample 3 at byte {int(sidecar.offsets[3])}" in str(info.value)


def test_copy_time_checks_cut_samples_and_a_failed_check_stays_pending(tmp_path: Path) -> None:
    """A worker's copy-time checks (token windows) with samples of 33 tokens in rows of 17,
    so most samples are cut across rows, fills and windows: the rows equal those of a reader
    that verifies whole reads, a flipped byte is refused naming its sample, and refused
    again when the same rows are filled once more (a sample whose check failed is not
    marked verified)."""
    clean = tmp_path / "clean"
    write_synthetic_dataset(str(clean), n_docs=60, sample_tokens=33, samples_per_shard=7)
    opts = dict(seq_len=16, batch_size=6, seed=7, order="global", chunk_batches=2, **WIN)

    def rows(root: Path, worker: bool) -> list[np.ndarray]:
        order = Loader(str(root), **opts).dataset.sequence.order  # type: ignore[arg-type, union-attr]
        if worker:
            order.data.check_only(lambda epoch, a, b: [])  # a torch worker of several
        out = []
        for row in range(0, order.rows_per_epoch - 4, 5):  # fills of 5 rows, any alignment
            tokens = np.empty((5, 17), dtype=np.int32)
            order.fill(0, row, tokens, None)
            out.append(tokens)
        return out

    got, want = rows(clean, True), rows(clean, False)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    index = read_index(open_store(str(clean)))
    entry = index.shards[1]
    sidecar = ShardSidecar.from_bytes((clean / entry.sidecar).read_bytes())
    bad = tmp_path / "bad"
    shutil.copytree(clean, bad)
    data = bytearray((bad / entry.name).read_bytes())
    data[int(sidecar.offsets[4]) + 90] ^= 0x10  # a token byte in the sample's second row
    (bad / entry.name).write_bytes(bytes(data))
    order = Loader(str(bad), **opts).dataset.sequence.order  # type: ignore[arg-type, union-attr]
    order.data.check_only(lambda epoch, a, b: [])
    tokens = np.empty((5, 17), dtype=np.int32)
    failed = None
    for row in range(0, order.rows_per_epoch - 4, 5):
        try:
            order.fill(0, row, tokens, None)
        except CorruptShardError as exc:
            failed = row, str(exc)
            break
    assert failed is not None, "the flipped byte was not refused"
    assert f"sample 4 at byte {int(sidecar.offsets[4])}" in failed[1]
    with pytest.raises(CorruptShardError, match=f"sample 4 at byte {int(sidecar.offsets[4])}"):
        order.fill(0, failed[0], tokens, None)
