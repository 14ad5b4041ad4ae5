"""``explain`` names the turns a row piece holds, also under a template that writes a message
where its end cannot be found: here the system prompt inside the first user turn (as Gemma's
and Mistral's templates do), which gives the system message no tokens of its own.

Oracles outside the code: the records themselves (a best-fit piece of a whole conversation
holds every message of it), and, for a conversation cut by ``long_docs="truncate"``, the text
``transformers``' ``apply_chat_template`` renders, cut after the piece's tokens
(``transformers``' own ids and decode) and read by the template's layout: each message but the
system one starts with ``<|im_start|>``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import wdstream
from tests.chat_pack_support import conversations, write_conversations
from tests.chat_support import build_chat_hf

# The system prompt written inside the first user turn.
MERGED_SYSTEM = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- for message in rest -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if loop.first and system -%}{{- '[system: ' + system + ']\\n' -}}{%- endif -%}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _convs(n: int, seed: int) -> list[list[dict[str, Any]]]:
    """Conversations of plain messages (no tool calls), most opening with a system prompt
    followed by a user message."""
    out = []
    for c in conversations(n, seed=seed):
        plain = [{"role": m["role"], "content": m["content"]} for m in c if m["role"] != "tool"]
        plain = [m for m in plain if m["role"] != "assistant" or m["content"]]
        if plain and plain[0]["role"] == "system" and len(plain) > 2:
            out.append(plain)
        elif plain and plain[0]["role"] == "user":
            out.append([{"role": "system", "content": "Be brief."}, *plain])
    return out


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_hf(tmp_path_factory.mktemp("tok"), MERGED_SYSTEM).parent


def _pieces(root: Path, rows: int) -> list[Any]:
    out = []
    for step in range(rows):
        exp = wdstream.explain(str(root), step, batch_size=1, shuffle=False)
        out += [p for r in exp.rows for p in r.pieces]
    return out


def _starts(text: str, messages: list[dict[str, Any]]) -> list[int]:
    """Where each message starts in the rendered ``text``, by the template's layout: message
    k > 0 at the k-th ``<|im_start|>``, an assistant turn after its header (the header is
    what the model is prompted with, and counts with the message before); the system prompt
    (message 0) inside the first user turn, so 0."""
    starts, at = [0], 0
    for m in messages[1:]:
        at = text.index("<|im_start|>", at)
        header = f"<|im_start|>{m['role']}\n"
        starts.append(at + len(header) if m["role"] == "assistant" else at)
        at += len(header)
    return starts


def test_whole_conversations_name_every_turn(hf: Path, tmp_path: Path) -> None:
    convs = _convs(60, seed=21)
    src = write_conversations(tmp_path / "in.jsonl", convs)
    wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer=str(hf), chat=True, seq_len=511,
                  workers=0, progress=False)  # fmt: skip
    index = json.loads((tmp_path / "ds" / "index.json").read_text())
    pieces = _pieces(tmp_path / "ds", sum(s["samples"] for s in index["shards"]))
    assert len(pieces) == index["stats"]["documents"] > 20
    for p in pieces:
        messages = convs[p.line - 1]
        assert p.doc_start == 0  # best-fit: whole conversations
        t = p.turns
        assert (t.first, t.last, t.approximate) == (0, len(messages) - 1, False), (p, messages)
        assert list(t.roles) == [m["role"] for m in messages]
        assert t.describe().startswith(f"turns 0-{len(messages) - 1} (system, user")


def test_cut_conversations_cover_the_turns_they_hold(hf: Path, tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    convs = _convs(60, seed=22)
    src = write_conversations(tmp_path / "in.jsonl", convs)
    seq = 40
    wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer=str(hf), chat=True, seq_len=seq,
                  long_docs="truncate", allow_unsupervised=True, workers=0,
                  progress=False)  # fmt: skip
    ref = PreTrainedTokenizerFast(tokenizer_file=str(hf / "tokenizer.json"))
    ref.chat_template = MERGED_SYSTEM
    index = json.loads((tmp_path / "ds" / "index.json").read_text())
    cut = exact_cut = approx = 0
    for p in _pieces(tmp_path / "ds", sum(s["samples"] for s in index["shards"])):
        messages = convs[p.line - 1]
        t = p.turns
        ids = ref.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        held = p.doc_end - p.doc_start - t.pack_tokens
        if held >= len(ids):
            assert (t.first, t.last, t.approximate) == (0, len(messages) - 1, False)
            continue
        cut += 1
        text = ref.apply_chat_template(messages, tokenize=False)
        assert isinstance(text, str)
        shown = ref.decode(ids[:held], clean_up_tokenization_spaces=False)
        whole = shown.rstrip("\ufffd")  # a cut inside a character holds part of it
        assert text.startswith(whole)
        reach = len(whole) + (whole != shown)
        last = max(k for k, start in enumerate(_starts(text, messages)) if start < reach)
        assert t.first == 0 and t.first <= last <= t.last, (shown, t)
        if t.approximate:
            approx += 1
        else:
            exact_cut += 1
            assert t.last == last, (shown, t)
    assert cut > 10 and exact_cut > 0 and approx > 0  # seen: 58 cut, 20 exact, 38 approximate
