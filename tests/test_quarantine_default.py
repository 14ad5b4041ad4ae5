"""The default quarantine limit (issue 33, item 12): with ``on_corrupt="mask"`` and no
``max_quarantined``, a dataset whose every sample is corrupt used to train to the end on
all-masked rows. Now at most 0.1 % of the rows handed out, and at least 16 rows, may be
masked before a ``QuarantineLimitError``.

The damage is made with tarfile (one byte flipped inside every sample's data, found from the
tar headers, not wdstream's sidecars); the oracle of when the run stops is the documented
rule's arithmetic, and of what it delivers, the clean run.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from wdstream import Loader, QuarantineLimitError
from wdstream.read.batches.quarantine import DEFAULT_ALLOWANCE
from wdstream.testing import write_synthetic_dataset

OPTS = dict(seq_len=32, batch_size=4, num_workers=0, seed=3, shuffle_window=10)


def _flip_samples(root: Path, every: int = 1) -> int:
    """Flip one byte in the data of every ``every``-th sample of every shard; how many."""
    flipped = 0
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tar:
            spots = [m.offset_data + m.size // 2 for m in tar.getmembers()
                     if m.name.endswith((".mp", ".msgpack"))][::every]  # fmt: skip
        data = bytearray(shard.read_bytes())
        for at in spots:
            data[at] ^= 0x40
        shard.write_bytes(bytes(data))
        flipped += len(spots)
    return flipped


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("qdefault") / "clean"
    write_synthetic_dataset(str(root), n_docs=200, sample_tokens=33, samples_per_shard=20)
    return root


def test_every_sample_corrupt_stops_at_the_default_limit(clean: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(clean, bad)
    assert _flip_samples(bad) > 0
    loader = Loader(str(bad), on_corrupt="mask", **OPTS)  # no max_quarantined
    got = []
    with pytest.raises(QuarantineLimitError, match="more than the default limit") as info:
        for batch in loader:
            got.append(batch)
    # Every row is masked: batches of 4 masked rows are handed out while the run's masked
    # rows stay within the allowance of 16; the batch that takes it past is not.
    assert len(got) == DEFAULT_ALLOWANCE // OPTS["batch_size"]
    for batch in got:
        assert (batch["labels"] == -100).all()
    assert "rows handed out were masked" in str(info.value)


def test_a_few_corrupt_samples_do_not_stop_a_run(clean: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(clean, bad)
    shard = sorted(bad.glob("*.tar"))[3]
    with tarfile.open(shard) as tar:
        member = [m for m in tar.getmembers() if m.name.endswith((".mp", ".msgpack"))][5]
    data = bytearray(shard.read_bytes())
    data[member.offset_data + 20] ^= 1
    shard.write_bytes(bytes(data))
    want = list(Loader(str(clean), epochs=2, **OPTS))
    loader = Loader(str(bad), on_corrupt="mask", epochs=2, **OPTS)
    got = list(loader)  # two epochs, the sample's rows masked each time: within the default
    assert len(got) == len(want) and 0 < len({(e.step, e.row) for e in loader.quarantined}) <= 8
    masked = {(e.step, e.row) for e in loader.quarantined}
    for step, (a, b) in enumerate(zip(want, got, strict=True)):
        for r in range(OPTS["batch_size"]):
            if (step, r) in masked:
                assert (b["labels"][r] == -100).all()
            else:
                assert torch.equal(a["input_ids"][r], b["input_ids"][r])
