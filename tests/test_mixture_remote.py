"""A mixture of sources on three stores -- local disk, S3 (moto's server) and HTTP (a local
range-serving server) -- gives the same batches as the same datasets all on disk, and
resumes from a state across stores."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.servers import FileServer
from tests.test_mixture_loader import _take
from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

pytest_plugins = ["tests.fixtures_remote"]

OPTS = dict(seq_len=16, batch_size=4, num_workers=0, chunk_batches=2, shuffle_window=8,
            shuffle_lanes=2, weights={"web": 0.5, "code": 0.25, "math": 0.25})  # fmt: skip


def test_mixture_across_local_s3_and_http(
    tmp_path: Path, s3_bucket: str, http_server: FileServer
) -> None:
    spec = {"web": dict(n_docs=20), "code": dict(n_docs=6, seed=1), "math": dict(n_docs=8, seed=2)}
    local = {}
    for name, kw in spec.items():
        local[name] = str(tmp_path / name)
        write_synthetic_dataset(local[name], sample_tokens=17, samples_per_shard=5, **kw)
    write_synthetic_dataset(f"s3://{s3_bucket}/code", sample_tokens=17, samples_per_shard=5,
                            **spec["code"])  # fmt: skip
    write_synthetic_dataset(str(http_server.root / "math"), sample_tokens=17, samples_per_shard=5,
                            **spec["math"])  # fmt: skip
    mixed = {"web": local["web"], "code": f"s3://{s3_bucket}/code",
             "math": f"{http_server.base_url}/math"}  # fmt: skip
    want = _take(Loader(local, **OPTS), 12)
    loader = Loader(mixed, **OPTS)
    got = _take(loader, 5)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = Loader(mixed, **OPTS)
    resumed.load_state_dict(state)
    got += _take(resumed, 7)
    assert {int(s) for b in got for s in b["source"]} == {0, 1, 2}
    for a, b in zip(got, want, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in b)
