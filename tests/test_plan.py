"""Plan stage: window geometry, epoch ranges, batch counts, and the stream cursor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdstream.read.order.plan import EpochPlan, WindowGeometry
from wdstream.read.order.streams import ReaderContext, TokenStream, start_cursor
from wdstream.read.order.streams_context import ReaderConfig
from wdstream.read.sources.packed import ShardSource
from wdstream.testing import assert_resumes_exactly, write_synthetic_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = str(tmp_path_factory.mktemp("plan"))
    write_synthetic_dataset(d, n_docs=120, sample_tokens=17, samples_per_shard=7)
    return d


@given(
    start=st.integers(0, 50),
    n=st.integers(0, 200),
    window=st.integers(1, 40),
    lanes=st.integers(1, 9),
)
@settings(max_examples=60, deadline=None)
def test_windows_partition_the_range(start: int, n: int, window: int, lanes: int) -> None:
    g = WindowGeometry(start, start + n, window, lanes)
    got = [i for w in range(g.n_windows) for p, q in g.spans(w) for i in range(p, q)]
    assert sorted(got) == list(range(start, start + n))
    assert all(sum(q - p for p, q in g.spans(w)) <= window + lanes for w in range(g.n_windows))
    assert all(g.spans(w) for w in range(g.n_windows))


def test_worked_example_from_docstring() -> None:
    g = WindowGeometry(0, 12, 6, 3)
    assert g.spans(0) == [(0, 2), (4, 6), (8, 10)]
    assert g.spans(1) == [(2, 4), (6, 8), (10, 12)]


@pytest.mark.parametrize("n_ranges", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("epoch", [0, 1])
def test_ranges_pieces_and_tokens(root: str, n_ranges: int, epoch: int) -> None:
    src = ShardSource(root)
    plan = EpochPlan(src, epoch, seed=3, shuffle=True, n_ranges=n_ranges)
    assert sorted(plan.order.tolist()) == list(range(len(src)))
    total = int(src.samples.sum())
    assert plan.range_len == total // n_ranges
    # tokens_before agrees with summing the decoded samples
    seq = [(int(sh), k) for sh in plan.order for k in range(src.samples[sh])]
    lens = [len(src.read([(sh, k, k + 1)])[0].tokens.views()[0]) for sh, k in seq]
    cum = np.concatenate([[0], np.cumsum(lens)])
    for p in [0, 1, 5, total // 2, total - 1, total]:
        assert plan.tokens_before(p) == cum[p]
    for g in range(n_ranges):
        p, q = plan.range(g)
        pieces = plan.pieces(p, q)
        assert [(sh, k) for sh, a, b in pieces for k in range(a, b)] == seq[p:q]


def test_docs_mode_tokens_use_sidecars(tmp_path) -> None:
    write_synthetic_dataset(str(tmp_path), n_docs=50, mode="docs", samples_per_shard=6)
    src = ShardSource(str(tmp_path))
    plan = EpochPlan(src, 0, seed=0, shuffle=True, n_ranges=4)
    lens = [len(t) for sh in plan.order
            for t in src.read([(int(sh), 0, int(src.samples[sh]))])[0].tokens.views()]  # fmt: skip
    for p in range(0, len(lens) + 1, 7):
        assert plan.tokens_before(p) == sum(lens[:p])


class _StreamRunner:
    """Adapter: a TokenStream as an iterable of batches with state_dict/load_state_dict."""

    def __init__(self, root: str) -> None:
        cfg = ReaderConfig(seq_len=20, batch_size=3, shuffle=True, seed=1, rank=1, world_size=2,
                           streams=2, shuffle_window=9, shuffle_lanes=3, chunk_batches=1,
                           doc_boundaries=True)  # fmt: skip
        self.cfg = cfg
        self.stream = TokenStream(ReaderContext(ShardSource(root), cfg), 1, start_cursor())

    def state_dict(self) -> dict:
        return {"version": 1, "cursor": self.stream.cursor()}

    def load_state_dict(self, state: dict) -> None:
        self.stream = TokenStream(self.stream.ctx, 1, state["cursor"])

    def __iter__(self):
        while True:
            tok = np.empty((self.cfg.batch_size, self.cfg.seq_len + 1), dtype=np.int32)
            doc = np.empty(tok.shape, dtype=bool)
            self.stream.fill(tok, doc, 1)
            yield {"t": tok.copy(), "d": doc.copy()}


def test_stream_resumes_exactly_across_epochs(root: str) -> None:
    items = assert_resumes_exactly(lambda: _StreamRunner(root), steps=70, check_at=range(0, 71, 3))
    assert len(items) == 70
