"""``wdstream verify`` fails, with a message naming file, key or sample, for every edit it
used to miss: index edits (duplicate, swap, missing ``shards``, bad counts, names outside the
root), shards moved with their entries (sample keys out of order, v1 and v2), shards whose
members are not our samples, and samples that disagree with the index."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from wdstream.cli import main
from wdstream.format.checksum import sample_checksum
from wdstream.format.index import DatasetIndex, ShardEntry
from wdstream.format.sample import decode_sample, encode_sample
from wdstream.format.sidecar import ShardSidecar
from wdstream.format.tar import END_OF_ARCHIVE, member_bytes
from wdstream.testing import rewrite_index, write_synthetic_dataset

# 55 tokens in samples of 9: shards of 2, 2, 2 and 1 samples (samples 0-1, 2-3, 4-5, 6).
DOC_LENS = [5, 17, 3, 9, 11, 2, 8]


@pytest.fixture(scope="module", params=[2, 1], ids=["v2", "v1"])
def packed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"v{request.param}")
    write_synthetic_dataset(
        str(root), doc_lens=DOC_LENS, sample_tokens=9, samples_per_shard=2, version=request.param
    )
    return root


@pytest.fixture
def data(packed: Path, tmp_path: Path) -> Path:
    """A fresh copy of the packed dataset, for a test to edit."""
    return Path(shutil.copytree(packed, tmp_path / "data"))


def _verify(root: Path) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["verify", str(root)])
    assert "Traceback" not in res.output
    return res.exit_code, res.output


def _edit_index(root: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    obj = json.loads((root / "index.json").read_text())
    edit(obj)
    rewrite_index(str(root), obj)  # index.json and its shard table agree


def test_the_unedited_copy_verifies(data: Path) -> None:
    assert _verify(data) == (0, "OK: 4 shards, 7 samples, 7 documents, 55 tokens verified\n")


def _swap_entries(obj: dict[str, Any]) -> None:
    obj["shards"][1], obj["shards"][2] = obj["shards"][2], obj["shards"][1]


def _set_shard(i: int, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda obj: obj["shards"][i].__setitem__(key, value)


INDEX_EDITS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "duplicated entry": (
        lambda obj: obj["shards"].insert(2, dict(obj["shards"][1])),
        "shards[2].name: 'data-000001.tar' is listed twice (also shards[1].name)",
    ),
    "swapped entries": (
        _swap_entries,
        "shards[1].name: expected 'data-000001.tar' (NAME-NNNNNN.tar shards are numbered by "
        "their position, NAME as in shards[0].name), got 'data-000002.tar'",
    ),
    "no shards key": (
        lambda obj: obj.pop("shards"),
        "shards: missing (expected a list of at least 1 items)",
    ),
    "tokens -1": (
        _set_shard(1, "tokens", -1),
        "shards[1].tokens: expected an integer >= 0 and < 2**48, got -1",
    ),
    "tokens reduced": (
        _set_shard(1, "tokens", 10),
        "shards[1].tokens: expected shards[1].samples x sample_tokens = 2 x 9 = 18, got 10",
    ),
    "samples 0": (
        _set_shard(1, "samples", 0),
        "shards[1].samples: expected an integer >= 1 and < 2**48, got 0",
    ),
    "samples -5": (
        _set_shard(1, "samples", -5),
        "shards[1].samples: expected an integer >= 1 and < 2**48, got -5",
    ),
    "tokens 2**60": (
        _set_shard(1, "tokens", 2**60),
        "shards[1].tokens: expected an integer >= 0 and < 2**48, got 1152921504606846976",
    ),
    "sample_tokens 10**30": (
        lambda obj: obj.__setitem__("sample_tokens", 10**30),
        "sample_tokens: expected null or an integer >= 2 and < 2**31, got "
        "1000000000000000000000000000000",
    ),
    "NaN tokens": (
        _set_shard(1, "tokens", float("nan")),
        "shards[1].tokens: expected a finite number of at most 40 characters, got 'NaN'",
    ),
    "inf bytes": (
        _set_shard(1, "bytes", float("inf")),
        "shards[1].bytes: expected a finite number of at most 40 characters, got 'Infinity'",
    ),
    "name outside the root": (
        _set_shard(1, "name", "../../other/data-000006.tar"),
        "shards[1].name: expected a plain relative name inside the dataset root ending in "
        "'.tar', got '../../other/data-000006.tar' (a '.' or '..' path component)",
    ),
    "sidecar given as a URL": (
        _set_shard(1, "sidecar", "s3://bucket/data-000001.idx"),
        "shards[1].sidecar: expected a plain relative name inside the dataset root ending in "
        "'.idx', got 's3://bucket/data-000001.idx' (':' (a URL scheme or a drive))",
    ),
}


@pytest.mark.parametrize("case", list(INDEX_EDITS))
def test_index_edits_fail_naming_file_and_key(data: Path, case: str) -> None:
    edit, message = INDEX_EDITS[case]
    _edit_index(data, edit)
    assert _verify(data) == (1, f"FAILED: {data}/index.json: {message}\n")


def test_no_index_is_a_clear_failure(data: Path) -> None:
    (data / "index.json").unlink()
    code, output = _verify(data)
    assert code == 1
    assert output.startswith(f"FAILED: {data}/index.json does not exist: not a packed")


def test_shards_moved_with_their_entries_fail_on_sample_keys(data: Path) -> None:
    # Files 1 and 2 swapped on disk and their index entries with them (names kept in
    # order): every size, hash and count agrees; only the sample keys tell.
    for ext in ("tar", "idx"):
        a, b = data / f"data-000001.{ext}", data / f"data-000002.{ext}"
        a.rename(data / "tmp")
        b.rename(a)
        (data / "tmp").rename(b)

    def swap_all_but_names(obj: dict[str, Any]) -> None:
        one, two = obj["shards"][1], obj["shards"][2]
        for key in one.keys() - {"name", "sidecar"}:
            one[key], two[key] = two[key], one[key]

    _edit_index(data, swap_all_but_names)
    index = DatasetIndex.from_json((data / "index.json").read_text())
    suffix = ".mp" if index.version == 2 else ".msgpack"
    assert _verify(data) == (
        1,
        f"FAILED: {data}/data-000001.tar: sample 0 at byte 512: member '000000000004{suffix}', "
        f"expected '000000000002{suffix}' (its dataset-wide number: shards out of order or "
        "renamed, or not packed by wdstream)\n",
    )


# -- shards made member by member, so that exactly one thing is wrong --------------------------


def _sample(tokens: list[int], doc_lens: list[int], cont: bool = False) -> bytes:
    return encode_sample(np.asarray(tokens, dtype="<u4"), doc_lens, cont)


def _key(k: int) -> str:
    return f"{k:012d}.mp"


def _write(
    root: Path,
    members: list[tuple[str, bytes]],
    mode: str = "concat",
    n_vocab: int = 100,
) -> Path:
    """One shard of ``members`` (a sidecar over its ``.mp`` ones) and an index that agrees."""
    root.mkdir()
    tar = b"".join(member_bytes(n, d) for n, d in members) + END_OF_ARCHIVE
    offsets, samples, pos = [], [], 0
    for name, blob in members:
        if name.endswith(".mp"):
            offsets.append(pos + 512)
            samples.append(blob)
        pos += len(member_bytes(name, blob))
    decoded = [decode_sample(s) for s in samples]
    sidecar = ShardSidecar(
        offsets=np.asarray(offsets, dtype="<u8"),
        sizes=np.asarray([len(s) for s in samples], dtype="<u4"),
        tokens=np.asarray([len(s.tokens) for s in decoded], dtype="<u4"),
        crc32c=np.asarray([sample_checksum(s) for s in samples], dtype="<u4"),
    ).to_bytes()
    (root / "data-000000.tar").write_bytes(tar)
    (root / "data-000000.idx").write_bytes(sidecar)
    entry = ShardEntry(
        name="data-000000.tar",
        sidecar="data-000000.idx",
        samples=len(samples),
        tokens=sum(len(s.tokens) for s in decoded),
        documents=sum(len(s.doc_lens) - s.cont for s in decoded),
        bytes=len(tar),
        sha256=hashlib.sha256(tar).hexdigest(),
        sidecar_sha256=hashlib.sha256(sidecar).hexdigest(),
    )
    index = DatasetIndex(
        tokenizer={"name": "t", "backend": "none", "ranks_sha256": "", "n_vocab": n_vocab},
        eos_id=None,
        bos_id=None,
        dtype="uint32",
        mode=mode,
        seq_len=8 if mode == "concat" else None,
        sample_tokens=9 if mode == "concat" else None,
        shards=(entry,),
        checksum="crc32c",
    )
    (root / "index.json").write_text(index.to_json())
    return root


NINE = list(range(9))

SHARDS: dict[str, tuple[list[tuple[str, bytes]], dict[str, Any], str]] = {
    "written by another tool": (
        [("a.mp", _sample(NINE, [9])), ("b.mp", _sample(NINE, [9], True))],
        {},
        "sample 0 at byte 512: member 'a.mp', expected '000000000000.mp' (its dataset-wide "
        "number: shards out of order or renamed, or not packed by wdstream)",
    ),
    "a stray member between samples": (
        [(_key(0), _sample(NINE, [9])), ("notes.txt", b"hi"), (_key(1), _sample(NINE, [9]))],
        {},
        "sample 1 at byte 2560: other bytes between byte 1024 and its header (a shard holds "
        "its samples and nothing else)",
    ),
    "a stray member after the samples": (
        [(_key(0), _sample(NINE, [9])), (_key(1), _sample(NINE, [9])), ("x.txt", b"hi")],
        {},
        "bytes after sample 1 other than the end-of-archive marker",
    ),
    "concat samples of other lengths": (
        [(_key(0), _sample(NINE[:8], [8])), (_key(1), _sample(NINE + [9], [10]))],
        {},
        "sample 0 at byte 512: 8 tokens, sample_tokens is 9 (only the dataset's last sample "
        "may be shorter)",
    ),
    "a first sample that continues a document": (
        [(_key(0), _sample(NINE, [9], True)), (_key(1), _sample(NINE, [9]))],
        {},
        "sample 0 at byte 512: continues a document, but it is the dataset's first sample",
    ),
    "a docs sample of two pieces": (
        [(_key(0), _sample([1, 2, 3, 4, 5], [2, 3])), (_key(1), _sample([6], [1], True))],
        {"mode": "docs"},
        "sample 0 at byte 512: pieces [2, 3], cont False: mode 'docs' has one whole document "
        "per sample",
    ),
    "a token outside the vocabulary": (
        [(_key(0), _sample(NINE, [9])), (_key(1), _sample([1, 2, 150], [3]))],
        {},
        "sample 1 at byte 1536: token id 150 outside the vocabulary (ids < 100)",
    ),
}


@pytest.mark.parametrize("case", list(SHARDS))
def test_shards_that_disagree_with_the_format_fail(tmp_path: Path, case: str) -> None:
    members, options, message = SHARDS[case]
    root = _write(tmp_path / "ds", members, **options)
    DatasetIndex.from_json((root / "index.json").read_text())  # the index alone is fine
    assert _verify(root) == (1, f"FAILED: {root}/data-000000.tar: {message}\n")


def test_a_well_made_shard_verifies(tmp_path: Path) -> None:
    root = _write(
        tmp_path / "ds", [(_key(0), _sample(NINE, [4, 5])), (_key(1), _sample([7, 8], [2], True))]
    )
    assert _verify(root) == (0, "OK: 1 shard, 2 samples, 2 documents, 11 tokens verified\n")
