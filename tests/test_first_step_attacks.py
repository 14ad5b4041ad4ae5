"""Attacks on the first step a ``Loader`` with workers makes in its training process.

With ``num_workers > 0`` in the global order the training process makes the iteration's
first step itself and forks its workers only when the second batch is asked for. Whatever
the caller does in between (``batch_at`` reads windows, a remote source fetches samples)
must leave no reader thread alive at that fork: a forked child would wait forever on a
read-ahead thread it does not have. The oracles are outside the code under test: the
uninterrupted run without workers, and the shard bytes flipped by hand.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fork_watch import watch_forks
from tests.servers import FileServer
from wdstream import Loader
from wdstream.errors import CorruptShardError
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.torch.device import one_ahead
from wdstream.testing import write_synthetic_dataset

OPTS: dict[str, Any] = dict(seq_len=20, batch_size=2, seed=3, chunk_batches=2)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 documents in 5-sample shards of 33 tokens (rows of 21 tokens cross samples)."""
    root = tmp_path_factory.mktemp("first-step")
    write_synthetic_dataset(str(root), n_docs=40, sample_tokens=33, samples_per_shard=5)
    return root


def _ids(loader: Loader | Any, n: int | None = None) -> list[torch.Tensor]:
    return [b["input_ids"].clone() for b in itertools.islice(loader, n)]


@pytest.mark.parametrize("remote", [False, True])
def test_batch_at_between_the_first_and_second_batch_leaves_no_thread_to_the_workers(
    data: Path, monkeypatch: pytest.MonkeyPatch, remote: bool
) -> None:
    """``batch_at`` after the first batch reads windows ahead in threads of the training
    process; the workers forked at the second batch must not inherit them (they hung,
    waiting on a read-ahead the child does not run). The batches are those of no workers."""
    want = _ids(Loader(str(data), num_workers=0, epochs=2, **OPTS))
    with FileServer(data) as server:
        root = server.base_url if remote else str(data)
        forks = watch_forks(monkeypatch)
        loader = Loader(root, num_workers=2, epochs=2, **OPTS)
        it = iter(loader)
        got = _ids(it, 1)
        assert torch.equal(loader.batch_at(7)["input_ids"], want[7])
        got += _ids(it)
    assert forks == [[], []]
    assert len(got) == len(want)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def _first_step_sample(data: Path, tmp: Path) -> tuple[Path, str]:
    """A copy of ``data`` with one byte flipped in a sample the first step reads (found
    by masking each sample in turn without workers), and that shard's name."""
    shards = json.loads((data / "index.json").read_text())["shards"]
    for shard in shards:
        sidecar = ShardSidecar.from_bytes((data / shard["sidecar"]).read_bytes())
        for k in range(len(sidecar)):
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(data, tmp)
            raw = bytearray((tmp / shard["name"]).read_bytes())
            raw[int(sidecar.offsets[k]) + int(sidecar.sizes[k]) - 3] ^= 0x10
            (tmp / shard["name"]).write_bytes(bytes(raw))
            probe = Loader(str(tmp), num_workers=0, epochs=1, on_corrupt="mask", **OPTS)
            next(iter(probe))
            if probe.quarantined:
                return tmp, shard["name"]
    raise AssertionError("no sample of the first step found")


def test_a_corrupt_sample_of_the_first_step(data: Path, tmp_path: Path) -> None:
    """Raised in the training process, before any fork, naming the shard and the byte;
    masked, the rows, the events and the state are those of no workers."""
    root, name = _first_step_sample(data, tmp_path / "bad")
    loader = Loader(str(root), num_workers=2, epochs=1, **OPTS)
    children = set(mp.active_children())  # an earlier test's in this process
    with pytest.raises(CorruptShardError, match=rf"{name}: sample \d+ at byte \d+") as got:
        next(iter(loader))
    assert "worker" not in str(got.value) and set(mp.active_children()) <= children
    runs = []
    for workers in (0, 2):
        masked = Loader(str(root), num_workers=workers, epochs=1, on_corrupt="mask",
                        max_quarantined=100, **OPTS)  # fmt: skip
        batches = [{k: v.clone() for k, v in b.items()} for b in masked]
        events = [(e.step, e.row, e.shard, e.sample) for e in masked.quarantined]
        runs.append((batches, events, masked.state_dict()))
    (want, want_events, want_state), (got_b, got_events, got_state) = runs
    assert want_events and want_events[0][0] == 0 and got_events == want_events
    assert got_state == want_state and len(got_b) == len(want)
    for a, b in zip(got_b, want, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in b)


def test_device_copies_hand_the_first_chunk_before_asking_for_the_second() -> None:
    """``device=`` copies chunks one ahead of their use, but the first is handed over before
    the second is asked for: asking first would fork the workers before the first batch."""
    pulled: list[int] = []

    def items() -> Iterator[int]:
        for i in range(4):
            pulled.append(i)
            yield i

    it = one_ahead(items(), lambda x: x * 10, lambda y: y // 10)
    assert next(it) == 0 and pulled == [0]
    assert next(it) == 1 and pulled == [0, 1, 2]  # from here one ahead of its use
    assert list(it) == [2, 3] and pulled == [0, 1, 2, 3]
