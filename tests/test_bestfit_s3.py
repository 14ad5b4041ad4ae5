"""``--mode bestfit`` on S3 (moto's server): the same bytes as a local pack, an interrupted
pack resumed byte-identical, and read back through the Loader."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import boto3
import pytest
import torch

import wdstream
from tests.conftest import make_corpus
from tests.fixtures_remote import aws_env, moto_endpoint, s3_bucket  # noqa: F401
from tests.test_pack_resume import _files
from wdstream.storage.s3 import S3Store

KW: dict = dict(seq_len=63, mode="bestfit", bestfit_buffer=16, shard_size="16KB", workers=0)


def _objects(endpoint: str, bucket: str, prefix: str) -> dict[str, bytes]:
    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    return {
        k[len(prefix) :]: s3.get_object(Bucket=bucket, Key=k)["Body"].read()
        for k in sorted(keys)
        if not k[len(prefix) :].startswith(".")
    }


def test_bestfit_on_s3_equals_local_resumes_and_reads(
    tmp_path: Path,
    aws_env: str,  # noqa: F811
    s3_bucket: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in make_corpus(90, seed=3, stdlib_files=1))
    )
    wdstream.pack([str(src)], str(tmp_path / "local"), **KW)
    local = _files(tmp_path / "local")
    assert len(json.loads(local["index.json"])["shards"]) > 6

    url = f"s3://{s3_bucket}/bf/"
    real = S3Store.writer

    @contextmanager
    def failing(self: S3Store, name: str) -> Iterator[BinaryIO]:
        with real(self, name) as out:
            yield out
            if name == "data-000005.tar":
                raise KeyboardInterrupt  # before the upload completes: as a Ctrl-C would

    with monkeypatch.context() as patch:
        patch.setattr(S3Store, "writer", failing)
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(src)], url, **KW)
    res = wdstream.pack([str(src)], url, **KW)
    assert res.resumed_shards == 5
    assert _objects(aws_env, s3_bucket, "bf/") == local

    remote = [
        b["labels"] for b in wdstream.Loader(url, seq_len=63, batch_size=4, num_workers=0, epochs=1)
    ]
    here = [
        b["labels"]
        for b in wdstream.Loader(
            str(tmp_path / "local"), seq_len=63, batch_size=4, num_workers=0, epochs=1
        )
    ]
    assert len(remote) == len(here) > 0
    assert all(torch.equal(a, b) for a, b in zip(remote, here, strict=True))
