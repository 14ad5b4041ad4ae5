"""tools/benchlib/bestfit.py: the layout models the issue-11 table is made of, and its section."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

from benchlib import bestfit as bf  # noqa: E402


@given(st.lists(st.integers(2, 300), min_size=1, max_size=80), st.integers(8, 100))
def test_layouts_keep_their_promises(lens: list[int], S: int) -> None:
    ls = np.array(lens, dtype=np.int64)
    total = int(ls.sum())
    concat, pad = bf.layout_concat(ls, S), bf.layout_pad(ls, S)
    crop, best = bf.layout_crop(ls, S, buffer=8), bf.layout_bestfit(ls, S, buffer=8)
    assert concat["rows"] == total // S and concat["padding_pct"] == 0
    assert pad["dropped_pct"] == 0 and pad["rows"] == sum(-(-n // S) for n in lens)
    assert crop["padding_pct"] == 0 and crop["truncated"] >= sum(n > S for n in lens)
    # Best fit: nothing dropped, only documents longer than a row cut, and never more rows
    # than padding every document.
    assert best["dropped_pct"] == 0 and best["truncated"] == sum(n > S for n in lens)
    assert best["rows"] <= pad["rows"] and best["rows"] * S >= total


def test_random_batches_respect_the_budget_and_hold_every_row() -> None:
    rows = bf.long_tailed(500) - 1
    rows = np.minimum(rows, 1000)
    batches = bf.random_batches(rows, 4000)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(rows)))
    assert all(len(b) * int(rows[b].max()) <= 4000 for b in batches)
    pad = bf.bucket_padding(rows + 1, seq_len=1000, budget=4000)
    assert pad["bucketed_pct"] < pad["random_pct"]


def test_section_renders_the_tables_and_goals() -> None:
    lay = {"truncated": 1, "truncated_pct": 10.0, "padding_pct": 0.5, "dropped_pct": 0.0,
           "rows": 7}  # fmt: skip
    corpus = {"documents": 10, "tokens": 100,
              "layouts": {str(s): {k: lay for k in bf.LAYOUTS} for s in bf.SEQ_LENS},
              "buckets": {"bucketed_pct": 1.0, "random_pct": 40.0}}  # fmt: skip
    r = {"args": {"repeats": 1},
         "bestfit": {"bench": corpus, "long-tailed": corpus,
                     "read_buckets": {"tokens_per_s": 2e6, "padding_pct": 1.0, "batches": 3},
                     "pack": {"concat": [{"round": 0, "seconds": 2.0}],
                              "bestfit": [{"round": 0, "seconds": 2.5}]}}}  # fmt: skip
    text = "\n".join(bf.section(r, []))
    assert "| **bestfit** | 1 (10.00 %) | 0.50 % | 0.00 % | 7 |" in text
    assert "bestfit padding, worst case 0.50 % (goal ≤ 1 %: met; floor ≤ 3 %: met)" in text
    assert "bestfit pack vs concat 0.80x (goal ≥ 0.9x: NOT met)" in text
    assert bf.section({}, []) == ["## Rows that keep documents whole (bestfit)", "", "Not run.", ""]
