"""Regressions found by attacking rule 2 and the lost-turn audit (``tools/faultlib/reasoning.py``):
each packs real files with ``wdstream pack --chat`` in a child process, reads the shards with
tarfile + msgpack and checks them against ``transformers``' ``apply_chat_template`` (text and
ids) and marker words decoded with ``tokenizers``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tokenizers

from tests.chat_reasoning_support import QWEN3
from tests.chat_support import CHATML, build_chat_hf
from tests.test_chat_reasoning import _pack, _runs, _stored

Conv = list[dict[str, Any]]
_HEAD = "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' -}}"
_GEN = "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
# The last message ends without the newline that separates messages: the generation prompt
# (``...<|im_end|><|im_start|>assistant\n``) and the turn (``...<|im_end|>\n<|im_start|>...``)
# part before the assistant header.
LAST_UNSEPARATED = (
    _HEAD + "{{- m.content -}}{{- '<|im_end|>' if loop.last else '<|im_end|>\\n' -}}"
    "{%- endfor -%}" + _GEN
)
# An earlier answer rendered as nothing once later messages follow (not only its reasoning).
ANSWER_DROPPED = (
    _HEAD + "{%- if m.role == 'assistant' and not loop.last -%}{%- else -%}{{- m.content -}}"
    "{%- endif -%}{{- '<|im_end|>\\n' -}}{%- endfor -%}" + _GEN
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_hf(tmp_path_factory.mktemp("tok") / "chatml", CHATML).parent


def _reference(folder: Path, template: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                   eos_token="<|im_end|>", chat_template=template)  # fmt: skip


def _supervised_runs(folder: Path, root: Path) -> list[list[str]]:
    raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [_runs(lambda r: raw.decode(r, skip_special_tokens=False), ids, mask)
            for ids, mask in _stored(root)]  # fmt: skip


def test_turn_after_an_unseparated_last_message_is_not_supervised_from_its_header(
    tmp_path: Path, folder: Path
) -> None:
    """Before the fix the two answers were supervised with the ``\\n<|im_start|>assistant\\n``
    before them (the turn's start taken where the generation prompt and the turn part, before
    the header); now each answer and its ``<|im_end|>`` only, and the ids are transformers'."""
    convs: list[Conv] = [
        [{"role": "user", "content": "USERMARK0 why"}, {"role": "assistant", "content": "ANSWERMARK0 so"},
         {"role": "assistant", "content": "ANSWERMARK1 more"}, {"role": "user", "content": "USERMARK1 ok"}],
        [{"role": "user", "content": "USERMARK2 why"}, {"role": "assistant", "content": "ANSWERMARK2 so"},
         {"role": "tool", "content": "TOOLMARK0 42"}],
    ]  # fmt: skip
    got = _pack(tmp_path, convs, LAST_UNSEPARATED, str(folder))
    assert got.returncode == 0, got.stderr
    ref = _reference(folder, LAST_UNSEPARATED)
    eos = ref.convert_tokens_to_ids("<|im_end|>")
    for messages, (ids, _) in zip(convs, _stored(tmp_path / "out"), strict=True):
        want = list(ref.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        assert want[-1] == eos and ids == want  # the template's own EOS, not doubled
    answers = [[m["content"] + "<|im_end|>" for m in c if m["role"] == "assistant"] for c in convs]
    assert _supervised_runs(folder, tmp_path / "out") == answers


def test_answer_the_template_drops_is_a_lost_turn(tmp_path: Path, folder: Path) -> None:
    """Before the fix an earlier answer the template renders as nothing was supervised on its
    ``<|im_end|>`` alone and not counted (the pack committed); now it is lost: the pack fails
    naming it, and with --allow-unlocated commits with it counted and unsupervised."""
    convs: list[Conv] = [
        [{"role": "user", "content": "USERMARK0 why"}, {"role": "assistant", "content": "ANSWERMARK0 so"},
         {"role": "user", "content": "USERMARK1 and"}, {"role": "assistant", "content": "ANSWERMARK1 yes"}],
    ]  # fmt: skip
    got = _pack(tmp_path, convs, ANSWER_DROPPED, str(folder))
    assert got.returncode == 1
    assert got.stderr.startswith(
        f"Error: 1 of 2 assistant turns got no loss (first: {tmp_path / 'in.jsonl'}:1: message 1)"
    )
    got = _pack(tmp_path, convs, ANSWER_DROPPED, str(folder), "--allow-unlocated")
    assert got.returncode == 0, got.stderr
    assert _supervised_runs(folder, tmp_path / "out") == [["ANSWERMARK1 yes<|im_end|>"]]
    stats = json.loads((tmp_path / "out" / "index.json").read_text())["stats"]["chat"]
    assert stats["assistant_turns"]["count"] == 2 and stats["assistant_turns"]["unsupervised"] == 1


def test_reasoning_only_turn_keeps_its_end_of_turn(tmp_path: Path, folder: Path) -> None:
    """What the fix must not take: an earlier Qwen3 turn of reasoning and no answer (inline or
    apart) renders as its end of turn alone, which stays supervised (the empty answer ends)."""
    convs: list[Conv] = [
        [{"role": "user", "content": "USERMARK0 why"}, {"role": "assistant", "content": "<think>R0</think>"},
         {"role": "user", "content": "USERMARK1 and"}, {"role": "assistant", "content": "ANSWERMARK1 yes"}],
        [{"role": "user", "content": "USERMARK2 why"},
         {"role": "assistant", "content": "", "reasoning_content": "R1"},
         {"role": "user", "content": "USERMARK3 and"}, {"role": "assistant", "content": "ANSWERMARK3 yes"}],
    ]  # fmt: skip
    got = _pack(tmp_path, convs, QWEN3, str(folder))
    assert got.returncode == 0, got.stderr
    runs = _supervised_runs(folder, tmp_path / "out")
    assert [r[0] for r in runs] == ["<|im_end|>", "<|im_end|>"]
    assert all(r[1].endswith("yes<|im_end|>") for r in runs)
