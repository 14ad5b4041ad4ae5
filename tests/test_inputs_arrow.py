"""Parquet and Arrow IPC inputs: the same documents as a JSON Lines file give the same bytes
(several row groups, batches cut inside them, IPC file and stream formats), rows are named
``file:row`` by errors and ``explain``, bad rows are raised or skipped and counted, and an
interrupted pack resumes mid row group to the uninterrupted bytes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import wdstream
from tests.conftest import make_corpus
from tests.test_pack_resume import _interrupted_writer
from tests.writer_support import assert_same_dataset, cli_pack, visible
from wdstream.cli import main
from wdstream.errors import InputError
from wdstream.inputs import arrow
from wdstream.storage import LocalStore
from wdstream.write.pack import JOURNAL_NAME

CLI_OPTS = ["--seq-len", "31", "--shard-size", "8KB", "--workers", "0"]
DOCS = make_corpus(n_docs=90, seed=7, stdlib_files=1)  # doc i starts "doc {i}:"


def _table(docs: list[Any]) -> pa.Table:
    """The documents as a ``text`` column beside columns a text pack does not read."""
    return pa.table({"id": list(range(len(docs))), "text": docs,
                     "meta": [{"n": i} for i in range(len(docs))]})  # fmt: skip


def _write_ipc(path: Path, table: pa.Table, stream: bool) -> Path:
    with pa.OSFile(str(path), "wb") as sink:
        new = pa.ipc.new_stream if stream else pa.ipc.new_file
        with new(sink, table.schema) as w:
            w.write_table(table, max_chunksize=25)
    return path


def _jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("arrow")
    table = _table(DOCS)
    pq.write_table(table, d / "docs.parquet", row_group_size=20)  # 5 row groups
    return {
        "jsonl": _jsonl(d / "docs.jsonl", [{"text": t} for t in DOCS]),
        "parquet": d / "docs.parquet",
        "arrow-file": _write_ipc(d / "docs.arrow", table, stream=False),
        "arrow-stream": _write_ipc(d / "stream.arrow", table, stream=True),
    }


@pytest.mark.parametrize(
    ("kind", "mode"),
    [("parquet", "concat"), ("parquet", "bestfit"), ("arrow-file", "concat"),
     ("arrow-stream", "docs")],
)  # fmt: skip
def test_tables_give_the_jsonl_bytes(
    tmp_path: Path,
    inputs: dict[str, Path],
    kind: str,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(arrow, "BATCH_ROWS", 7)  # batches cut inside row groups too
    cli_pack([str(inputs["jsonl"])], tmp_path / "ref", *CLI_OPTS, "--mode", mode)
    cli_pack([str(inputs[kind])], tmp_path / "got", *CLI_OPTS, "--mode", mode)
    names = {str(inputs[kind]): str(inputs["jsonl"])}
    assert_same_dataset(tmp_path / "got", tmp_path / "ref", stats=("input_bytes",), names=names)


def test_explain_names_the_row(tmp_path: Path, inputs: dict[str, Path]) -> None:
    out = tmp_path / "out"
    cli_pack([str(inputs["parquet"])], out, *CLI_OPTS)
    starts = 0
    for step in range(0, 60, 3):
        exp = wdstream.explain(str(out), step, batch_size=1, shuffle=False, text=True)
        for piece in exp.rows[0].pieces:
            assert piece.file == str(inputs["parquet"])
            if piece.doc_start == 0 and piece.line <= 90:  # doc i is row i + 1
                assert piece.text is not None and piece.text.startswith(f"doc {piece.line - 1}:")
                starts += 1
    assert starts > 5


def test_resume_inside_a_row_group_is_byte_identical(
    tmp_path: Path, inputs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrow, "BATCH_ROWS", 7)
    src = [str(inputs["parquet"])]
    kw: dict[str, Any] = {"seq_len": 31, "shard_size": "8KB", "workers": 0}
    wdstream.pack(src, str(tmp_path / "ref"), **kw)
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer("data-000015.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack(src, str(out), **kw)
    assert "index.json" not in visible(out)
    row = json.loads((out / JOURNAL_NAME).read_bytes())["position"]["position"][1]
    assert row % 20 >= 7  # the resume row is past its row group's first batch
    assert wdstream.pack(src, str(out), **kw).resumed_shards == 15
    # The input byte count continued exactly too: index.json compared whole.
    assert_same_dataset(out, tmp_path / "ref")


def test_nested_text_key_and_pretokenized_rows(tmp_path: Path) -> None:
    docs = DOCS[:30]
    pq.write_table(pa.table({"meta": [{"body": t, "n": 1} for t in docs]}), tmp_path / "n.parquet")
    _jsonl(tmp_path / "n.jsonl", [{"meta": {"body": t}} for t in docs])
    for name in ("n.parquet", "n.jsonl"):
        cli_pack([str(tmp_path / name)], tmp_path / name.replace(".", "-"), *CLI_OPTS,
                 "--text-key", "meta.body")  # fmt: skip
    names = {str(tmp_path / "n.parquet"): str(tmp_path / "n.jsonl")}
    assert_same_dataset(tmp_path / "n-parquet", tmp_path / "n-jsonl", stats=("input_bytes",),
                        names=names)  # fmt: skip

    # 2 tokens at least: a document's first token is never a target, and a masked document
    # without a supervised target is refused (docs/FORMAT.md, "loss_mask")
    ids = [[(i * 7 + k) % 1000 for k in range(2 + i % 40)] for i in range(50)]
    masks = [[k % 2 == 1 or k == 0 for k in range(len(x))] for x in ids]
    ipc = pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32())), "loss_mask": masks})
    _write_ipc(tmp_path / "ids.arrow", ipc, stream=False)
    _jsonl(
        tmp_path / "ids.jsonl",
        [{"input_ids": x, "loss_mask": m} for x, m in zip(ids, masks, strict=True)],
    )
    opts = ["--pretokenized", "--mask-key", "loss_mask", "--mode", "bestfit"]
    for name in ("ids.arrow", "ids.jsonl"):
        cli_pack([str(tmp_path / name)], tmp_path / name.replace(".", "-"), *CLI_OPTS, *opts)
    names = {str(tmp_path / "ids.arrow"): str(tmp_path / "ids.jsonl")}
    assert_same_dataset(tmp_path / "ids-arrow", tmp_path / "ids-jsonl", stats=("input_bytes",),
                        names=names)  # fmt: skip


def test_bad_rows_are_named_by_row(tmp_path: Path) -> None:
    nulls = ["first", None, "third", None, "fifth"]
    pq.write_table(pa.table({"text": nulls}), tmp_path / "nulls.parquet", row_group_size=2)
    _write_ipc(tmp_path / "nulls.arrow", pa.table({"text": nulls}), stream=True)
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    pq.write_table(pa.table({"body": ["x", "y"], "id": [1, 2]}), tmp_path / "nocol.parquet")
    for name in ("nulls.parquet", "nulls.arrow"):
        path = str(tmp_path / name)
        with pytest.raises(InputError, match=f"^{path}:2: text field 'text' is NoneType, not a"):
            wdstream.pack([path], str(tmp_path / f"raise-{name}"), workers=0)
        assert "index.json" not in visible(tmp_path / f"raise-{name}")
        res = wdstream.pack([path], str(tmp_path / f"skip-{name}"), workers=0, on_error="skip")
        assert res.index.stats["records_skipped"] == 2
        assert [loc.split(": ")[0] for loc in res.index.stats["skipped_locations"]] == [
            f"{path}:2", f"{path}:4"]  # fmt: skip
        assert res.index.total_documents == 3
    ints = str(tmp_path / "ints.parquet")
    with pytest.raises(InputError, match=f"^{ints}:1: text field 'text' is int, not a string"):
        wdstream.pack([ints], str(tmp_path / "ints"), workers=0)
    nocol = str(tmp_path / "nocol.parquet")
    with pytest.raises(InputError, match=rf"^{nocol}:1: no text field 'text' \(the record has "
                       "keys 'body', 'id'\\)"):  # fmt: skip
        wdstream.pack([nocol], str(tmp_path / "nocol"), workers=0)
    good = str(tmp_path / "nulls.parquet")
    res = wdstream.pack([good, nocol], str(tmp_path / "mixed"), workers=0, on_error="skip")
    assert res.index.stats["records_skipped"] == 2 + 2  # a file without the column: every row


def test_damage_in_a_page_or_a_string_names_the_file(tmp_path: Path) -> None:
    texts = [f"row {i} " + "alpha beta " * 20 for i in range(200)]
    crc = tmp_path / "crc.parquet"
    pq.write_table(pa.table({"text": texts}), crc, compression="none", use_dictionary=False,
                   write_page_checksum=True)  # fmt: skip
    column = pq.ParquetFile(crc).metadata.row_group(0).column(0)
    raw = bytearray(crc.read_bytes())
    raw[column.data_page_offset + column.total_compressed_size // 2] ^= 1
    crc.write_bytes(bytes(raw))
    ipc = tmp_path / "bad.arrow"
    _write_ipc(ipc, pa.table({"text": ["ok", "caf\u00e9"]}), stream=False)
    data = ipc.read_bytes()
    at = data.index("café".encode()) + 3  # the first byte of é's two: no longer UTF-8
    ipc.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
    for path in (crc, ipc):
        with pytest.raises(InputError, match=f"^{path}: "):
            wdstream.pack([str(path)], str(tmp_path / f"out-{path.name}"), workers=0)


def test_cli_reads_globs_folders_and_reports_one_line(
    tmp_path: Path, inputs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    d = inputs["parquet"].parent
    cli_pack([str(d / "docs.parquet"), str(d / "docs.arrow")], tmp_path / "named", *CLI_OPTS)
    cli_pack([str(d / "docs.{parquet,arrow}")], tmp_path / "braces", *CLI_OPTS)
    assert visible(tmp_path / "braces") == visible(tmp_path / "named")
    sub = tmp_path / "tables"
    sub.mkdir()
    pq.write_table(_table(DOCS[:10]), sub / "a.parquet")
    pq.write_table(_table(DOCS[10:20]), sub / "b.parquet")
    cli_pack([str(sub / "*.parquet")], tmp_path / "glob", *CLI_OPTS)
    cli_pack([str(sub)], tmp_path / "folder", *CLI_OPTS)  # a folder's .parquet files
    assert visible(tmp_path / "folder") == visible(tmp_path / "glob")
    assert (
        wdstream.DatasetIndex.from_json(
            (tmp_path / "glob" / "index.json").read_text()
        ).total_documents
        == 20
    )

    (tmp_path / "bad.parquet").write_bytes(b"not a parquet file at all")
    res = CliRunner().invoke(
        main, ["pack", str(tmp_path / "bad.parquet"), "-o", str(tmp_path / "o")]
    )
    assert res.exit_code == 1
    assert res.output.startswith(f"Error: {tmp_path / 'bad.parquet'}: not a readable Parquet file")
    assert len(res.output.strip().splitlines()) == 1

    with pytest.raises(ValueError, match="Parquet/Arrow inputs need engine='local'"):
        wdstream.pack([str(d / "docs.parquet")], str(tmp_path / "r"), engine="ray")
    with pytest.raises(ValueError, match="records from Python .* need engine='local'"):
        wdstream.pack_records(["text"], str(tmp_path / "r"), engine="ray")
    assert not (tmp_path / "r").exists()  # refused before Ray or the output were touched

    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.ipc"):
        monkeypatch.setitem(sys.modules, name, None)  # as if pyarrow were not installed
    res = CliRunner().invoke(main, ["pack", str(d / "docs.parquet"), "-o", str(tmp_path / "p")])
    assert res.exit_code == 1
    assert res.output == (
        "Error: Parquet and Arrow inputs need pyarrow (pyarrow is missing): "
        "pip install 'wdstream[arrow]'\n"
    )
    assert not (tmp_path / "p").exists()  # refused before the output was made
