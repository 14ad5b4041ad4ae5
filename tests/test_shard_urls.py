"""Shard URLs instead of a root: brace patterns and wildcards, local and on S3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wdstream import Loader
from wdstream.read.sources.packed import expand_urls
from wdstream.testing import write_synthetic_dataset

pytest_plugins = ["tests.fixtures_remote"]

OPTS = dict(seq_len=16, batch_size=2, num_workers=0, shuffle=True, seed=4, epochs=1)


def rows(source: str) -> np.ndarray:
    return np.concatenate([b["input_ids"].numpy() for b in Loader(source, **OPTS)])


def test_wildcard_brace_and_root_read_the_same_batches(tmp_path: Path) -> None:
    write_synthetic_dataset(str(tmp_path), n_docs=20, sample_tokens=17, samples_per_shard=5)
    (tmp_path / "index.json").unlink()  # shards alone, as the new user had them
    (tmp_path / "notes.txt").write_text("not a shard")
    n = len(list(tmp_path.glob("data-*.tar")))
    assert n >= 4
    braces = str(tmp_path / f"data-{{000000..{n - 1:06d}}}.tar")
    assert expand_urls(str(tmp_path / "data-*.tar")) == expand_urls(braces)
    assert np.array_equal(rows(str(tmp_path / "*.tar")), rows(braces))


def test_wildcard_that_matches_nothing_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothing-\*\.tar: no shard matches"):
        Loader(str(tmp_path / "nothing-*.tar"), seq_len=16, batch_size=2)


def test_wildcard_on_s3(tmp_path: Path, s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/ds"
    write_synthetic_dataset(url, n_docs=20, sample_tokens=17, samples_per_shard=5)
    write_synthetic_dataset(str(tmp_path), n_docs=20, sample_tokens=17, samples_per_shard=5)
    names = [u.rsplit("/", 1)[1] for u in expand_urls(f"{url}/data-00000?.tar")]
    assert names == sorted(p.name for p in tmp_path.glob("data-00000?.tar"))
    assert np.array_equal(rows(f"{url}/data-*.tar"), rows(str(tmp_path / "data-*.tar")))
