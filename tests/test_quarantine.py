"""Quarantine (``on_corrupt="mask"``): a row that cannot be delivered as packed is masked in
its place, every other row is the clean dataset's, and each event is recorded.

The oracle is the clean dataset's uninterrupted run. Token ``t`` of the synthetic dataset is
the integer ``t`` and every sample holds ``SAMPLE`` tokens, so ``t // SAMPLE`` names the
sample a token of a clean row came from: a row is affected exactly when one of its clean
tokens belongs to a damaged sample, computed from the clean rows alone. Rows of 12 tokens
cut 17-token samples, so a bad sample covers parts of two or three rows and a row may hold
two bad samples.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.processes import run_ranks
from tests.servers import FileServer
from wdstream import CorruptShardError, Loader, QuarantineLimitError
from wdstream.format.checksum import CHECKSUM_NAME
from wdstream.format.index import DatasetIndex, ShardEntry
from wdstream.format.loss import mark_no_loss
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.batches.quarantine import QuarantineEvent
from wdstream.storage import open_store
from wdstream.testing import synthetic_doc_lengths, write_synthetic_dataset
from wdstream.write.shards import ShardWriter

pytest_plugins = ["tests.fixtures_remote"]
pytestmark = pytest.mark.timeout(120)

SAMPLE, PER_SHARD = 17, 7
NO_LIMIT = 10**12  # max_quarantined: these runs mask more rows than the default allows
OPTS: dict[str, Any] = dict(seq_len=11, batch_size=4, seed=3, epochs=1, shuffle_window=10,
                            shuffle_lanes=3, chunk_batches=2)  # fmt: skip


def _rows(batch: dict[str, torch.Tensor]) -> np.ndarray:
    """A clean batch's rows of ``seq_len + 1`` tokens (inputs plus the last label)."""
    return torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).numpy()


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("clean"))
    write_synthetic_dataset(root, n_docs=60, sample_tokens=SAMPLE, samples_per_shard=PER_SHARD)
    return root


@pytest.fixture(scope="module")
def oracle(clean: str) -> list[np.ndarray]:
    """Each step's rows of the clean run (world size 1, the global batch of 4)."""
    return [_rows(b) for b in Loader(clean, num_workers=0, **OPTS)]


class Damage:
    """A copy of the clean dataset with some samples made unreadable, and what that means."""

    def __init__(self, clean: str, dst: Path) -> None:
        shutil.copytree(clean, dst)
        self.root = dst
        index = json.loads((dst / "index.json").read_text())
        self.names = [s["name"] for s in index["shards"]]
        self.sidecars = [s["sidecar"] for s in index["shards"]]
        self.bad: set[int] = set()  # global sample numbers
        self.bytes: dict[int, int | None] = {}  # the byte offset events name

    def offsets(self, shard: int) -> np.ndarray:
        return ShardSidecar.from_bytes((self.root / self.sidecars[shard]).read_bytes()).offsets

    def flip(self, k: int) -> None:
        """A flipped bit in a token byte of global sample ``k``."""
        shard, j = divmod(k, PER_SHARD)
        path = self.root / self.names[shard]
        data = bytearray(path.read_bytes())
        at = int(self.offsets(shard)[j])
        data[at + 20] ^= 0x10
        path.write_bytes(bytes(data))
        self.bad.add(k)
        self.bytes[k] = at

    def remove(self, shard: int) -> None:
        """The shard's tar is gone (its sidecar is there)."""
        offsets = self.offsets(shard)
        (self.root / self.names[shard]).unlink()
        for j, at in enumerate(offsets.tolist()):
            self.bad.add(shard * PER_SHARD + j)
            self.bytes[shard * PER_SHARD + j] = at

    def truncate(self, shard: int, j: int) -> None:
        """The shard's tar ends 10 bytes into sample ``j``'s data."""
        offsets = self.offsets(shard)
        path = self.root / self.names[shard]
        path.write_bytes(path.read_bytes()[: int(offsets[j]) + 10])
        for i in range(j, len(offsets)):
            self.bad.add(shard * PER_SHARD + i)
            self.bytes[shard * PER_SHARD + i] = int(offsets[i])

    def spoil_sidecar(self, shard: int) -> None:
        """A flipped bit in the shard's sidecar: it fails index.json's sha256, so no byte
        offset is known and the counts come from index.json."""
        path = self.root / self.sidecars[shard]
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        for j in range(PER_SHARD):
            self.bad.add(shard * PER_SHARD + j)
            self.bytes[shard * PER_SHARD + j] = None

    def sample_of(self, event: QuarantineEvent) -> int:
        """The global sample an event names."""
        return self.names.index(event.shard.rsplit("/", 1)[1]) * PER_SHARD + event.sample


def check_run(
    got: list[dict[str, torch.Tensor]],
    events: list[QuarantineEvent],
    want: list[np.ndarray],
    damage: Damage,
    rank: int = 0,
    first_step: int = 0,
) -> int:
    """Every row of ``got`` (this rank's batches from ``first_step``) against the clean run
    ``want`` (every rank's rows): unaffected rows equal, affected rows masked whole and each
    (row, bad sample) recorded once. Returns the masked rows."""
    assert len(got) == len(want) - first_step
    B = got[0]["input_ids"].shape[0]
    expected = set()
    masked = 0
    for i, batch in enumerate(got):
        step = first_step + i
        rows = want[step][rank * B : (rank + 1) * B]
        for r, row in enumerate(rows):
            hit = set((row // SAMPLE).tolist()) & damage.bad
            if hit:
                masked += 1
                assert (batch["input_ids"][r] == 0).all(), (step, r)
                assert (batch["labels"][r] == -100).all(), (step, r)
                expected |= {(step, rank, r, k) for k in hit}
            else:
                assert np.array_equal(batch["input_ids"][r].numpy(), row[:-1]), (step, r)
                assert np.array_equal(batch["labels"][r].numpy(), row[1:]), (step, r)
    recorded = [(e.step, e.rank, e.row, damage.sample_of(e)) for e in events]
    assert len(recorded) == len(set(recorded))  # each once, however many workers
    assert set(recorded) == expected
    assert all(e.byte == damage.bytes[damage.sample_of(e)] for e in events)
    return masked


def _read_samples(want: list[np.ndarray]) -> list[int]:
    return sorted({int(k) for rows in want for k in (rows // SAMPLE).ravel()})


DAMAGES: dict[str, Callable[[Damage, list[int]], None]] = {
    "one flipped sample": lambda d, read: d.flip(read[len(read) // 3]),
    "several flipped samples": lambda d, read: [d.flip(read[len(read) * f // 7]) for f in (1, 3, 5)],
    "consecutive flipped samples": lambda d, read: [d.flip(20 * PER_SHARD + j) for j in (2, 3, 4)],
    "missing shard": lambda d, read: d.remove(11),
    "truncated shard": lambda d, read: d.truncate(30, 3),
    "unreadable sidecar": lambda d, read: d.spoil_sidecar(40),
}  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", list(DAMAGES))
def test_damaged_rows_are_masked_in_place_and_recorded(
    clean: str, oracle: list[np.ndarray], tmp_path: Path, kind: str, workers: int
) -> None:
    damage = Damage(clean, tmp_path / "bad")
    DAMAGES[kind](damage, _read_samples(oracle))
    loader = Loader(str(damage.root), num_workers=workers, on_corrupt="mask", **OPTS)
    got = list(loader)
    masked = check_run(got, loader.quarantined, oracle, damage)
    assert masked > 0 and loader.state_dict()["quarantined"] == masked
    reasons = {e.reason for e in loader.quarantined}
    if "flipped" in kind:
        assert reasons == {"checksum mismatch (corrupt bytes)"}
    elif kind == "truncated shard":
        assert reasons == {"shard ends early (truncated?)"}
    else:
        stem = Path(damage.names[11 if kind == "missing shard" else 40]).stem  # .tar or .idx
        assert all(stem in r for r in reasons)
    # The default is unchanged: the same damage is an error.
    with pytest.raises((CorruptShardError, FileNotFoundError)):
        list(Loader(str(damage.root), num_workers=0, **OPTS))


@pytest.mark.parametrize("workers", [0, 2])
def test_world_size_two_masks_each_ranks_share(
    clean: str, oracle: list[np.ndarray], tmp_path: Path, workers: int
) -> None:
    damage = Damage(clean, tmp_path / "bad")
    read = _read_samples(oracle)
    for k in (read[40], read[41], read[300]):
        damage.flip(k)
    damage.remove(60)
    opts = {**OPTS, "batch_size": 2, "world_size": 2}
    total = 0
    for rank in (0, 1):
        loader = Loader(str(damage.root), num_workers=workers, rank=rank, on_corrupt="mask", **opts)
        total += check_run(list(loader), loader.quarantined, oracle, damage, rank=rank)
    assert (
        0
        < total
        == sum(bool(set((row // SAMPLE).tolist()) & damage.bad) for rows in oracle for row in rows)
    )


def _rank_main(rank: int, root: str, out: str) -> None:
    """One rank of a gloo process group reading the damaged dataset, an all_reduce per step
    as DDP makes (a rank with fewer batches would hang); its batches and events saved."""
    dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=rank, world_size=2)
    loader = Loader(root, num_workers=2 * rank, on_corrupt="mask", **{**OPTS, "batch_size": 2})
    assert (loader.rank, loader.world_size) == (rank, 2)
    got = []
    for batch in loader:
        dist.all_reduce(torch.tensor([float(batch["input_ids"].sum())]))
        got.append(torch.stack([batch["input_ids"], batch["labels"]]).numpy())
    np.save(f"{out}/rows-{rank}.npy", np.stack(got))
    Path(f"{out}/events-{rank}.json").write_text(
        json.dumps([dataclasses.asdict(e) for e in loader.quarantined])
    )
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_two_gloo_ranks_mask_the_same_rows_as_the_clean_run_places(
    clean: str, oracle: list[np.ndarray], tmp_path: Path
) -> None:
    """Ranks of a real process group (rank 0 without workers, rank 1 with 2)."""
    damage = Damage(clean, tmp_path / "bad")
    read = _read_samples(oracle)
    damage.flip(read[100])
    damage.truncate(50, 2)
    run_ranks(_rank_main, (str(damage.root), str(tmp_path)), 2)
    total = 0
    for rank in (0, 1):
        saved = np.load(tmp_path / f"rows-{rank}.npy")
        got = [{"input_ids": torch.from_numpy(x[0]), "labels": torch.from_numpy(x[1])}
               for x in saved]  # fmt: skip
        events = [
            QuarantineEvent(**e) for e in json.loads((tmp_path / f"events-{rank}.json").read_text())
        ]
        total += check_run(got, events, oracle, damage, rank=rank)
    assert total > 0


@pytest.mark.parametrize("at", ["before the bad rows", "after the bad rows"])
def test_resume_reproduces_the_masked_run(
    clean: str, oracle: list[np.ndarray], tmp_path: Path, at: str
) -> None:
    damage = Damage(clean, tmp_path / "bad")
    read = _read_samples(oracle)
    damage.flip(read[len(read) // 2])
    damage.flip(read[len(read) // 2 + 1])
    whole = Loader(str(damage.root), num_workers=0, on_corrupt="mask", **OPTS)
    run = list(whole)
    first_bad = min(e.step for e in whole.quarantined)
    cut = (
        first_bad - 3 if at == "before the bad rows" else max(e.step for e in whole.quarantined) + 2
    )
    saver = Loader(str(damage.root), num_workers=2, on_corrupt="mask", **OPTS)
    it = iter(saver)
    for _ in range(cut):
        next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    it.close()
    before = sum(len({e.row for e in whole.quarantined if e.step == s}) for s in range(cut))
    assert state.get("quarantined", 0) == before
    resumed = Loader(str(damage.root), num_workers=2, on_corrupt="mask", **OPTS)
    resumed.load_state_dict(state)
    rest = list(resumed)
    for a, b in zip(run[cut:], rest, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    # The resumed run finds the bad rows it reads again; the state keeps the run's count.
    assert resumed.quarantined == [e for e in whole.quarantined if e.step >= cut]
    after = check_run(rest, resumed.quarantined, oracle, damage, first_step=cut)
    assert (after > 0) == (at == "before the bad rows")
    assert resumed.state_dict()["quarantined"] == whole.state_dict()["quarantined"] > 0


def test_max_quarantined_turns_a_failing_store_into_an_error(
    clean: str, oracle: list[np.ndarray], tmp_path: Path
) -> None:
    damage = Damage(clean, tmp_path / "bad")
    for shard in (5, 6, 7, 8):
        damage.remove(shard)
    full = Loader(str(damage.root), num_workers=0, on_corrupt="mask", max_quarantined=NO_LIMIT,
                  **OPTS)  # fmt: skip
    counts = [len({e.row for e in full.quarantined if e.step == s}) for s in range(len(list(full)))]
    crossing = int(np.searchsorted(np.cumsum(counts), 4, side="right"))  # the step past 4 rows
    loader = Loader(str(damage.root), num_workers=2, on_corrupt="mask", max_quarantined=4, **OPTS)
    got = []
    with pytest.raises(QuarantineLimitError) as info:
        for batch in loader:
            got.append(batch)
    assert len(got) == crossing  # every batch before it, not the one that crossed
    text = str(info.value)
    assert (
        f"{sum(counts[: crossing + 1])} rows masked in this run, more than max_quarantined=4"
        in text
    )
    assert "Last events: step" in text and any(damage.names[s] in text for s in (5, 6, 7, 8))
    assert loader.state_dict()["quarantined"] == sum(counts[:crossing]) <= 4
    # A fraction of the rows read: 1 % trips at the first masked row of a short run.
    frac = Loader(str(damage.root), num_workers=0, on_corrupt="mask", max_quarantined=0.01, **OPTS)
    with pytest.raises(QuarantineLimitError, match=r"of the \d+ rows handed out were masked"):
        list(frac)
    # Counts that allow the whole run let it finish.
    assert len(list(Loader(str(damage.root), num_workers=0, on_corrupt="mask",
                           max_quarantined=sum(counts), **OPTS))) == len(oracle)  # fmt: skip


def test_a_remote_shard_failing_past_the_retries_is_masked(
    clean: str, oracle: list[np.ndarray], http_server: FileServer, tmp_path: Path
) -> None:
    """A shard the server answers with 500 to every read, past the store's retries. Remote
    reads are slow here (~12 ms each), so 30 steps are read, from a shard they use."""
    n = 30
    damage = Damage(clean, tmp_path / "bad")
    shard = int(oracle[5][0][0]) // SAMPLE // PER_SHARD
    for j, at in enumerate(damage.offsets(shard).tolist()):  # what the server will refuse
        damage.bad.add(shard * PER_SHARD + j)
        damage.bytes[shard * PER_SHARD + j] = at
    shutil.copytree(damage.root, http_server.root / "ds")
    http_server.faults.reset(fail_every=1, fail_status=500, only=damage.names[shard])
    url = f"{http_server.base_url}/ds"
    for workers in (0, 2):
        loader = Loader(url, num_workers=workers, on_corrupt="mask", retries=1, backoff=0.001,
                        max_quarantined=NO_LIMIT, **OPTS)  # fmt: skip
        got = list(itertools.islice(loader, n))
        assert check_run(got, loader.quarantined, oracle[:n], damage) > 0
        assert all("HTTP 500" in e.reason for e in loader.quarantined)


def test_a_mixture_masks_only_the_damaged_sources_rows(clean: str, tmp_path: Path) -> None:
    other = str(tmp_path / "other")
    write_synthetic_dataset(other, n_docs=30, sample_tokens=SAMPLE, samples_per_shard=5, seed=4)
    opts = dict(weights={"web": 0.6, "code": 0.4}, seq_len=11, batch_size=4, seed=2,
                shuffle_window=10, shuffle_lanes=2, chunk_batches=2)  # fmt: skip
    n = 120
    batches = itertools.islice(Loader({"web": clean, "code": other}, num_workers=0, **opts), n)
    want = list(enumerate(batches))
    read = sorted({int(t) // SAMPLE for _, b in want for t, s in
                   zip(_rows(b).ravel(), b["source"].repeat_interleave(12), strict=True) if s == 0})  # fmt: skip
    damage = Damage(clean, tmp_path / "bad")
    damage.flip(read[len(read) // 4])
    damage.remove(50)
    for workers in (0, 2):
        loader = Loader({"web": str(damage.root), "code": other}, num_workers=workers,
                        on_corrupt="mask", max_quarantined=NO_LIMIT, **opts)  # fmt: skip
        expected, masked = set(), 0
        for (step, a), b in zip(want, loader, strict=False):
            assert torch.equal(a["source"], b["source"])
            for r, row in enumerate(_rows(a)):
                hit = set((row // SAMPLE).tolist()) & damage.bad if a["source"][r] == 0 else set()
                if hit:
                    masked += 1
                    expected |= {(step, r, k) for k in hit}
                    assert (b["labels"][r] == -100).all() and (b["input_ids"][r] == 0).all()
                else:
                    assert torch.equal(a["input_ids"][r], b["input_ids"][r])
                    assert torch.equal(a["labels"][r], b["labels"][r])
        assert masked > 0
        assert {(e.step, e.row, damage.sample_of(e)) for e in loader.quarantined} == expected


def _chat_dataset(root: Path) -> str:
    """A loss-masked (bit 31) dataset of 17-token samples: token ``t`` carries no loss when
    ``(t // 5) % 2 == 0`` (a prompt), else it is supervised."""
    store = open_store(str(root), create=True)
    shards: list[ShardEntry] = []
    writer = ShardWriter(store, "chat", shard_bytes=1 << 62, shard_samples=PER_SHARD,
                         on_commit=lambda entry, _: shards.append(entry))  # fmt: skip
    lens = synthetic_doc_lengths(40, seed=9)
    total = sum(lens) // SAMPLE * SAMPLE
    for start in range(0, total, SAMPLE):
        t = np.arange(start, start + SAMPLE)
        writer.add(mark_no_loss(t, (t // 5) % 2 == 1), [SAMPLE], start > 0,
                   new_docs=int(start == 0), state=None)  # fmt: skip
    writer.close()
    index = DatasetIndex(
        tokenizer={"name": "synthetic", "backend": "none", "ranks_sha256": "", "n_vocab": total + 1},
        eos_id=None, bos_id=None, dtype="uint32", mode="concat", seq_len=SAMPLE - 1,
        sample_tokens=SAMPLE, shards=tuple(shards), stats={"documents": 1},
        checksum=CHECKSUM_NAME, loss_mask="bit31",
    )  # fmt: skip
    store.write_bytes("index.json", index.to_json().encode())
    return str(root)


def test_a_chat_dataset_keeps_its_own_loss_mask_beside_the_masked_rows(tmp_path: Path) -> None:
    chat = _chat_dataset(tmp_path / "chat")
    opts = {**OPTS, "return_doc_boundaries": True}
    want = list(Loader(chat, num_workers=0, **opts))
    assert any((b["labels"] == -100).any() for b in want)  # the prompts carry no loss
    damage = Damage(chat, tmp_path / "bad")
    read = sorted({int(t) // SAMPLE for b in want for t in b["input_ids"].ravel()})
    damage.flip(read[len(read) // 2])
    loader = Loader(str(damage.root), num_workers=2, on_corrupt="mask", **opts)
    masked = 0
    for a, b in zip(want, loader, strict=True):
        for r in range(len(a["input_ids"])):
            tokens = torch.cat([a["input_ids"][r], a["labels"][r][-1:].clamp(min=0)])
            if set((tokens // SAMPLE).tolist()) & damage.bad:
                masked += 1
                assert (b["labels"][r] == -100).all() and (b["input_ids"][r] == 0).all()
                assert torch.equal(b["position_ids"][r], torch.arange(11))
            else:
                for key in ("input_ids", "labels", "position_ids"):
                    assert torch.equal(a[key][r], b[key][r])
    assert masked == len({(e.step, e.row) for e in loader.quarantined}) > 0


def test_on_corrupt_is_checked(clean: str) -> None:
    with pytest.raises(ValueError, match="on_corrupt must be 'raise' or 'mask'"):
        Loader(clean, on_corrupt="skip", **OPTS)
    with pytest.raises(ValueError, match="max_quarantined limits on_corrupt='mask'"):
        Loader(clean, max_quarantined=3, **OPTS)
    with pytest.raises(ValueError, match="fraction must be in"):
        Loader(clean, on_corrupt="mask", max_quarantined=1.5, **OPTS)
    with pytest.raises(ValueError, match="needs order='global'"):
        Loader(clean, on_corrupt="mask", order="streams", **OPTS)
    with pytest.raises(ValueError, match="needs the global order"):
        Loader(clean, on_corrupt="mask", max_tokens=64, **{**OPTS, "seq_len": 16})
