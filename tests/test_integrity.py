"""Every byte checked: bit flips in shards and sidecars are refused, never delivered.

Each test works on real files: a small packed dataset is copied, one bit is flipped, and the
whole epoch is read through the real Loader. The outcome must be the exact batches of the
clean dataset (the flip hit bytes the reader never uses: a tar header or padding) or a
CorruptShardError naming the shard -- never different data.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from wdstream import CorruptShardError, IncompleteDatasetError, Loader
from wdstream.errors import IndexValidationError
from wdstream.format.index import JOURNAL_NAME, ShardEntry
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.sources.packed import ShardSource
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store
from wdstream.testing import rewrite_index, write_synthetic_dataset
from wdstream.write.shards import ShardWriter

OPTS = dict(seq_len=32, batch_size=2, num_workers=0, shuffle=True, seed=3, epochs=1)


def read_epoch(root: str, **kw: object) -> np.ndarray:
    """Every row of one epoch, ``input_ids`` plus the final label (all seq_len + 1 tokens)."""
    loader = Loader(root, **{**OPTS, **kw})
    return np.concatenate(
        [np.concatenate([b["input_ids"], b["labels"][:, -1:]], axis=1) for b in loader]
    )


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    root = str(tmp_path_factory.mktemp("clean"))
    write_synthetic_dataset(root, n_docs=30, sample_tokens=33, samples_per_shard=9)
    return root, read_epoch(root)


def flipped_copy(src: str, dst: Path, name: str, bit: int) -> str:
    shutil.copytree(src, dst)
    data = bytearray((dst / name).read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    (dst / name).write_bytes(bytes(data))
    return str(dst)


def outcome(root: str, want: np.ndarray, name: str) -> str:
    try:
        got = read_epoch(root)
    except CorruptShardError as exc:
        assert name in str(exc), f"error does not name {name}: {exc}"
        return "refused"
    assert got.shape == want.shape and np.array_equal(got, want), "silent corruption"
    return "same"


def random_bit(root: str, shard: ShardEntry, kind: str, rng: np.random.Generator) -> int:
    """A bit inside some sample's msgpack bytes (tar) or anywhere in the sidecar (idx)."""
    if kind == "idx":
        return int(rng.integers((Path(root) / shard.sidecar).stat().st_size * 8))
    sc = ShardSidecar.from_bytes((Path(root) / shard.sidecar).read_bytes())
    k = int(rng.integers(len(sc)))
    return int(sc.offsets[k]) * 8 + int(rng.integers(int(sc.sizes[k]) * 8))


@pytest.mark.parametrize("kind", ["tar", "idx"])
def test_random_bit_flips_are_refused_or_harmless(
    clean: tuple[str, np.ndarray], tmp_path: Path, kind: str
) -> None:
    root, want = clean
    shards = read_index(open_store(root)).shards
    rng = np.random.default_rng([7, len(kind)])
    results = []
    for i in range(25):
        shard = shards[int(rng.integers(len(shards)))]
        name = shard.name if kind == "tar" else shard.sidecar
        copy = flipped_copy(root, tmp_path / f"flip{i}", name, random_bit(root, shard, kind, rng))
        results.append(outcome(copy, want, name))
    # "same" only where the flipped sample or shard is one this epoch leaves out (the
    # remainder), so nothing reads it.
    assert results.count("refused") >= 20, results


@pytest.mark.parametrize(
    "how",
    [
        {},
        {"return_doc_boundaries": True},
        {"num_workers": 2},
        {"num_workers": 2, "return_doc_boundaries": True},
    ],
    ids=["tokens", "documents", "tokens-2-workers", "documents-2-workers"],
)
def test_flip_in_token_bytes_names_shard_sample_and_offset(
    clean: tuple[str, np.ndarray], tmp_path: Path, how: dict[str, object]
) -> None:
    """Refused however the rows are read: token windows (at 0 workers checked by the
    read-ahead, with workers at each sample's first copy) and document windows (decoded);
    with checks off the flipped token is delivered on every path."""
    root, _ = clean
    shard = read_index(open_store(root)).shards[1]
    sidecar = ShardSidecar.from_bytes((Path(root) / shard.sidecar).read_bytes())
    k = 4
    token_byte = int(sidecar.offsets[k]) + 20  # past the "tokens" key and bin header
    copy = flipped_copy(root, tmp_path / "c", shard.name, token_byte * 8)
    with pytest.raises(CorruptShardError) as info:
        read_epoch(copy, **how)
    msg = str(info.value)
    assert shard.name in msg and f"sample {k} at byte {int(sidecar.offsets[k])}" in msg
    assert "checksum mismatch" in msg
    # Off for storage that checksums its own reads: the flipped token is then delivered, unless
    # it is no token of the vocabulary: every id a reader yields is one (issue 33 item 4).
    try:
        changed = read_epoch(copy, checksums=False, **how)
    except IndexValidationError as exc:
        assert f"{shard.name}: sample {k}, token " in str(exc) and "tokenizer.n_vocab" in str(exc)
    else:
        assert not np.array_equal(changed, read_epoch(root, **how))


def test_sidecar_offsets_that_alias_another_sample_are_refused(
    clean: tuple[str, np.ndarray], tmp_path: Path
) -> None:
    root, _ = clean
    copy = tmp_path / "c"
    shutil.copytree(root, copy)
    shard = read_index(open_store(str(copy))).shards[0]
    sc = ShardSidecar.from_bytes((copy / shard.sidecar).read_bytes())
    offsets = sc.offsets.copy()
    offsets[0] = offsets[1]
    (copy / shard.sidecar).write_bytes(
        ShardSidecar(offsets, sc.sizes, sc.tokens, sc.crc32c).to_bytes()
    )
    with pytest.raises(CorruptShardError, match="sha256"):
        read_epoch(str(copy))  # with index.json: the sidecar's hash no longer matches
    (copy / "index.json").unlink()
    urls = str(copy / "data-{000000..000003}.tar")
    with pytest.raises(CorruptShardError, match="entry 1: data offset .* overlaps"):
        ShardSource(urls).read(0, 0, 2)  # without one: the layout check catches it


def test_v1_dataset_reads_with_a_one_time_warning(tmp_path: Path) -> None:
    v1, v2 = str(tmp_path / "v1"), str(tmp_path / "v2")
    write_synthetic_dataset(v1, n_docs=20, sample_tokens=33, samples_per_shard=5, version=1)
    write_synthetic_dataset(v2, n_docs=20, sample_tokens=33, samples_per_shard=5)
    assert read_index(open_store(v1)).version == 1
    with pytest.warns(UserWarning, match="format v1 shard .* read unchecked") as record:
        old = read_epoch(v1)
    assert len([w for w in record if "unchecked" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(old, read_epoch(v2))


def test_shuffled_rows_are_whole_packed_samples(tmp_path: Path) -> None:
    # 30 documents whose token count is not a multiple of 33: the last sample is short.
    root = str(tmp_path / "d")
    index = write_synthetic_dataset(root, n_docs=30, sample_tokens=33, samples_per_shard=4)
    assert index.total_tokens % 33 != 0
    loader = Loader(root, seq_len=32, batch_size=1, num_workers=0, shuffle=True, seed=1,
                    epochs=2, shuffle_window=4, shuffle_lanes=2)  # fmt: skip
    for batch in loader:
        row = np.concatenate([batch["input_ids"][0].numpy(), batch["labels"][0, -1:].numpy()])
        # Token t is the integer t: a whole sample is 33 consecutive integers starting at a
        # multiple of 33. A spliced row would jump.
        assert row[0] % 33 == 0 and np.array_equal(row, np.arange(row[0], row[0] + 33))


class FailingStore:
    """A local store whose write of one object fails, as a full disk or lost upload would."""

    def __init__(self, root: str, fail: str) -> None:
        self._store, self._fail = open_store(root, create=True), fail

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def writer(self, name: str):  # noqa: ANN201 - mirrors Store.writer
        if name == self._fail:
            raise OSError(28, "No space left on device", name)
        return self._store.writer(name)


def test_no_shard_is_committed_after_an_earlier_shard_failed(tmp_path: Path) -> None:
    committed: list[str] = []
    store = FailingStore(str(tmp_path), fail="d-000001.tar")
    writer = ShardWriter(store, "d", shard_bytes=1 << 30, shard_samples=2,  # type: ignore[arg-type]
                         on_commit=lambda e, _: committed.append(e.name), max_in_flight=8)  # fmt: skip
    tokens = np.arange(10, dtype="<u4")
    with pytest.raises(OSError, match="No space left"):
        for _ in range(10):
            writer.add(tokens, [10], False, 1, None)
        writer.close()
    assert committed == ["d-000000.tar"]
    assert not (tmp_path / "d-000002.tar").exists()


def test_interrupted_pack_is_named_on_read(tmp_path: Path) -> None:
    root = tmp_path / "out"
    root.mkdir()
    (root / "data-000000.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(IncompleteDatasetError, match="not a packed wdstream dataset"):
        Loader(str(root), seq_len=8, batch_size=1)
    (root / JOURNAL_NAME).write_text("{}")
    with pytest.raises(IncompleteDatasetError, match="was interrupted .* Rerun the same"):
        Loader(str(root), seq_len=8, batch_size=1)


def test_v1_sidecar_in_a_v2_dataset_is_refused(
    clean: tuple[str, np.ndarray], tmp_path: Path
) -> None:
    # A downgraded sidecar would silently turn the per-sample checks off: refused, even when
    # index.json is edited to carry its hash.
    root, _ = clean
    copy = tmp_path / "c"
    shutil.copytree(root, copy)
    shard = read_index(open_store(str(copy))).shards[0]
    sc = ShardSidecar.from_bytes((copy / shard.sidecar).read_bytes())
    old = ShardSidecar(sc.offsets, sc.sizes, sc.tokens).to_bytes()
    (copy / shard.sidecar).write_bytes(old)
    index = json.loads((copy / "index.json").read_text())
    index["shards"][0]["sidecar_sha256"] = hashlib.sha256(old).hexdigest()
    rewrite_index(str(copy), index)  # index.json and its shard table
    with pytest.raises(CorruptShardError, match="version-1 sidecar .* in a version-2 dataset"):
        read_epoch(str(copy))
