"""Reasoning templates and what a pack does with a turn it cannot supervise (issue 34, items
1, 2 and 5): every test packs real files with ``wdstream pack --chat`` in a child process and
reads the shards back with tarfile + msgpack.

Oracles, none of them wdstream's: ``transformers``' ``apply_chat_template`` for the rendered
text and the ids; each template's layout (an assistant turn is what follows its header through
its end-of-turn marker) for the text the template renders for a turn in the conversation; the
turn rendered alone by ``transformers`` (the conversation through it), which must end with that
text; marker words planted in every message and looked for in the supervised tokens, decoded
with ``tokenizers``.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import tokenizers

from tests.chat_reasoning_support import (
    LAYOUTS,
    R1_SPECIALS,
    marked_conversation,
    turn_texts,
)
from tests.chat_support import CHATML, build_chat_hf, chat_texts
from tests.tokenizer_files import build_hf_bpe

Conv = list[dict[str, Any]]
MARKERS = ("SYSMARK", "USERMARK", "TOOLMARK", "REASONMARK", "ANSWERMARK")


def _pack(tmp: Path, convs: list[Conv], template: str, tokenizer: str, *extra: str,
          out: str = "out") -> subprocess.CompletedProcess[str]:  # fmt: skip
    tmp.mkdir(parents=True, exist_ok=True)
    src, tpl = tmp / "in.jsonl", tmp / "template.jinja"
    src.write_text("".join(json.dumps({"messages": m}) + "\n" for m in convs), encoding="utf-8")
    tpl.write_text(template, encoding="utf-8")
    args = [sys.executable, "-m", "wdstream.cli", "pack", str(src), "-o", str(tmp / out),
            "--chat", "--tokenizer", tokenizer, "--chat-template", str(tpl), "--mode", "docs",
            "--workers", "0", "-q", *extra]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=600)


def _stored(root: Path) -> list[tuple[list[int], list[int]]]:
    """Every sample as (ids, mask: 1 = carries loss), bit 31 set meaning no loss
    (docs/FORMAT.md), read with tarfile + msgpack; nothing dropped."""
    out = []
    for shard in json.loads((root / "index.json").read_text())["shards"]:
        with tarfile.open(root / shard["name"]) as tar:
            for member in tar.getmembers():
                f = tar.extractfile(member)
                if f is None or not member.name.endswith((".mp", ".msgpack")):
                    continue
                raw = np.frombuffer(msgpack.unpackb(f.read())["tokens"], dtype="<u4")
                out.append(([int(x) & 0x7FFFFFFF for x in raw], [int(not x >> 31) for x in raw]))
    return out


def _runs(decode: Any, ids: list[int], mask: list[int]) -> list[str]:
    """The supervised runs of a sample, each decoded."""
    runs, run = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            run.append(i)
        elif run:
            runs.append(run)
            run = []
    return [decode(r) for r in [*runs, *([run] if run else [])]]


def _r1_tokenizer(folder: Path, template: str) -> Path:
    """A byte-level BPE with DeepSeek-R1's special tokens, its EOS the template's end of turn."""
    path = build_hf_bpe(folder, chat_texts())
    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.add_special_tokens(R1_SPECIALS)
    tok.save(str(path))
    config = {"chat_template": template, "bos_token": R1_SPECIALS[0], "eos_token": R1_SPECIALS[1]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tok")
    return {
        "chatml": build_chat_hf(base / "chatml", CHATML).parent,
        "r1": _r1_tokenizer(base / "r1", LAYOUTS["deepseek_r1"][0]).parent,
    }


def _reference(folder: Path, template: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    config = json.loads((folder / "tokenizer_config.json").read_text())
    bos, eos = config["bos_token"], config["eos_token"]
    return PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        bos_token=bos["content"] if isinstance(bos, dict) else bos,
        eos_token=eos,
        chat_template=template,
    )


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_reasoning_templates_supervise_every_turn_as_rendered(
    tmp_path: Path, folders: dict[str, Path], name: str
) -> None:
    """60 conversations with reasoning inline, apart or absent: every assistant turn is
    supervised on exactly the text the template renders for it in the conversation (the
    answer and end of turn; reasoning only where the template keeps it), which ends the turn
    rendered alone; no other message's marker is supervised; no turn is unlocated; the ids
    are transformers'."""
    template, header, end, tools = LAYOUTS[name]
    folder = folders["r1" if name == "deepseek_r1" else "chatml"]
    rng = random.Random(34)
    convs = [marked_conversation(rng, c, tools) for c in range(60)]
    got = _pack(tmp_path, convs, template, str(folder))
    assert got.returncode == 0, got.stderr
    ref = _reference(folder, template)
    raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    eos = raw.token_to_id(ref.eos_token)
    stored = _stored(tmp_path / "out")
    assert len(stored) == len(convs)
    inline_cut = 0
    for messages, (ids, mask) in zip(convs, stored, strict=True):
        text = ref.apply_chat_template(messages, tokenize=False)
        want = list(ref.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        assert ids == (want if want[-1] == eos else [*want, eos])  # one EOS at the end
        turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        shown = turn_texts(text, header, end)
        assert len(shown) == len(turns)
        for k, seg in zip(turns, shown, strict=True):
            alone = turn_texts(ref.apply_chat_template(messages[: k + 1], tokenize=False),
                               header, end)[-1]  # fmt: skip
            assert alone.endswith(seg), (alone, seg)  # the turn as rendered, less reasoning
            inline_cut += "<think>" in messages[k]["content"] and "REASONMARK" not in seg
        runs = _runs(lambda r: raw.decode(r, skip_special_tokens=False), ids, mask)
        assert runs == shown
        joined = "".join(runs)
        for marker in ("SYSMARK", "USERMARK", "TOOLMARK"):
            assert marker not in joined
    assert inline_cut > 20  # turns whose inline reasoning the conversation drops: exercised
    chat = json.loads((tmp_path / "out" / "index.json").read_text())["stats"]["chat"]
    assert chat["problems"]["unlocated"]["count"] == 0
    assert chat["assistant_turns"]["unsupervised"] == 0
    assert chat["assistant_turns"]["count"] == sum(len(turn_texts(
        ref.apply_chat_template(m, tokenize=False), header, end)) for m in convs)  # fmt: skip
    assert all(chat["roles"][r]["supervised"] == 0 for r in ("system", "user", "tool"))
