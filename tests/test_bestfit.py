"""``--mode bestfit``: the layout's invariants (Hypothesis), the sample builder's exact resume points,
real packs (byte-identical for any worker count, after SIGKILL), ``verify`` and ``stats``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import wdstream
from tests.conftest import make_corpus
from tests.test_pack import EOT, expected_docs, raw_samples
from tests.test_pack_resume import _files, _kill_after
from wdstream.errors import IndexValidationError
from wdstream.format.index import DatasetIndex
from wdstream.inspect import dataset_stats, verify_dataset
from wdstream.storage import LocalStore
from wdstream.write.bestfit import BestFitSampleBuilder, bestfit_blocks, bestfit_rows

PAD = 9999

lengths = st.lists(st.integers(1, 60), min_size=1, max_size=60)
row_sizes = st.integers(1, 24)


def _doc_pieces(rows: list[list[tuple[int, int, int]]]) -> dict[int, list[tuple[int, int, int]]]:
    """Per document its pieces as (row number, start, stop), in row order."""
    out: dict[int, list[tuple[int, int, int]]] = {}
    for r, row in enumerate(rows):
        for d, a, b in row:
            out.setdefault(d, []).append((r, a, b))
    return out


@given(lengths, row_sizes)
def test_layout_keeps_documents_whole_or_in_consecutive_rows(lens: list[int], S: int) -> None:
    rows = bestfit_rows(lens, S)
    assert rows == bestfit_rows(list(lens), S)  # a pure function of (lengths, S)
    for row in rows:
        assert sum(b - a for _, a, b in row) <= S
        assert sum(1 for _, a, _ in row if a > 0) <= 1  # at most one continuation ...
        assert all(a == 0 for _, a, _ in row[1:])  # ... and it comes first
        # A piece continued in the next row ends the row, and the row is full.
        assert all(b == lens[d] for d, _, b in row[:-1])
        if row[-1][2] < lens[row[-1][0]]:
            assert sum(b - a for _, a, b in row) == S
    pieces = _doc_pieces(rows)
    assert sorted(pieces) == list(range(len(lens)))  # every document, once
    for d, ps in pieces.items():
        # Its pieces tile [0, len) in order, in consecutive rows.
        assert [a for _, a, _ in ps] == [0] + [b for _, _, b in ps[:-1]]
        assert ps[-1][2] == lens[d]
        assert [r for r, _, _ in ps] == list(range(ps[0][0], ps[0][0] + len(ps)))
        if lens[d] <= S:
            assert len(ps) == 1  # only documents longer than a row are cut
        else:  # into pieces of at most a row: a head, full rows, a tail
            assert all(b - a == S for _, a, b in ps[1:-1])
            assert len(ps) <= -(-lens[d] // S) + 1


@given(lengths, row_sizes)
def test_at_most_one_row_is_less_than_half_full(lens: list[int], S: int) -> None:
    """Best fit never opens a row for a document that fits an open one, and the long
    documents' rows are full but their last: two rows under half full cannot both exist."""
    rows = bestfit_rows(lens, S)
    free = [S - sum(b - a for _, a, b in row) for row in rows]
    assert min(free) >= 0
    assert sum(2 * f > S for f in free) <= 1


def _docs(lens: list[int]) -> list[np.ndarray]:
    """Document d = tokens d*1000 + 0.., ending with EOT (recognisable, no PAD inside)."""
    return [np.append(np.arange(n - 1) + d * 1000, EOT).astype(np.uint32) for d, n in
            enumerate(lens)]  # fmt: skip


def _feed(builder: BestFitSampleBuilder, docs: list[np.ndarray], first: int, split: int) -> list:
    """Feed documents ``first..`` in batches of ``split`` documents; all samples out."""
    out = []
    for a in range(first, len(docs), split):
        part = docs[a : a + split]
        flat = np.concatenate(part)
        out += list(builder.add(flat, [len(p) for p in part], list(range(a, a + len(part)))))
    return out + list(builder.flush())


@given(lengths, row_sizes, st.integers(1, 9), st.integers(1, 7))
def test_sample_builder_rows_padding_and_documents(
    lens: list[int], S: int, buffer: int, split: int
) -> None:
    docs = _docs(lens)
    samples = _feed(BestFitSampleBuilder(S, np.dtype("<u4"), buffer, PAD), docs, 0, split)
    # Batching of the input never changes the output.
    again = _feed(BestFitSampleBuilder(S, np.dtype("<u4"), buffer, PAD), docs, 0, len(docs))
    assert [(s.tokens.tolist(), s.doc_lens, s.cont) for s in samples] == [
        (s.tokens.tolist(), s.doc_lens, s.cont) for s in again
    ]
    rebuilt: list[list[int]] = []
    for s in samples:
        assert len(s.tokens) == S and sum(s.doc_lens) == S  # every row exactly S tokens
        pad = s.doc_lens[-1]
        assert s.tokens[S - pad :].tolist() == [PAD] * pad
        assert PAD not in s.tokens[: S - pad].tolist()
        at = 0
        for j, n in enumerate(s.doc_lens[:-1]):
            piece = s.tokens[at : at + n].tolist()
            if j == 0 and s.cont:
                rebuilt[-1] += piece
            else:
                rebuilt.append(piece)
            at += n
        assert s.new_docs == len(s.doc_lens) - 1 - s.cont == len(s.starts)
    # Every document exactly once, whole (rebuilt from consecutive pieces).
    assert sorted(rebuilt) == sorted(d.tolist() for d in docs)


@given(lengths, row_sizes, st.integers(1, 9), st.data())
def test_every_sample_end_is_an_exact_resume_point(
    lens: list[int], S: int, buffer: int, data: st.DataObject
) -> None:
    """What pack does on resume: restart at the recorded document, skip the recorded rows."""
    docs = _docs(lens)
    samples = _feed(BestFitSampleBuilder(S, np.dtype("<u4"), buffer, PAD), docs, 0, 3)
    k = data.draw(st.integers(1, len(samples)))
    first, rows = samples[k - 1].end
    builder = BestFitSampleBuilder(S, np.dtype("<u4"), buffer, PAD)
    builder.resume_rows(rows)
    rest = _feed(builder, docs, first, data.draw(st.integers(1, 5)))
    assert [s.tokens.tolist() for s in rest] == [s.tokens.tolist() for s in samples[k:]]
    assert [s.end for s in rest] == [s.end for s in samples[k:]]


def test_layout_example_of_the_docstring() -> None:
    rows = bestfit_rows([3, 7, 2, 1], 5)
    assert rows == [[(1, 0, 5)], [(1, 5, 7), (0, 0, 3)], [(2, 0, 2), (3, 0, 1)]]


# -- real packs ---------------------------------------------------------------------------

OPTS = dict(seq_len=63, mode="bestfit", bestfit_buffer=16, shard_size="16KB")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return make_corpus(n_docs=90, seed=3, stdlib_files=1)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, texts: list[str]) -> Path:
    d = tmp_path_factory.mktemp("bestfit")
    src = d / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    wdstream.pack([str(src)], str(d / "out"), workers=0, **OPTS)  # type: ignore[arg-type]
    return d


def test_pack_holds_every_document_once_and_verifies(packed: Path, texts: list[str]) -> None:
    out = packed / "out"
    index = json.loads((out / "index.json").read_text())
    assert (index["mode"], index["pad_id"], index["sample_tokens"]) == ("bestfit", EOT, 64)
    assert len(list(out.glob("*.prov"))) == len(index["shards"])  # rows trace to lines too
    samples = raw_samples(out)
    docs: list[list[int]] = []
    for s in samples:
        assert len(s.tokens) == 64 and sum(s.doc_lens) == 64
        at = 0
        for j, n in enumerate(s.doc_lens[:-1]):
            piece = s.tokens[at : at + n].tolist()
            docs[-1:] = [docs[-1] + piece] if j == 0 and s.cont else [*docs[-1:], piece]
            at += n
        assert s.tokens[at:].tolist() == [EOT] * s.doc_lens[-1]
    want = sorted(d.tolist() for d in expected_docs(texts))
    assert sorted(docs) == want
    assert sum(sh["documents"] for sh in index["shards"]) == len(want)
    report = verify_dataset(LocalStore(str(out)))
    assert report.ok, report.problems


def test_documents_of_a_bestfit_dataset_are_the_input_documents(
    packed: Path, texts: list[str]
) -> None:
    got = sorted(d.tolist() for d in wdstream.documents(str(packed / "out")))
    assert got == sorted(d.tolist() for d in expected_docs(texts))


def test_stats_report_truncation_padding_and_rows(packed: Path, texts: list[str]) -> None:
    s = dataset_stats(LocalStore(str(packed / "out")))
    samples = raw_samples(packed / "out")
    lens = [len(d) for d in expected_docs(texts)]
    pad = sum(x.doc_lens[-1] for x in samples)
    assert s["rows"] == len(samples)
    assert s["documents_split"] == sum(n > 64 for n in lens)
    assert s["padding_tokens"] == pad
    assert s["padding_pct"] == pytest.approx(100 * pad / (64 * len(samples)))
    assert s["documents"] == len(lens)


def test_workers_and_sigkill_resume_are_byte_identical(packed: Path, tmp_path: Path) -> None:
    src = packed / "in.jsonl"
    expected = _files(packed / "out")
    out2 = tmp_path / "w2"
    wdstream.pack([str(src)], str(out2), workers=2, **OPTS)  # type: ignore[arg-type]
    assert _files(out2) == expected
    n_shards = len(json.loads(expected["index.json"])["shards"])
    assert n_shards > 8
    cmd = [sys.executable, "-m", "wdstream.cli", "pack", str(src), "-o", str(tmp_path / "k"),
           "--seq-len", "63", "--mode", "bestfit", "--bestfit-buffer", "16",
           "--shard-size", "16KB", "--quiet", "--workers", "0"]  # fmt: skip
    kills = sum(_kill_after(cmd, tmp_path / "k", k) for k in (2, n_shards // 2))
    assert kills == 2, "pack finished before it could be killed"
    subprocess.run(cmd, check=True)
    assert _files(tmp_path / "k") == expected


def test_bestfit_needs_eos(tmp_path: Path, write_jsonl: Callable[..., Path]) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", ["hello world"])
    with pytest.raises(ValueError, match="bestfit.*eos"):
        wdstream.pack([str(src)], str(tmp_path / "o"), mode="bestfit", eos=False, workers=0)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda ix: ix.pop("pad_id"), "pad_id: expected eos_id = 100257 when mode is 'bestfit'"),
        (lambda ix: ix.update(pad_id=5), "pad_id: expected eos_id = 100257 when mode is"),
        (lambda ix: ix.update(eos_id=None), "eos_id: expected an id when mode is 'bestfit'"),
        (lambda ix: ix.update(mode="concat"), "pad_id: expected none when mode is 'concat'"),
        (lambda ix: ix.update(sample_tokens=65), "sample_tokens: expected seq_len + 1 = 64"),
        (
            lambda ix: ix["shards"][-1].update(tokens=ix["shards"][-1]["tokens"] - 1),
            "tokens: expected",
        ),
    ],
)
def test_index_rules_of_bestfit(packed: Path, edit: Callable, message: str) -> None:
    index = json.loads((packed / "out" / "index.json").read_text())
    DatasetIndex.from_json(json.dumps(index))  # as packed: valid
    edit(index)
    with pytest.raises(IndexValidationError, match=re.escape(message)):
        DatasetIndex.from_json(json.dumps(index))


@given(lengths, row_sizes, st.integers(1, 9))
def test_sample_builder_rows_are_the_layout_of_its_blocks(
    lens: list[int], S: int, buffer: int
) -> None:
    """The streaming sample builder cuts blocks as ``bestfit_blocks`` says and lays each out with
    ``bestfit_rows``: the offline functions give its exact output (what another engine reuses)."""
    docs = _docs(lens)
    got = [
        s.tokens.tolist()
        for s in _feed(BestFitSampleBuilder(S, np.dtype("<u4"), buffer, PAD), docs, 0, 4)
    ]
    want = []
    ends = bestfit_blocks(lens, buffer, S)
    for a, b in zip([0, *ends], ends, strict=False):
        for row in bestfit_rows(lens[a:b], S):
            toks = [t for d, x, y in row for t in docs[a + d][x:y].tolist()]
            want.append(toks + [PAD] * (S - len(toks)))
    assert got == want
