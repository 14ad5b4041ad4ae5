"""Item 10 of issue 34: a pack given no --shard-size sizes its shards from its input.

The oracle is the documented rule written out here (input bytes / 128, between 1 MB and
256 MB; 256 MB where the size is unknown), the shards' sizes as tarfile reads them from
disk, and the uninterrupted run for resume.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import wdstream
from tests.conftest import make_corpus
from tests.test_pack_resume import _files, _interrupted_writer
from wdstream.cli import main
from wdstream.storage import LocalStore
from wdstream.write.sizing import choose_shard_bytes

MB = 1_000_000


@pytest.fixture(scope="module")
def mid_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 3 MB of JSON Lines: a pack of it used to be one 256 MB-bounded shard."""
    path = tmp_path_factory.mktemp("sizing") / "in.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < 3 * MB:
            for t in make_corpus(n_docs=200, seed=f.tell(), stdlib_files=0):
                f.write(json.dumps({"text": t}) + "\n")
    return path


def test_rule_values() -> None:
    assert choose_shard_bytes(None, 100 * MB) == MB  # 781,250 raised to the 1 MB floor
    assert choose_shard_bytes(None, 200 * MB) == 1_562_500  # 200e6 / 128
    assert choose_shard_bytes(None, 1_000 * MB) == 7_812_500
    assert choose_shard_bytes(None, 1_000 * MB + 1) == 7_812_501  # rounded up
    assert choose_shard_bytes(None, 64_000 * MB) == 256 * MB  # 500 MB capped
    assert choose_shard_bytes(None, None) == 256 * MB  # stdin, records
    assert choose_shard_bytes("8KB", 64_000 * MB) == 8_000  # an explicit size always wins
    assert choose_shard_bytes(4096, None) == 4096


def _tar_sizes(out: Path) -> list[int]:
    sizes = []
    for tar in sorted(out.glob("*.tar")):
        with tarfile.open(tar) as t:
            assert t.getmembers()  # a readable tar of samples
        sizes.append(tar.stat().st_size)
    return sizes


def test_small_pack_gets_several_shards(tmp_path: Path, mid_input: Path) -> None:
    size = mid_input.stat().st_size
    expected = min(max(-(-size // 128), MB), 256 * MB)
    assert expected == MB
    res = CliRunner().invoke(
        main,
        [
            "pack",
            str(mid_input),
            "-o",
            str(tmp_path / "auto"),
            "--seq-len",
            "255",
            "--workers",
            "0",
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.output
    assert "Warning: the dataset is 1 shard" not in res.output
    index = json.loads((tmp_path / "auto" / "index.json").read_text())
    assert index["stats"]["shard_bytes"] == expected
    sizes = _tar_sizes(tmp_path / "auto")
    assert len(sizes) >= 2 and max(sizes) <= expected
    # The old default, given explicitly, still makes one shard and still warns.
    res = CliRunner().invoke(
        main,
        [
            "pack",
            str(mid_input),
            "-o",
            str(tmp_path / "big"),
            "--seq-len",
            "255",
            "--workers",
            "0",
            "--shard-size",
            "256MB",
        ],  # fmt: skip
    )
    assert res.exit_code == 0, res.output
    assert "Warning: the dataset is 1 shard" in res.output
    assert len(_tar_sizes(tmp_path / "big")) == 1


def test_records_keep_the_default(tmp_path: Path) -> None:
    res = wdstream.pack_records(["some text"] * 10, str(tmp_path / "r"), seq_len=7, workers=0)
    assert res.index.stats["shard_bytes"] == 256 * MB


def test_resume_uses_the_chosen_size(
    tmp_path: Path, mid_input: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kw = dict(seq_len=255, workers=0)
    ref, out = tmp_path / "ref", tmp_path / "out"
    wdstream.pack([str(mid_input)], str(ref), **kw)  # type: ignore[arg-type]
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer("data-000001.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(mid_input)], str(out), **kw)  # type: ignore[arg-type]
    assert not (out / "index.json").exists()
    res = wdstream.pack([str(mid_input)], str(out), **kw)  # type: ignore[arg-type]
    assert res.resumed_shards == 1
    assert _files(out) == _files(ref)
