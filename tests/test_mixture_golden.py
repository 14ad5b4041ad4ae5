"""Pinned mixture batches: a fixed mixture's batches, states, ``batch_at`` and ``explain``
against digests recorded from the reader as it was at 4ea6d70 (before the one-pass fill).

The oracle is that stored record, not the code under test: any change to which rows a
mixture yields, in what order, from which source, or with what document boundaries, changes
a digest here. If one fails after an *intended* change of the sequence, every saved mixture
state changes meaning too: bump ``MIXTURE_ORDER_VERSION`` and re-pin.

Sources as in ``test_mixture_loader``: ``code`` is small (upsampled, several epochs), ``books``
is packed at seq_len 32 and read at 16 (rows straddle its samples), windows of 12 samples
(a chunk's rows of one source span several windows and epochs).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from wdstream import Loader
from wdstream.read.mixture.inspect import explain_mixture_steps, mixture_explanation_records
from wdstream.testing import write_synthetic_dataset

pytestmark = pytest.mark.timeout(120)

SEQ = 16
OPTS: dict[str, Any] = dict(seq_len=SEQ, shuffle_window=12, shuffle_lanes=2, seed=5)
W = {"web": 0.5, "code": 0.3, "books": 0.2}
SCHEDULE = [
    (0, {"web": 0.6, "code": 0.2, "books": 0.2}),
    (9, {"web": 0.1, "code": 0.0, "books": 0.9}),
]

# sha256 of each run below, recorded at 4ea6d70 (see the module docstring).
GOLDEN = {
    "one_rank": "38d872ae9179157de6f55cbdcd9029c584b9e43e04ed78fecaa961497da6f1b9",
    "rank_1_of_2_workers_2": "323356f21f5ab81cac2c453a78db7ab5672102187b2f52b83e1f5a72310f9ac2",
    "doc_boundaries": "f20804d7c35f254eed72fa89b9db9fa0192be4f62c4ea0dc220f980accf5a844",
    "schedule_first_exhausted": "235c7763b381236a8d0e84cccaab9934ca8486740feae2ff73eaefc914eb6fca",
    "resumed_workers_2": "759cd89d9a840f650e42029370cbc734496854fe8a2149da27446d19ac646ad3",
    "state": "e6ffb3bd972dc2895efd7242923ccce3d42ec3745b677aa05725833064c7a436",
    "elastic_batch_3": "686a899d58ff9e5b70aefd2cd3be3cd60a7d670510c796b8a13b28dc16f0c006",
    "batch_at": "43122598d4cb01ffd1e28694ed95d8f635dd46569e8edf0ed96a454e88682103",
    "explain": "85aca7ffb472c2273f1ea67bdb0b5fb659f2908c3b93fae5bbb4529113497ca5",
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixgolden")
    write_synthetic_dataset(str(root / "web"), n_docs=50, sample_tokens=17, samples_per_shard=9)
    write_synthetic_dataset(
        str(root / "code"), n_docs=6, sample_tokens=17, samples_per_shard=5, seed=1
    )
    write_synthetic_dataset(
        str(root / "books"), n_docs=40, sample_tokens=33, samples_per_shard=6, seed=2
    )
    return {name: str(root / name) for name in ("web", "code", "books")}


def _digest(batches: Iterable[dict[str, torch.Tensor]]) -> str:
    """Every key of every batch: its name, dtype, shape and bytes (little-endian)."""
    h = hashlib.sha256()
    for batch in batches:
        for key in sorted(batch):
            t = batch[key].contiguous()
            h.update(f"{key} {t.dtype} {tuple(t.shape)}".encode())
            h.update(t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes())
    return h.hexdigest()


def _text_digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _take(loader: Loader, n: int) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(loader, n))


def _runs(sources: dict[str, str], where: Path) -> dict[str, str]:
    """Each pinned run's digest."""
    out = {}
    one = Loader(sources, batch_size=8, num_workers=0, weights=W, **OPTS)
    out["one_rank"] = _digest(_take(one, 60))
    rank = Loader(sources, batch_size=4, rank=1, world_size=2, num_workers=2, chunk_batches=3,
                  weights=W, **OPTS)  # fmt: skip
    out["rank_1_of_2_workers_2"] = _digest(_take(rank, 60))
    docs = Loader(sources, batch_size=4, num_workers=0, chunk_batches=3, weights=W,
                  return_doc_boundaries=True, **OPTS)  # fmt: skip
    out["doc_boundaries"] = _digest(_take(docs, 40))
    sched = Loader(sources, batch_size=5, num_workers=0, chunk_batches=4, weights=SCHEDULE,
                   stop="first_exhausted", **OPTS)  # fmt: skip
    out["schedule_first_exhausted"] = _digest([*sched, *sched])
    saver = Loader(sources, batch_size=8, num_workers=0, weights=W, **OPTS)
    _take(saver, 9)
    state = json.loads(json.dumps(saver.state_dict()))
    out["state"] = _text_digest(state)
    resumed = Loader(sources, batch_size=8, num_workers=2, chunk_batches=3, weights=W, **OPTS)
    resumed.load_state_dict(state)
    out["resumed_workers_2"] = _digest(_take(resumed, 20))
    small = Loader(sources, batch_size=3, num_workers=0, weights=W, **OPTS)
    small.load_state_dict(state)
    out["elastic_batch_3"] = _digest(_take(small, 15))
    out["batch_at"] = _digest([one.batch_at(k) for k in (0, 1, 7, 100, 12_345, 2**40)])
    spec = where / "mix.json"
    spec.write_text(json.dumps({"sources": sources, "weights": W}))
    exps = explain_mixture_steps(spec, [0, 3, 50, 2**30], batch_size=4, world_size=2, **OPTS)
    out["explain"] = _text_digest([mixture_explanation_records(e) for e in exps])
    return out


def test_mixture_batches_are_the_pinned_ones(sources: dict[str, str], tmp_path: Path) -> None:
    assert _runs(sources, tmp_path) == GOLDEN
