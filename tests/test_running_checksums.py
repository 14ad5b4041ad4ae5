"""Running CRC32C values in the sidecars: a run of samples is checked with one call.

The writer stores, per sample, the shard's running CRC32C to the end of that sample's data;
the reader checks each run of consecutive samples it uses with one call over the run's bytes
(headers and padding included) and names the culprit from the per-sample values. Sidecars
written before the running values existed are checked sample by sample.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import crc32c
import numpy as np
import pytest

from wdstream import CorruptShardError, Loader
from wdstream.format.checksum import crc32c as fast_crc32c
from wdstream.format.checksum import find_corruption
from wdstream.format.sidecar import ShardSidecar
from wdstream.format.tar import BLOCK
from wdstream.inspect import verify_dataset
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store
from wdstream.testing import rewrite_index, write_synthetic_dataset

OPTS = dict(seq_len=32, batch_size=2, shuffle=True, seed=5, epochs=1)


def read_epoch(root: str, **kw: object) -> np.ndarray:
    """Every row of one epoch, ``input_ids`` plus the final label."""
    loader = Loader(root, **{**OPTS, "num_workers": 0, **kw})
    return np.concatenate(
        [np.concatenate([b["input_ids"], b["labels"][:, -1:]], axis=1) for b in loader]
    )


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    root = tmp_path_factory.mktemp("clean")
    write_synthetic_dataset(str(root), n_docs=40, sample_tokens=33, samples_per_shard=9)
    return root, read_epoch(str(root))


def sidecar_of(root: Path, k: int) -> tuple[str, ShardSidecar]:
    shard = read_index(open_store(str(root))).shards[k]
    return shard.name, ShardSidecar.from_bytes((root / shard.sidecar).read_bytes())


def flip_byte(root: Path, name: str, byte: int) -> None:
    data = bytearray((root / name).read_bytes())
    data[byte] ^= 0x10
    (root / name).write_bytes(bytes(data))


@pytest.mark.parametrize("length", [0, 1, 7, 8, 15, 16, 64, 4095, 8196, 16383, 16384, 70001])
def test_the_reader_sums_agree_with_the_crc32c_package(length: int) -> None:
    """The reader's CRC32C (``fastcrc``) equals the ``crc32c`` package's, from seed 0 and
    continued from any running value, on bytes, memoryviews and read-only numpy buffers, on
    both sides of the length where the GIL starts being released."""
    data = np.random.default_rng(length).integers(0, 256, size=length, dtype=np.uint8)
    data.flags.writeable = False
    for buf in (data.tobytes(), memoryview(data), data):
        assert fast_crc32c(buf) == crc32c.crc32c(data.tobytes())
        for seed in (0, 1, 0x1EDC6F41, 0xFFFFFFFF):
            assert fast_crc32c(buf, seed) == crc32c.crc32c(data.tobytes(), seed)
    half = length // 2
    running = fast_crc32c(data[half:], fast_crc32c(data[:half]))
    assert running == crc32c.crc32c(data.tobytes())


def test_running_values_are_the_shard_prefix_checksums(clean: tuple[Path, np.ndarray]) -> None:
    root, _ = clean
    for k in range(len(read_index(open_store(str(root))).shards)):
        name, sc = sidecar_of(root, k)
        assert sc.crc32c_run is not None
        data = (root / name).read_bytes()
        ends = sc.offsets.astype(np.int64) + sc.sizes
        want = [crc32c.crc32c(data[:end]) for end in ends.tolist()]
        assert sc.crc32c_run.tolist() == want


def test_run_check_spans_from_the_previous_sample_end(clean: tuple[Path, np.ndarray]) -> None:
    root, _ = clean
    name, sc = sidecar_of(root, 1)
    data = (root / name).read_bytes()
    for a, b in [(0, 1), (0, len(sc)), (3, 4), (2, 7), (len(sc) - 1, len(sc))]:
        begin, end, seed, want = sc.run_check(a, b)
        assert begin == (0 if a == 0 else int(sc.offsets[a - 1]) + int(sc.sizes[a - 1]))
        assert end == int(sc.offsets[b - 1]) + int(sc.sizes[b - 1])
        assert crc32c.crc32c(data[begin:end], seed) == want


def test_a_flip_is_found_exactly_when_a_checked_run_holds_it(
    clean: tuple[Path, np.ndarray],
) -> None:
    # Against a brute force: for random masks of samples and a flipped byte inside one
    # sample's data, the flip is reported (naming that sample) iff the mask holds it.
    root, _ = clean
    name, sc = sidecar_of(root, 0)
    clean_bytes = (root / name).read_bytes()
    rng = np.random.default_rng(11)
    n = len(sc)
    for _ in range(200):
        a = int(rng.integers(n))
        b = int(rng.integers(a + 1, n + 1))
        mask = rng.random(b - a) < 0.5
        victim = int(rng.integers(a, b))
        data = bytearray(clean_bytes)
        data[int(sc.offsets[victim]) + int(rng.integers(int(sc.sizes[victim])))] ^= 0x01
        begin = sc.run_check(a, b)[0]
        view = memoryview(bytes(data))[begin:]
        got = find_corruption(view, begin, sc, a, b, mask)
        if mask[victim - a]:
            assert got is not None and got.sample == victim, (a, b, mask, victim, got)
            assert got.byte == int(sc.offsets[victim])
        else:
            assert got is None, (a, b, mask, victim, got)
        assert find_corruption(memoryview(clean_bytes)[begin:], begin, sc, a, b, mask) is None


def test_a_flip_in_a_tar_header_between_samples_is_refused(
    clean: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    root, want = clean
    copy = tmp_path / "c"
    shutil.copytree(root, copy)
    name, sc = sidecar_of(copy, 1)
    header = int(sc.offsets[3]) - BLOCK  # sample 3's tar header: no sample's data
    flip_byte(copy, name, header + 100)  # inside the header's mode field
    with pytest.raises(CorruptShardError) as info:
        read_epoch(str(copy))
    msg = str(info.value)
    assert name in msg and "between samples" in msg, msg
    # The sample data is intact: with checks off the same rows come out.
    assert np.array_equal(read_epoch(str(copy), checksums=False), want)
    report = verify_dataset(str(copy))
    assert not report.ok and name in report.problems[0]


def strip_running_values(root: Path) -> None:
    """Rewrite every sidecar as one written before running values existed (and index.json
    with their hashes), as a dataset packed by an earlier wdstream is."""
    index = json.loads((root / "index.json").read_text())
    for entry in index["shards"]:
        sc = ShardSidecar.from_bytes((root / entry["sidecar"]).read_bytes())
        old = ShardSidecar(sc.offsets, sc.sizes, sc.tokens, sc.crc32c).to_bytes()
        (root / entry["sidecar"]).write_bytes(old)
        entry["sidecar_sha256"] = hashlib.sha256(old).hexdigest()
    rewrite_index(str(root), index)  # index.json and its shard table


@pytest.mark.parametrize("workers", [0, 2])
def test_sidecars_without_running_values_check_each_sample(
    clean: tuple[Path, np.ndarray], tmp_path: Path, workers: int
) -> None:
    root, want = clean
    copy = tmp_path / "c"
    shutil.copytree(root, copy)
    strip_running_values(copy)
    assert sidecar_of(copy, 0)[1].crc32c_run is None
    assert np.array_equal(read_epoch(str(copy), num_workers=workers), want)
    assert verify_dataset(str(copy)).ok
    name, sc = sidecar_of(copy, 2)
    flip_byte(copy, name, int(sc.offsets[5]) + 20)  # a token byte of sample 5
    with pytest.raises(CorruptShardError) as info:
        read_epoch(str(copy), num_workers=workers)
    assert f"{name}: sample 5 at byte {int(sc.offsets[5])}: checksum mismatch" in str(info.value)
