"""Regressions found by ``tools/faultlib/travel.py`` (template variables, tokenizer paths).

Oracles: transformers' ``apply_chat_template`` with the same kwargs, the uninterrupted pack
(byte for byte), a real subprocess's exit status and stderr within a time limit, and the
same ``explain`` over the untouched ``index.json``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import wdstream
from tests.chat_pack_support import conversations, write_conversations
from tests.chat_support import BOS, CHATML_GENERATION, build_chat_hf
from tests.cli_server import run_cli
from tests.test_pack_resume import _interrupted_writer
from wdstream.cli import main
from wdstream.errors import WdstreamError
from wdstream.storage.local import LocalStore

# ChatML with generation tags, after a head writing two template variables.
TEMPLATE = ("{%- if flag is defined and flag is false %}[off]{% elif flag is defined %}"
            "[{{ flag }}]{% endif -%}"
            "{%- if opts is defined %}{% for k in opts %}{{ k }};{% endfor %}{% endif -%}"
            + CHATML_GENERATION)  # fmt: skip
FIRST: dict[str, Any] = {"flag": False, "opts": {"a": 1, "b": 2}}
EXPLAIN = ["--step", "0", "--batch-size", "2", "--no-shuffle", "--seq-len", "255"]


def _cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``wdstream ARGS`` in a real process, forked from :mod:`tests.cli_server`'s server (a
    hang fails the test at ``timeout``: the child is killed, ``TimeoutExpired`` raised)."""
    return run_cli(*args, cwd=cwd, timeout=timeout)


def _one_error(text: str, *says: str) -> None:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert all(s in lines[0] for s in says), (says, lines[0])


def test_transformers_renders_false_0_and_reordered_objects_differently(tmp_path: Path) -> None:
    """Why a resume must tell them apart: the oracle renders each its own way."""
    from transformers import PreTrainedTokenizerFast

    folder = build_chat_hf(tmp_path / "tok", TEMPLATE).parent
    ref = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), bos_token=BOS,
                                  eos_token="<|im_end|>")  # fmt: skip
    messages = conversations(1, seed=1)[0]
    texts = {ref.apply_chat_template(messages, chat_template=TEMPLATE, tokenize=False, **kw)
             for kw in (FIRST, {**FIRST, "flag": 0}, {**FIRST, "flag": 0.0},
                        {**FIRST, "opts": {"b": 2, "a": 1}})}  # fmt: skip
    assert len(texts) == 4


@pytest.mark.parametrize(
    ("other", "accepted"),
    [({"opts": {"a": 1, "b": 2}, "flag": False}, True), ({"flag": 0, "opts": {"a": 1, "b": 2}}, False),
     ({"flag": 0.0, "opts": {"a": 1, "b": 2}}, False), ({"flag": False, "opts": {"b": 2, "a": 1}}, False),
     ({"flag": False, "opts": {"a": 1.0, "b": 2}}, False)],
)  # fmt: skip
def test_resume_tells_kwargs_apart_as_json_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: dict[str, Any], accepted: bool
) -> None:
    """Python's == took false for 0 and ignored a nested object's order, so a resume mixed
    two renders; only the order of the names themselves (no template sees it) is free."""
    folder = build_chat_hf(tmp_path / "tok", TEMPLATE).parent
    src = write_conversations(tmp_path / "in.jsonl", conversations(60, seed=7))
    kw: dict[str, Any] = dict(tokenizer=str(folder), chat=True, seq_len=511, workers=0,
                              shard_size="8KB")  # fmt: skip
    ref, out = tmp_path / "ref", tmp_path / "out"
    wdstream.pack([str(src)], str(ref), chat_template_kwargs=other, **kw)
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer("data-000002.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(src)], str(out), chat_template_kwargs=FIRST, **kw)
    if not accepted:
        with pytest.raises(WdstreamError, match=r"differs in: chat\)"):
            wdstream.pack([str(src)], str(out), chat_template_kwargs=other, **kw)
        return
    assert wdstream.pack([str(src)], str(out), chat_template_kwargs=other, **kw).resumed_shards
    names = sorted(p.name for p in ref.iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    for name in names:
        assert (ref / name).read_bytes() == (out / name).read_bytes(), name


@pytest.mark.parametrize(
    ("text", "says"),
    [('{"a": ' + "[" * 30_000 + "]" * 30_000 + "}", "not JSON"),
     ('{"greeting": "a\\ud800b"}', "not JSON-representable")],
)  # fmt: skip
def test_kwargs_too_deep_or_not_utf8_are_one_error_line(
    tmp_path: Path, text: str, says: str
) -> None:
    """Both were tracebacks: a RecursionError from json, a TypeError from the tokenizer."""
    folder = build_chat_hf(tmp_path / "tok", TEMPLATE).parent
    src = write_conversations(tmp_path / "in.jsonl", conversations(3, seed=1))
    res = CliRunner().invoke(main, ["pack", str(src), "-o", str(tmp_path / "o"), "--chat",
                                    "--tokenizer", str(folder), "--workers", "0", "-q",
                                    "--chat-template-kwargs", text])  # fmt: skip
    assert res.exit_code == 1
    _one_error(res.output, "--chat-template-kwargs", says)
    deep: Any = []
    for _ in range(30_000):
        deep = [deep]
    with pytest.raises(ValueError, match="^chat_template_kwargs: not JSON-representable"):
        wdstream.pack([str(src)], str(tmp_path / "o2"), tokenizer=str(folder), chat=True,
                      workers=0, chat_template_kwargs={"deep": deep})  # fmt: skip


@pytest.fixture()
def packed(tmp_path: Path) -> tuple[Path, Path]:
    """(the folder pack ran in, a chat dataset packed there with ``--tokenizer tok``)."""
    here = tmp_path / "proj"
    build_chat_hf(here / "tok", TEMPLATE)
    write_conversations(here / "in.jsonl", conversations(12, seed=5))
    done = _cli(["pack", "in.jsonl", "-o", str(tmp_path / "ds"), "--chat", "--tokenizer", "tok",
                 "--seq-len", "255", "--workers", "0", "-q", "--chat-template-kwargs",
                 json.dumps(FIRST)], here)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return here, tmp_path / "ds"


def test_special_files_as_tokenizers_are_refused_not_waited_on(packed: tuple[Path, Path]) -> None:
    """A FIFO (.json, .tiktoken, .model) or /dev/zero given as the tokenizer: one Error line
    naming it (each was a hang: the read waited for a writer, or never ended)."""
    here, root = packed
    for name in ("x.json", "x.tiktoken", "x.model"):
        os.mkfifo(here / name)
    for given in (str(here / "x.json"), str(here / "x.tiktoken"), str(here / "x.model"),
                  "/dev/zero"):  # fmt: skip
        done = _cli(["explain", str(root), *EXPLAIN, "--tokenizer", given], here, timeout=60)
        assert done.returncode == 1
        _one_error(done.stderr, given, "not a regular file")
    done = _cli(["pack", "in.jsonl", "-o", "out2", "--chat", "--tokenizer", "x.json"], here, 60)
    assert done.returncode == 1
    _one_error(done.stderr, "x.json", "not a regular file")


@pytest.mark.parametrize("value", [True, 5, {"a": 1}, "g" * 64])
def test_a_malformed_config_sha256_is_one_error_line(packed: tuple[Path, Path], value: Any) -> None:
    """``tokenizer.config_sha256`` went unchecked by index.json's rules: True was a
    TypeError traceback in explain and inspect."""
    here, root = packed
    index = json.loads((root / "index.json").read_text())
    index["tokenizer"]["config_sha256"] = value
    (root / "index.json").write_text(json.dumps(index))
    for cmd in (["explain", str(root), *EXPLAIN], ["inspect", str(root), "-n", "1"]):
        done = _cli(cmd, here)
        assert done.returncode == 1
        _one_error(done.stderr, "tokenizer.config_sha256")


def test_explain_does_not_trust_edited_template_kwargs(packed: tuple[Path, Path]) -> None:
    """stats.chat.template_kwargs edited: explain re-rendered with them and printed other
    turns (exit 0). The record encoded again must reproduce the piece's stored ids."""
    here, root = packed
    clean = _cli(["explain", str(root), *EXPLAIN], here)
    assert clean.returncode == 0 and " turns 0-" in clean.stdout, clean.stderr
    backup = (root / "index.json").read_text()
    for edited in ({**FIRST, "flag": True}, {"flag": False, "opts": {"b": 2, "a": 1}}):
        index = json.loads(backup)
        index["stats"]["chat"]["template_kwargs"] = edited
        (root / "index.json").write_text(json.dumps(index))
        done = _cli(["explain", str(root), *EXPLAIN], here)
        assert done.returncode == 0, done.stderr
        pieces = [line for line in done.stdout.splitlines() if line.startswith("  row [")]
        assert pieces and all("other tokens than the piece holds" in p for p in pieces), pieces
    (root / "index.json").write_text(backup)
    assert _cli(["explain", str(root), *EXPLAIN], here).stdout == clean.stdout
    shutil.rmtree(here / "tok")  # and without its tokenizer, still one line saying so
    _one_error(_cli(["explain", str(root), *EXPLAIN], here).stderr, "--tokenizer")


def test_a_mixture_checks_each_chat_source_s_turns(packed: tuple[Path, Path]) -> None:
    """The same check in a mixture's explain: the untouched source's pieces keep their
    turns, the source whose template_kwargs were edited says its turns are unknown."""
    here, root = packed
    shutil.copytree(root, root.parent / "edited")
    index = json.loads((root.parent / "edited" / "index.json").read_text())
    index["stats"]["chat"]["template_kwargs"] = {**FIRST, "flag": True}
    (root.parent / "edited" / "index.json").write_text(json.dumps(index))
    spec = root.parent / "mix.json"
    spec.write_text(json.dumps({"sources": {"a": str(root), "b": str(root.parent / "edited")},
                                "weights": {"a": 0.5, "b": 0.5}}))  # fmt: skip
    done = _cli(["explain", str(spec), "--steps", "0:4", "--batch-size", "2", "--seq-len", "255"],
                here)  # fmt: skip
    assert done.returncode == 0, done.stderr
    source = ""
    seen = set()
    for line in done.stdout.splitlines():
        if line.startswith("row "):  # row 0: rank 0 row 0  a epoch 0 row 0
            source = re.match(r"row \d+: rank \d+ row \d+\s+(\S+) epoch", line)[1]  # type: ignore[index]
        elif line.startswith("  row ["):
            seen.add(source)
            assert ("other tokens than the piece holds" in line) == (source == "b"), line
            assert bool(re.search(r" turns? \d", line)) == (source == "a"), line
    assert seen == {"a", "b"}
