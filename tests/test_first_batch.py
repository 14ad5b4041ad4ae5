"""A fresh loader's first batch waits for its own rows only, and they are the same rows.

The first chunk of an iteration is one step (made by the only process, or by torch worker
0, which makes it as it starts, before it is asked), and its rows read their few samples alone (``WindowReads.samples_alone``) with the window's whole read started behind
them. The oracle is the whole-window path (every window read whole): every batch must be
equal, tokens, labels and document boundaries alike. (That the one-step first chunk gives
the batches of ``K``-step chunks is what the golden-order tests pin.)
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fork_watch import watch_forks
from tests.servers import FileServer
from wdstream import Loader
from wdstream.errors import CorruptShardError
from wdstream.read.order import window_reads
from wdstream.read.order.steps import GlobalPosition
from wdstream.read.torch import dataset
from wdstream.testing import write_synthetic_dataset


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~170 shards of 8 samples of 17 tokens: the first window (1,024 samples) spans 128."""
    root = tmp_path_factory.mktemp("many")
    write_synthetic_dataset(str(root), n_docs=160, sample_tokens=17, samples_per_shard=8)
    return root


def _loader(root: Path, **kw: Any) -> Loader:
    return Loader(str(root), seq_len=16, batch_size=4, seed=3, num_workers=0, epochs=1, **kw)


def _batches(loader: Loader, n: int) -> list[dict[str, torch.Tensor]]:
    out = []
    for b in loader:
        out.append({k: v.clone() for k, v in b.items()})
        if len(out) == n:
            break
    return out


@pytest.mark.parametrize("boundaries", [False, True])
def test_the_first_batches_equal_the_whole_window_path(
    many_shards: Path, monkeypatch: pytest.MonkeyPatch, boundaries: bool
) -> None:
    fast = _batches(_loader(many_shards, return_doc_boundaries=boundaries), 40)
    with monkeypatch.context() as m:
        m.setattr(window_reads, "_ALONE_SHARE", 10**9)  # no rows few enough: whole windows
        whole = _batches(_loader(many_shards, return_doc_boundaries=boundaries), 40)
    assert len(fast) == len(whole) == 40
    for a, b in zip(fast, whole, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_first_batch_reads_its_rows_shards_only(
    many_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = _loader(many_shards)
    order = loader.dataset.sequence.order  # type: ignore[attr-defined]
    cache = order.data._cache
    started: list[tuple[int, int, bool]] = []
    monkeypatch.setattr(cache, "_submit", started.append)  # no read-ahead runs
    it = iter(loader)
    batch = next(it)
    assert batch["input_ids"].shape == (4, 16)
    # 4 rows of one sample each (seq_len + 1 = sample_tokens): at most 4 shards read, of
    # the 128 the first window spans; the window's whole read is named behind them (not
    # cold: the next rows read it whole) but left to the rows that need it: a local
    # source starts no thread.
    assert 1 <= len(order.source.sidecars) <= 4
    assert not cache.cold((0, 0, False)) and started == [] and cache._pool is None
    assert len(order.window(0, 0).positions) == 1024
    next(it)  # the next rows read window 0 whole, here
    assert len(order.source.sidecars) > 4 and started == [] and cache._pool is None
    it.close()


def _chunks_of(loader: Loader, start: int, workers: int, steps: int) -> list[list[tuple[int, int]]]:
    """Each worker's ``(first step, steps)`` chunks from ``start``, up to ``steps`` steps."""
    walker = loader.dataset.sequence.steps  # type: ignore[attr-defined]
    out = []
    for w in range(workers):
        position = GlobalPosition(step=start)
        loader.dataset.begin(position)
        mine = []
        for first, n in walker.own(position, w, workers):
            if first >= start + steps:
                break
            mine.append((first, n))
        out.append(mine)
    return out


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("start", [0, 5, 8])
def test_workers_walk_one_step_first_then_to_multiples_of_k(
    many_shards: Path, workers: int, start: int
) -> None:
    """Worker 0's first chunk is one step; chunk ``j`` is worker ``j % workers``'s and they
    cover the steps in order, each after the first ending at a multiple of ``K`` (4)."""
    loader = _loader(many_shards, chunk_batches=4)
    every = _chunks_of(loader, start, workers, 30)
    assert every[0][0] == (start, 1)
    merged = [c for j in range(max(map(len, every))) for c in (m[j] for m in every if j < len(m))]
    step = start
    for first, n in merged:
        assert first == step and n >= 1
        step += n
        if first != start:
            assert step % 4 == 0
    assert step >= start + 30


def test_a_worker_makes_its_first_chunk_as_it_starts() -> None:
    """``iter(dataset)`` in a Loader's worker makes the first chunk at once; the rest when
    asked."""
    made: list[int] = []

    def chunks() -> Any:
        for i in range(3):
            made.append(i)
            yield i

    it = dataset._started(chunks())
    assert made == [0]
    assert list(it) == [0, 1, 2]
    assert list(dataset._started(iter(()))) == []


def test_a_first_chunk_that_fails_raises_when_asked() -> None:
    """What the first chunk raises (a corrupt sample) is raised at the request, unchanged."""
    error = CorruptShardError("shard 3, sample 7: CRC32C mismatch")

    def chunks() -> Any:
        yield from ()
        raise error

    it = dataset._started(chunks())
    with pytest.raises(CorruptShardError) as got:
        next(it)
    assert got.value is error


@pytest.mark.parametrize("context", [None, "spawn"])
def test_workers_forked_or_spawned_give_the_same_batches(many_shards: Path, context: Any) -> None:
    """Forked workers inherit the hand-off's memory maps; spawned ones are sent torch's
    shared memory: the batches are those of no workers either way."""
    want = _batches(_loader(many_shards, chunk_batches=4), 12)
    got = _batches(Loader(str(many_shards), seq_len=16, batch_size=4, seed=3, num_workers=2,
                          epochs=1, chunk_batches=4, multiprocessing_context=context), 12)  # fmt: skip
    assert len(got) == len(want) == 12
    for a, b in zip(got, want, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels"))


def test_with_workers_the_first_batch_is_made_before_any_worker_starts(
    many_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training process makes the first step itself (forking costs it 10-25 ms a
    worker); the workers are forked at the second batch, with no reader thread alive (a
    forked child would wait on a thread it does not have), and go on from there: the
    batches are those of no workers."""
    forks = watch_forks(monkeypatch)
    want = _batches(_loader(many_shards, chunk_batches=4), 12)
    loader = Loader(str(many_shards), seq_len=16, batch_size=4, seed=3, num_workers=2,
                    epochs=1, chunk_batches=4)  # fmt: skip
    children = set(mp.active_children())  # an earlier test's in this process
    it = iter(loader)
    got = [{k: v.clone() for k, v in next(it).items()}]
    assert forks == [] and set(mp.active_children()) == children
    got += [{k: v.clone() for k, v in b.items()} for b in itertools.islice(it, 11)]
    assert forks == [[], []]  # two workers, forked with no reader thread alive
    for a, b in zip(got, want, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels"))
    state = loader.state_dict()
    rest = [b["input_ids"].clone() for b in it]
    resumed = Loader(str(many_shards), seq_len=16, batch_size=4, seed=3, num_workers=2,
                     epochs=1, chunk_batches=4)  # fmt: skip
    resumed.load_state_dict(state)
    again = [b["input_ids"] for b in resumed]
    assert len(again) == len(rest) > 0
    assert all(torch.equal(a, b) for a, b in zip(again, rest, strict=True))


def test_over_http_the_first_step_leaves_no_fetch_thread_to_the_workers(
    many_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a remote store the first step's samples are fetched concurrently, by threads
    that are stopped before the workers are forked; the batches equal the local ones."""
    want = _batches(_loader(many_shards, chunk_batches=4), 10)
    with FileServer(many_shards) as server:
        forks = watch_forks(monkeypatch)
        got = _batches(Loader(server.base_url, seq_len=16, batch_size=4, seed=3, num_workers=2,
                              epochs=1, chunk_batches=4), 10)  # fmt: skip
    assert forks == [[], []]
    for a, b in zip(got, want, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels"))


def test_persistent_workers_make_every_epoch_after_the_first(many_shards: Path) -> None:
    """Persistent workers run on from the first ``iter()``: the next epochs' first steps
    are theirs, and the two epochs are those of no workers."""
    plain = Loader(str(many_shards), seq_len=16, batch_size=4, seed=3, num_workers=0,
                   epochs=2, chunk_batches=4)  # fmt: skip
    want = [b["input_ids"].clone() for b in plain]
    loader = Loader(str(many_shards), seq_len=16, batch_size=4, seed=3, num_workers=2,
                    epochs=1, chunk_batches=4, persistent_workers=True)  # fmt: skip
    children = set(mp.active_children())  # an earlier test's in this process
    got = [b["input_ids"].clone() for b in loader]
    running = set(mp.active_children()) - children
    assert len(running) == 2
    got += [b["input_ids"].clone() for b in loader]
    assert set(mp.active_children()) - children == running  # the same made epoch 2
    assert len(got) == len(want)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
