"""The driver's span layout (concat, docs) against the sample-by-sample layout it replaced.

No cluster: the layouts and the shard task are plain code. The oracle is the per-sample
layout (the local engine's sample builder over token indices, cut by ``ShardCutter``, which
the byte-identity tests of ``tests/test_ray_pack.py`` pinned against the local engine): both
lay out the same pieces, their shard tasks write into two folders, and every file must be
byte-identical, with the same journal positions and piece bookkeeping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wdstream.format.sample import DTYPES, encoded_size
from wdstream.inputs import InputPosition
from wdstream.ray.layout import CutShard, SampleLayout, ShardCutter
from wdstream.ray.spans import SpanLayout, encoded_sizes, member_sizes, uint_sizes
from wdstream.ray.tasks import ShardJob, write_shard
from wdstream.write.builders import sample_builder
from wdstream.write.shards import sample_member_size

EOS = 7


def test_member_sizes_equal_the_encoded_members() -> None:
    """Every msgpack width of doc_lens values, array lengths and token bins."""
    rng = np.random.default_rng(1)
    values = [1, 127, 128, 255, 256, 65535, 65536, 70000, 2**32 - 1, 2**32]
    for dtype in ("uint16", "uint32"):
        dt = DTYPES[dtype]
        for _ in range(300):
            k = int(rng.choice([1, 2, 15, 16, 17, 40]))
            doc_lens = [int(v) for v in rng.choice(values, size=k)]
            n = int(rng.choice([1, 63, 64, 127, 128, 16383, 16384, 20000]))
            want = encoded_size(n, dt, doc_lens, bool(k % 2))
            args = (np.array([n]), np.array([k]), np.array([uint_sizes(np.array(doc_lens)).sum()]))
            assert int(encoded_sizes(*args, dt)[0]) == want, (dtype, n, doc_lens)
            assert int(member_sizes(*args, dt)[0]) == sample_member_size(123, want)


def _lay_out(
    mode: str,
    pieces: list[np.ndarray],
    seq_len: int,
    shard_bytes: int,
    shard_samples: int | None,
    pre: int,
    spans: bool,
) -> list[CutShard]:
    """Lay ``pieces`` (document lengths) out one way; the run resumes ``pre`` tokens into
    its first document, numbering from shard 2, sample 30, document 11."""
    first = (2, 30, 11)
    file_of = [i % 3 for i, lens in enumerate(pieces) for _ in lens]  # a piece's file

    def _position(doc: int) -> InputPosition:
        return InputPosition(file_of[doc], 10 * doc + 1, 0, 0, 0, 0)

    layout: SpanLayout | SampleLayout
    if spans:
        per = seq_len + 1 if mode == "concat" else None
        layout = SpanLayout(per, shard_bytes, shard_samples, "uint32", *first, _position)
    else:
        builder = sample_builder(mode, seq_len, 1, None, EOS, np.dtype(np.int64), -1)
        if pre:
            builder.resume_inside_document(pre)  # type: ignore[attr-defined]
        cutter = ShardCutter(
            shard_bytes, shard_samples, "uint32", *first, doc_offset=pre, consecutive=True
        )
        layout = SampleLayout(builder, cutter, _position)
    cuts: list[CutShard] = []
    piece_starts: list[int] = []
    tokens = docs = 0
    for i, lens in enumerate(pieces):
        piece_starts.append(tokens)
        ntok, first_tok, first_id, kept = int(lens.sum()), tokens, docs, lens
        skip = pre if i == 0 else 0
        if skip:
            kept = np.concatenate(([lens[0] - skip], lens[1:]))
        if isinstance(layout, SpanLayout):
            records = 10 * np.arange(docs, docs + len(lens)) + 1
            cuts += layout.add(first_tok + skip, kept, first_id, i % 3, records, skip, piece_starts)
        else:
            idx = np.arange(first_tok + skip, first_tok + ntok, dtype=np.int64)
            cuts += layout.add(idx, kept, list(range(docs, docs + len(lens))), piece_starts)
        tokens += ntok
        docs += len(lens)
    return cuts + layout.close(piece_starts)


def _write(cuts: list[CutShard], arrays: list[np.ndarray], root: Path) -> dict[str, bytes]:
    job = ShardJob(str(root), {}, "data", 1 << 40, None, ["a.jsonl", "b.jsonl", "c.jsonl"],
                   "uint32", EOS)  # fmt: skip
    for cut in cuts:
        write_shard(job, cut.plan, *[arrays[p] for p in cut.pieces])
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


CASES: dict[str, dict[str, Any]] = {
    "concat-many-shards": {"mode": "concat", "seq_len": 127, "shard_bytes": 6000},
    "concat-shard-samples": {
        "mode": "concat",
        "seq_len": 127,
        "shard_bytes": 1 << 20,
        "shard_samples": 3,
    },  # fmt: skip
    "concat-one-sample-per-shard": {"mode": "concat", "seq_len": 200, "shard_bytes": 100},
    "concat-short-docs": {"mode": "concat", "seq_len": 300, "shard_bytes": 4000, "short": True},
    "concat-resumed": {"mode": "concat", "seq_len": 127, "shard_bytes": 5000, "pre": 5},
    "docs": {"mode": "docs", "seq_len": 300, "shard_bytes": 4000},
    "docs-shard-samples": {
        "mode": "docs",
        "seq_len": 300,
        "shard_bytes": 1 << 20,
        "shard_samples": 2,
    },  # fmt: skip
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_span_layout_writes_the_per_sample_layouts_bytes(
    case: str, seed: int, tmp_path: Path
) -> None:
    c = {"shard_samples": None, "pre": 0, "short": False, **CASES[case]}
    rng = np.random.default_rng(seed)
    pieces = []
    for k in range(9):
        n = 0 if k == 4 else int(rng.integers(1, 300 if c["short"] else 30))  # 4: no documents
        high = 6 if c["short"] else 300
        pieces.append(rng.integers(1, high, size=n).astype(np.int64))
    pieces[2][0] = 700  # a document longer than several samples
    if c["mode"] == "docs":
        pieces = [np.minimum(p, c["seq_len"] + 1) for p in pieces]
    args = (c["mode"], pieces, c["seq_len"], c["shard_bytes"], c["shard_samples"], c["pre"])
    old, new = _lay_out(*args, spans=False), _lay_out(*args, spans=True)
    assert len(new) == len(old) > 3, len(old)
    for a, b in zip(old, new, strict=True):
        assert (b.plan.index, b.plan.first_sample, b.plan.first_doc) == (
            a.plan.index, a.plan.first_sample, a.plan.first_doc,
        )  # fmt: skip
        assert b.end == a.end
        assert (b.pieces, b.tokens_per_piece) == (a.pieces, a.tokens_per_piece)
    arrays = [rng.integers(0, 50_000, size=int(p.sum())).astype(np.uint32) for p in pieces]
    want = _write(old, arrays, tmp_path / "old")
    assert _write(new, arrays, tmp_path / "new") == want
    assert len(want) == 3 * len(old)  # tar, sidecar, provenance table per shard
