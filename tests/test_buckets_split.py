"""Bucketed batches never crop (issue 23 item 1): a document longer than ``seq_len`` inputs
is split into rows, so every token of every document is served exactly once per epoch.

Oracle: the documents decoded independently of the reader, from the shards with ``tarfile``
and ``msgpack`` (shard order from ``index.json`` read with ``json``), and the split rule
written out here: piece ``k`` of a document ``d`` is ``d[k*S : k*S + S + 1]`` at positions
``k*S ...``. Rows a world size leaves out (fewer than ``world_size`` batches an epoch) must
be exactly the ones the loader counts in ``epoch_stats`` and logs.
"""

from __future__ import annotations

import json
import logging
import tarfile
from collections import Counter
from pathlib import Path

import msgpack
import numpy as np
import pytest

import wdstream
from tests.conftest import pack_docs_corpus
from wdstream.errors import StateMismatchError
from wdstream.read.batches.buckets import BucketedBatches
from wdstream.testing import assert_resumes_exactly

SEQ, BUDGET = 64, 256


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return pack_docs_corpus(tmp_path_factory.mktemp("split"), 90, seed=5, stdlib_files=1)


def decoded_documents(root: str) -> list[np.ndarray]:
    """Every sample's tokens, in dataset order, with tarfile + msgpack only."""
    index = json.loads((Path(root) / "index.json").read_text())
    docs = []
    for shard in index["shards"]:
        with tarfile.open(Path(root) / shard["name"]) as tar:
            for member in tar.getmembers():
                if member.name.endswith((".mp", ".msgpack")):
                    f = tar.extractfile(member)
                    assert f is not None
                    sample = msgpack.unpackb(f.read(), raw=False)
                    docs.append(np.frombuffer(sample["tokens"], dtype="<" + {"uint16": "u2", "uint32": "u4"}[sample["dtype"]]).astype(np.int64))  # fmt: skip
    return docs


def expected_pieces(docs: list[np.ndarray]) -> Counter:
    """(first position, row tokens) of every row the split rule gives, with multiplicity."""
    out: Counter = Counter()
    for d in docs:
        for k in range(0, len(d) - 1, SEQ):
            out[(k, tuple(d[k : k + SEQ + 1].tolist()))] += 1
    return out


def served_rows(batches: list[dict]) -> Counter:
    out: Counter = Counter()
    for b in batches:
        for r in range(len(b["input_ids"])):
            n = int(b["attention_mask"][r].sum())
            pos = b["position_ids"][r, :n].tolist()
            assert pos == list(range(pos[0], pos[0] + n))  # positions continue within a row
            row = b["input_ids"][r, :n].tolist() + [int(b["labels"][r, n - 1])]
            assert b["labels"][r, : n - 1].tolist() == row[1:n]
            out[(pos[0], tuple(row))] += 1
    return out


def _loader(root: str, rank: int = 0, world: int = 1, **kw: object) -> wdstream.Loader:
    return wdstream.Loader(root, seq_len=SEQ, max_tokens=BUDGET, seed=1, rank=rank,
                           world_size=world, num_workers=0, **kw)  # fmt: skip


def test_the_corpus_has_documents_to_split(root: str) -> None:
    docs = decoded_documents(root)
    assert sum(len(d) > SEQ + 1 for d in docs) >= 10
    assert max(len(d) for d in docs) > 4 * SEQ  # some documents give several pieces


@pytest.mark.parametrize("world", [1, 2])
def test_every_token_of_every_document_is_served_once_per_epoch(
    root: str, world: int, caplog: pytest.LogCaptureFixture
) -> None:
    docs = decoded_documents(root)
    want = expected_pieces(docs)
    loaders = [_loader(root, r, world, epochs=None) for r in range(world)]
    with caplog.at_level(logging.INFO, logger="wdstream.read"):
        its = [iter(ld) for ld in loaders]
        for epoch in range(2):
            stats = loaders[0].epoch_stats(epoch)
            per_rank = stats["served_batches"] // world
            assert len({ld.epoch_stats(epoch)["served_batches"] for ld in loaders}) == 1
            served = served_rows([next(it) for it in its for _ in range(per_rank)])
            left = want - served
            assert not served - want, "a row served twice, or a row no document holds"
            # What is not served is exactly what the loader counts as left out, and logs.
            assert sum(left.values()) == stats["left_out_rows"]
            assert (
                sum(n * (len(row) - 1) for (_, row), n in left.items()) == stats["left_out_tokens"]
            )
            assert stats["tokens"] == sum(len(d) - 1 for d in docs if len(d) > 1)
            assert stats["split_documents"] == sum(len(d) > SEQ + 1 for d in docs)
            if world == 1:
                assert served == want and stats["left_out_batches"] == 0
            said = f"max_tokens epoch {epoch}: {stats['left_out_batches']} of"
            assert (said in caplog.text) == bool(stats["left_out_batches"])


def test_resumes_exactly_and_elastically_with_split_documents(root: str) -> None:
    n = len(_loader(root, 0, 2))
    assert_resumes_exactly(lambda: _loader(root, 1, 2, epochs=2), check_at=[0, 1, n - 1, n, n + 1])
    one = list(_loader(root, epochs=1))
    two = _loader(root, 0, 2, epochs=1)
    it = iter(two)
    for _ in range(3):
        next(it)
    rest = _loader(root, epochs=1)
    rest.load_state_dict(two.state_dict())
    assert [b["input_ids"].tolist() for b in rest] == [b["input_ids"].tolist() for b in one[6:]]


def test_a_version_1_state_loads_only_where_nothing_is_split(root: str) -> None:
    state = {**_loader(root).state_dict(), "version": 1}
    with pytest.raises(StateMismatchError, match="cropped documents longer than seq_len=64"):
        _loader(root).load_state_dict(state)
    # With seq_len above every document's length the rows are the documents: the plan is
    # version 1's, and its states load.
    longest = max(len(d) for d in decoded_documents(root))
    big = BucketedBatches(root, seq_len=longest, max_tokens=4 * longest, seed=1)
    assert big.split_documents == 0
    big.load_state_dict({**big.state_dict(), "version": 1, "batch": 2})
    assert big.state_dict()["batch"] == 2 and big.state_dict()["version"] == 2
