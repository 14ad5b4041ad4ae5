"""A local read's ids pass runs before its CRC32C pass (so the sums find the bytes in the
cache); the order must change nothing a reader can see.

Three reads of one flipped or re-vocabularied token, through the real ``Loader`` at 0 workers
from local shards (the path that looks first, ``ShardSource._read_piece``):

* a flip that leaves the id in the vocabulary is refused by the sums alone: it fails if a read
  the ids pass admits skipped its CRC32C check;
* a flip that puts the id outside the vocabulary is still refused as corrupt bytes, naming the
  sample: it fails if the ids pass raised (an id error) before the sums ran;
* clean bytes holding an id the index's vocabulary lacks are still refused by the ids check:
  it fails if a read the ids pass did not admit skipped ``IdLimit.check``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from wdstream import CorruptShardError, Loader
from wdstream.errors import IndexValidationError
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store
from wdstream.testing import rewrite_index, write_synthetic_dataset

OPTS: dict[str, Any] = dict(seq_len=32, batch_size=2, num_workers=0, shuffle=True, seed=3, epochs=1)
SAMPLE = 4  # of shard 1: read in every epoch of this dataset


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("clean"))
    write_synthetic_dataset(root, n_docs=30, sample_tokens=33, samples_per_shard=9)
    return root


def read_epoch(root: str) -> list[np.ndarray]:
    return [b["input_ids"].numpy() for b in Loader(root, **OPTS)]


def token_at(root: str, shard_name: str, sidecar_name: str, token: int) -> tuple[int, int]:
    """(shard byte, id) of token ``token`` of sample ``SAMPLE``, found in its msgpack bytes."""
    sidecar = ShardSidecar.from_bytes((Path(root) / sidecar_name).read_bytes())
    start = int(sidecar.offsets[SAMPLE])
    raw = (Path(root) / shard_name).read_bytes()[start : start + int(sidecar.sizes[SAMPLE])]
    ids = np.frombuffer(msgpack.unpackb(raw)["tokens"], np.uint32)
    return start + raw.index(ids.tobytes()) + 4 * token, int(ids[token])


def flipped(src: str, dst: Path, bit: int) -> tuple[str, int, str]:
    """A copy of ``src`` with ``bit`` of token 3 of sample ``SAMPLE`` of shard 1 flipped:
    (root, the sample's byte offset, the shard's name)."""
    shard = read_index(open_store(src)).shards[1]
    at, _ = token_at(src, shard.name, shard.sidecar, 3)
    shutil.copytree(src, dst)
    data = bytearray((dst / shard.name).read_bytes())
    data[at + bit // 8] ^= 1 << (bit % 8)
    (dst / shard.name).write_bytes(bytes(data))
    sidecar = ShardSidecar.from_bytes((dst / shard.sidecar).read_bytes())
    return str(dst), int(sidecar.offsets[SAMPLE]), shard.name


@pytest.mark.parametrize("bit", [0, 24], ids=["id-in-vocabulary", "id-outside-vocabulary"])
def test_a_flipped_token_is_refused_by_its_checksum(clean: str, tmp_path: Path, bit: int) -> None:
    root, offset, name = flipped(clean, tmp_path / "c", bit)
    shard = read_index(open_store(root)).shards[1]
    _, old = token_at(clean, shard.name, shard.sidecar, 3)
    n_vocab = json.loads((Path(root) / "index.json").read_text())["tokenizer"]["n_vocab"]
    assert ((old ^ (1 << bit)) < n_vocab) == (bit == 0)  # what each case is about
    with pytest.raises(CorruptShardError) as info:
        read_epoch(root)
    msg = str(info.value)
    assert f"{name}: sample {SAMPLE} at byte {offset}" in msg and "checksum mismatch" in msg


def test_clean_bytes_with_an_id_outside_the_vocabulary_are_refused(
    clean: str, tmp_path: Path
) -> None:
    root = tmp_path / "v"
    shutil.copytree(clean, root)
    shard = read_index(open_store(str(root))).shards[1]
    _, top = token_at(str(root), shard.name, shard.sidecar, 3)
    obj = json.loads((root / "index.json").read_text())
    obj["tokenizer"]["n_vocab"] = top  # this token (and every later one) is no id of it
    for key in ("eos_id", "bos_id", "pad_id"):
        if isinstance(obj.get(key), int) and obj[key] >= top:
            obj[key] = None
    rewrite_index(str(root), obj)
    with pytest.raises(IndexValidationError, match="tokenizer.n_vocab"):
        read_epoch(str(root))


def test_each_local_read_passes_its_ids_before_its_sums(
    clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order the saving depends on (docs/READER.md, "Checks at 0 workers"): every
    window read's CRC32C pass comes right after the ids pass over the same samples."""
    from wdstream.read.sources import checked_ranges
    from wdstream.read.sources.vouch import IdLimit

    events: list[str] = []
    admits, find = IdLimit.admits_samples, checked_ranges.find_corruption

    def spy_admits(self: IdLimit, tokens: object) -> bool:
        events.append("ids")
        return admits(self, tokens)  # type: ignore[arg-type]

    def spy_find(*args: object) -> object:
        events.append("sums")
        return find(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(IdLimit, "admits_samples", spy_admits)
    monkeypatch.setattr(checked_ranges, "find_corruption", spy_find)
    read_epoch(clean)
    assert events and events == ["ids", "sums"] * (len(events) // 2), events


def test_the_ids_pass_runs_over_a_read_last_sample_first(
    clean: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sums that follow run first to last, so they begin on the bytes the ids pass
    touched last, still in the nearest cache (docs/READER.md, "Checks at 0 workers
    (session 44)"): every strided ids pass of an epoch views its rows last to first."""
    from wdstream.read.sources import vouch

    strides: list[int] = []

    class Rows(np.ndarray):
        def max(self, *args: Any, **kwargs: Any) -> Any:
            strides.append(self.strides[0])
            return np.asarray(self).max(*args, **kwargs)

    real = vouch._strided_rows

    def spy(*args: Any) -> np.ndarray | None:
        rows = real(*args)
        return None if rows is None else rows.view(Rows)

    monkeypatch.setattr(vouch, "_strided_rows", spy)
    read_epoch(clean)
    assert strides and all(s < 0 for s in strides), strides
