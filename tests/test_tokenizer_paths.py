"""A tokenizer given to ``pack`` by a relative path travels as the inputs do: index.json records
it as given with its sha256 and the pack's working directory, ``explain`` (chat turns,
``--text``) and ``inspect`` find it again from any folder, take ``--tokenizer`` when it moved,
and refuse one whose sha256 differs. Oracles: the same commands run from the folder the pack
ran in (the path that always worked), transformers' decoding of the stored ids, and a real
subprocess's exit status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import wdstream
from tests.chat_pack_support import conversations, write_conversations
from tests.chat_support import CHATML_GENERATION, build_chat_hf
from wdstream.cli import main

SEQ = 255
EXPLAIN = ["--step", "0", "--batch-size", "3", "--no-shuffle"]


@pytest.fixture()
def packed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the folder pack ran in, the chat dataset) packed with ``--tokenizer models/chat`` and
    ``data/in.jsonl``; the test then runs in an unrelated folder."""
    here = tmp_path / "project"
    build_chat_hf(here / "models" / "chat", CHATML_GENERATION)
    (here / "data").mkdir()
    write_conversations(here / "data" / "in.jsonl", conversations(40, seed=8))
    monkeypatch.chdir(here)
    res = CliRunner().invoke(main, ["pack", "data/in.jsonl", "-o", str(tmp_path / "ds"), "--chat",
                                    "--tokenizer", "models/chat", "--seq-len", str(SEQ),
                                    "--workers", "0", "-q"])  # fmt: skip
    assert res.exit_code == 0, res.output
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return here, tmp_path / "ds"


def _run(*args: str, ok: bool = True) -> str:
    res = CliRunner().invoke(main, list(args))
    assert (res.exit_code == 0) == ok, res.output
    return res.output


def _in(cwd: Path, *args: str) -> str:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return _run(*args)
    finally:
        os.chdir(old)


def test_index_records_the_tokenizer_as_given_with_its_hashes(packed: tuple[Path, Path]) -> None:
    here, root = packed
    index = json.loads((root / "index.json").read_text())
    tok = index["tokenizer"]
    assert tok["name"] == "models/chat"
    assert Path(index["stats"]["pack_cwd"]).samefile(here)
    folder = here / "models" / "chat"
    import hashlib

    assert (
        tok["ranks_sha256"] == hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    )
    config = (folder / "tokenizer_config.json").read_bytes()
    assert tok["config_sha256"] == hashlib.sha256(config).hexdigest()


def test_a_named_encoding_records_no_pack_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello world"}\n')
    monkeypatch.chdir(tmp_path)
    wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer="cl100k_base", workers=0)
    assert "pack_cwd" not in json.loads((tmp_path / "ds" / "index.json").read_text())["stats"]


def test_explain_and_inspect_from_another_folder(packed: tuple[Path, Path]) -> None:
    here, root = packed
    for args in (["explain", str(root), *EXPLAIN], ["explain", str(root), *EXPLAIN, "--text"],
                 ["inspect", str(root), "-n", "2"]):  # fmt: skip
        got = _run(*args)
        assert got == _in(here, *args), args  # as from the folder the pack ran in
        assert "turns unknown" not in got and "showing ids" not in got
    assert "<|im_start|>" in _run("inspect", str(root), "-n", "1")


def test_explain_is_exit_0_in_a_real_process(packed: tuple[Path, Path]) -> None:
    _, root = packed
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "wdstream.cli", "explain", str(root), *EXPLAIN],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "turns " in done.stdout


def test_a_moved_tokenizer_is_given_with_tokenizer(
    packed: tuple[Path, Path], tmp_path: Path
) -> None:
    here, root = packed
    expected = _in(here, "explain", str(root), *EXPLAIN, "--text")
    moved = tmp_path / "moved"
    shutil.move(here / "models" / "chat", moved)
    lost = _run("explain", str(root), *EXPLAIN, ok=False).strip().splitlines()
    assert len(lost) == 1 and lost[0].startswith("Error: ") and "--tokenizer" in lost[0], lost
    assert "'models/chat'" in lost[0] and str(here) in lost[0]
    assert _run("explain", str(root), *EXPLAIN, "--text", "--tokenizer", str(moved)) == expected
    assert "showing ids" in _run("inspect", str(root), "-n", "1")
    assert "showing ids" not in _run("inspect", str(root), "-n", "1", "--tokenizer", str(moved))


@pytest.mark.parametrize("change", ["tokenizer.json", "tokenizer_config.json", "another"])
def test_a_tokenizer_with_another_sha256_is_refused(
    packed: tuple[Path, Path], tmp_path: Path, change: str
) -> None:
    here, root = packed
    other = tmp_path / "other"
    if change == "another":
        build_chat_hf(other, CHATML_GENERATION.replace("\\n", " "))
        spec = json.loads((other / "tokenizer.json").read_text())
        spec["added_tokens"][0]["content"] = "<pad2>"
        (other / "tokenizer.json").write_text(json.dumps(spec))
    else:
        shutil.copytree(here / "models" / "chat", other)
        path = other / change
        path.write_text(path.read_text() + "\n")  # the same meaning, other bytes
    key = "config_sha256" if change == "tokenizer_config.json" else "ranks_sha256"
    for cmd in (["explain", str(root), *EXPLAIN], ["inspect", str(root), "-n", "1"]):
        lines = _run(*cmd, "--tokenizer", str(other), ok=False).strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), lines
        assert key in lines[0] and "recorded in index.json" in lines[0], lines
    # The folder the pack recorded, changed in place, is refused as well.
    shutil.rmtree(here / "models" / "chat")
    shutil.copytree(other, here / "models" / "chat")
    assert key in _run("explain", str(root), *EXPLAIN, ok=False)


def test_a_dataset_packed_before_keeps_working_from_its_folder(packed: tuple[Path, Path]) -> None:
    """index.json as the previous version wrote it (no pack_cwd, no config hash): explain and
    inspect from the folder it was packed in say what they said, as before."""
    here, root = packed
    args = ("explain", str(root), *EXPLAIN, "--text")
    before = _in(here, *args)
    index: dict[str, Any] = json.loads((root / "index.json").read_text())
    del index["stats"]["pack_cwd"], index["tokenizer"]["config_sha256"]
    (root / "index.json").write_text(json.dumps(index))
    where = f" ({here / 'data' / 'in.jsonl'})"  # the input's path: printed with a pack_cwd
    assert _in(here, *args) == before.replace(where, "")
    assert "showing ids" not in _in(here, "inspect", str(root), "-n", "1")
    assert "--tokenizer" in _run(*args, ok=False)  # from elsewhere: not found, as before
