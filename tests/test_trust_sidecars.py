"""Issue 33 item 5: a missing sidecar no longer downgrades the checks.

A format-v2 dataset (``index.json``: ``"checksum": "crc32c"``) whose ``data-NNNNNN.idx`` was
deleted and one of whose token bytes was flipped used to be read as "format v1", unchecked,
with one ``UserWarning``, and the flipped row was served. Now the read is refused naming
the sidecar, at 0 and 2 workers, in token and document windows; with
``on_corrupt="mask"`` the shard's samples stand in masked and are recorded (a concat
dataset: their counts come from ``index.json``), and docs-mode shards, whose sample lengths
only the sidecar knows, stay an error. The oracle is the clean dataset's uninterrupted run
(``tests/test_quarantine.py``: token ``t`` of the synthetic dataset is the integer ``t``).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.test_quarantine import OPTS, PER_SHARD, Damage, _read_samples, check_run
from wdstream import CorruptShardError, Loader
from wdstream.testing import write_synthetic_dataset

pytest_plugins = ["tests.test_quarantine"]  # its clean dataset and oracle fixtures
pytestmark = pytest.mark.timeout(180)


def _no_sidecar(damage: Damage, shard: int) -> None:
    """Shard ``shard``'s sidecar deleted and a token byte of its sample 2 flipped: every
    sample of the shard stands in (no offset is known without the sidecar)."""
    offsets = damage.offsets(shard)
    path = damage.root / damage.names[shard]
    data = bytearray(path.read_bytes())
    data[int(offsets[2]) + 20] ^= 0x10
    path.write_bytes(bytes(data))
    (damage.root / damage.sidecars[shard]).unlink()
    for j in range(PER_SHARD):
        damage.bad.add(shard * PER_SHARD + j)
        damage.bytes[shard * PER_SHARD + j] = None


@pytest.mark.parametrize("doc_boundaries", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_missing_sidecar_is_refused_never_read_unchecked(
    clean: str, oracle: list[np.ndarray], tmp_path: Path, workers: int, doc_boundaries: bool
) -> None:
    damage = Damage(clean, tmp_path / "bad")
    read = _read_samples(oracle)
    shard = read[len(read) // 2] // PER_SHARD
    _no_sidecar(damage, shard)
    name = damage.sidecars[shard]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "read unchecked" warning: no unchecked read
        with pytest.raises(CorruptShardError, match=rf"{name}: missing: index.json says"):
            for _ in Loader(str(damage.root), num_workers=workers,
                            return_doc_boundaries=doc_boundaries, **OPTS):  # fmt: skip
                pass


@pytest.mark.parametrize("workers", [0, 2])
def test_with_mask_the_shard_stands_in_masked_and_counted(
    clean: str, oracle: list[np.ndarray], tmp_path: Path, workers: int
) -> None:
    damage = Damage(clean, tmp_path / "bad")
    read = _read_samples(oracle)
    shard = read[len(read) // 2] // PER_SHARD
    _no_sidecar(damage, shard)
    loader = Loader(str(damage.root), num_workers=workers, on_corrupt="mask",
                    max_quarantined=10**6, **OPTS)  # fmt: skip
    got = list(loader)
    masked = check_run(got, loader.quarantined, oracle, damage)
    assert masked > 0 and loader.state_dict()["quarantined"] == masked
    assert all(f"{damage.sidecars[shard]}: missing" in e.reason for e in loader.quarantined)


def test_a_docs_shard_without_its_sidecar_stays_an_error(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write_synthetic_dataset(str(root), n_docs=40, mode="docs", samples_per_shard=5)
    (root / "data-000001.idx").unlink()
    for mode in ("raise", "mask"):
        with pytest.raises(CorruptShardError, match=r"data-000001\.idx: missing"):
            for _ in Loader(str(root), seq_len=16, batch_size=2, epochs=1, on_corrupt=mode):
                pass


def test_shards_opened_without_an_index_are_still_scanned(tmp_path: Path) -> None:
    """No index.json promises a sidecar: a shard without one is scanned, read unchecked with
    the warning that says so (the only unchecked read left)."""
    root = tmp_path / "d"
    write_synthetic_dataset(str(root), n_docs=30, sample_tokens=17, samples_per_shard=7)
    bare = tmp_path / "bare"
    shutil.copytree(root, bare)
    (bare / "index.json").unlink()
    (bare / "data-000000.idx").unlink()
    urls = sorted(str(p) for p in bare.glob("*.tar"))
    with pytest.warns(UserWarning, match="read unchecked"):
        got = [b["input_ids"] for b in Loader(urls, seq_len=16, batch_size=2, epochs=1,
                                              shuffle=False)]  # fmt: skip
    assert got
