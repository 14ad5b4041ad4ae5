"""Raw text read from S3 (moto) and HTTP through the same stores: equal to local, resumable."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests.servers import FileServer
from wdstream import Loader
from wdstream.storage import open_store
from wdstream.testing import assert_resumes_exactly

pytest_plugins = ["tests.fixtures_remote"]

pytestmark = pytest.mark.timeout(120)

KW: dict[str, Any] = dict(tokenizer="cl100k_base", seq_len=16, batch_size=2, epochs=1,
                          shuffle_window=4, chunk_batches=3)  # fmt: skip


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    d = tmp_path / "text"
    d.mkdir()
    for f in range(4):
        lines = [json.dumps({"text": f"doc {f}.{i}: " + "word " * (i % 13 + 1)}) for i in range(30)]
        (d / f"p-{f}.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
        (d / f"q-{f}.jsonl").write_text("\n".join(lines) + "\n")
    return d


def _batches(loader: Loader) -> list[list[list[int]]]:
    return [b["input_ids"].tolist() for b in loader]


def test_rawtext_from_s3_equals_local_and_resumes(s3_bucket: str, text_dir: Path) -> None:
    store = open_store(f"s3://{s3_bucket}/text")
    for p in text_dir.iterdir():
        store.write_bytes(p.name, p.read_bytes())
    for pattern in ("p-{0..3}.jsonl.gz", "q-{0..3}.jsonl"):
        want = _batches(Loader(f"{text_dir}/{pattern}", num_workers=0, streams=2, **KW))
        url = f"s3://{s3_bucket}/text/{pattern}"
        assert len(want) > 10
        assert _batches(Loader(url, num_workers=0, streams=2, **KW)) == want
        assert _batches(Loader(url, num_workers=2, **KW)) == want
    items = assert_resumes_exactly(
        lambda: Loader(url, num_workers=0, streams=2, **KW), check_at=[0, 7, 20]
    )
    assert len(items) == len(want)


def test_rawtext_over_faulty_http_equals_local(text_dir: Path) -> None:
    want = _batches(Loader(f"{text_dir}/q-{{0..3}}.jsonl", num_workers=0, **KW))
    with FileServer(text_dir) as server:
        server.faults.reset(cut_every=3, cut_at=700, fail_every=4)
        opts: dict[str, Any] = {"retries": 8, "backoff": 0.001, "timeout": 5.0}
        url = f"{server.base_url}/q-{{0..3}}.jsonl"
        got = _batches(Loader(url, num_workers=0, **KW, **opts))
        faults = list(server.faults.requests)
    assert got == want
    assert len(faults) > 3  # the faults were exercised
