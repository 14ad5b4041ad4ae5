"""A dataset's meaning travels with its bytes (issue 23 item 2): a best-fit dataset opened by
its shard URLs, with its index.json beside them, masks its padding and document ends as the
dataset root does; shards the index beside them does not vouch for are refused."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import msgpack
import numpy as np
import pytest

import wdstream
from tests.conftest import make_corpus
from wdstream.errors import CorruptShardError

SEQ = 64


def _pack(d: Path, mode: str, seed: int) -> Path:
    src = d / f"in-{seed}.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_corpus(60, seed, 0)))
    out = d / f"{mode}-{seed}"
    wdstream.pack([str(src)], str(out), seq_len=SEQ, mode=mode, shard_size="16KB", workers=0,
                  progress=False)  # fmt: skip
    return out


def _labels(source: str) -> np.ndarray:
    ld = wdstream.Loader(source, seq_len=SEQ, batch_size=2, num_workers=0, seed=1, epochs=1)
    return np.concatenate([b["labels"].numpy() for b in ld])


def _padding_tokens(root: Path) -> int:
    """Padding tokens of the packed rows, read with tarfile + msgpack (a best-fit sample's
    last piece length is its padding)."""
    total = 0
    for shard in sorted(root.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m)
                assert f is not None
                total += msgpack.unpackb(f.read())["doc_lens"][-1]
    return total


def test_bestfit_opened_by_urls_masks_as_its_root(tmp_path: Path) -> None:
    root = _pack(tmp_path, "bestfit", seed=1)
    n = len(list(root.glob("*.tar")))
    assert n >= 3 and _padding_tokens(root) > 0
    urls = str(root / f"data-{{000000..{n - 1:06d}}}.tar")
    by_root, by_urls, by_glob = _labels(str(root)), _labels(urls), _labels(str(root / "*.tar"))
    assert np.array_equal(by_root, by_urls) and np.array_equal(by_root, by_glob)
    # padding and document ends are not targets: at least every padding token is masked
    assert int((by_urls == -100).sum()) >= _padding_tokens(root) // 2


def test_shards_the_index_beside_them_does_not_vouch_for_are_refused(tmp_path: Path) -> None:
    root, other = _pack(tmp_path, "bestfit", seed=1), _pack(tmp_path, "bestfit", seed=2)
    stray = root / "stray-000000.tar"
    shutil.copy(other / "data-000000.tar", stray)
    shutil.copy(other / "data-000000.idx", root / "stray-000000.idx")
    with pytest.raises(ValueError, match=r"stray-000000\.tar is not a shard of the index"):
        wdstream.Loader(str(root / "*.tar"), seq_len=SEQ, batch_size=2)
    stray.unlink()
    (root / "stray-000000.idx").unlink()
    # a shard of the same name from another pack: its sidecar is not the one listed
    for suffix in ("tar", "idx"):
        shutil.copy(other / f"data-000001.{suffix}", root / f"data-000001.{suffix}")
    with pytest.raises(CorruptShardError, match=r"data-000001\.idx: sha256 .* from another pack"):
        wdstream.Loader(str(root / "data-00000{0,1}.tar"), seq_len=SEQ, batch_size=2)


def test_shards_of_two_folders_one_without_an_index_are_refused(tmp_path: Path) -> None:
    root = _pack(tmp_path, "bestfit", seed=1)
    bare = tmp_path / "bare"
    bare.mkdir()
    for suffix in ("tar", "idx"):
        shutil.copy(root / f"data-000000.{suffix}", bare / f"data-000000.{suffix}")
    with pytest.raises(ValueError, match="have an index.json beside them and shards of"):
        wdstream.Loader([str(root / "data-000001.tar"), str(bare / "data-000000.tar")],
                        seq_len=SEQ, batch_size=2)  # fmt: skip
