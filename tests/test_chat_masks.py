"""ChatEncoder: ids and masks equal transformers' return_assistant_tokens_mask on a template with
{% generation %} tags, the same masks without the tags, and (Hypothesis, every test template,
two tokenizers) exactly the tokens an independent oracle of the template's layout says,
straddling tokens and rewritten turns reported; train_on, empty masks, role counts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chat_support import (
    BOS,
    CHATML,
    CHATML_GENERATION,
    TEMPLATES,
    build_chat_hf,
    build_chat_spm,
    random_conversation,
)
from wdstream.chat import ChatEncoder, ChatTemplate, load_chat_template
from wdstream.tokenizers import Tokenizer, load_tokenizer

SPECIAL = {"bos_token": BOS, "eos_token": "<|im_end|>"}


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_hf(tmp_path_factory.mktemp("hf"), CHATML_GENERATION)


@pytest.fixture(scope="module")
def tokenizers_by_name(hf_path: Path) -> dict[str, Tokenizer]:
    return {"hf": load_tokenizer(str(hf_path)), "tiktoken": load_tokenizer("cl100k_base")}


def test_ids_and_masks_equal_transformers(hf_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast  # here, not at collection (~0.7 CPU-s)

    tok = load_tokenizer(str(hf_path.parent))
    encoder = ChatEncoder(load_chat_template(tok), tok)
    ref = PreTrainedTokenizerFast(tokenizer_file=str(hf_path), **SPECIAL)
    rng = random.Random(7)
    conversations = [random_conversation(rng) for _ in range(300)]
    straddles = 0
    for messages in conversations:
        want = ref.apply_chat_template(
            messages,
            chat_template=CHATML_GENERATION,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        got = encoder.encode(messages)
        assert got.ids.tolist() == want["input_ids"]
        assert got.supervised.astype(int).tolist() == want["assistant_masks"]
        assert {p.kind for p in got.problems} <= {"straddle"}
        straddles += bool(got.problems)
    assert straddles > 0  # the straddle rule was exercised, and it is transformers' rule


def test_generation_tags_change_nothing(tokenizers_by_name: dict[str, Tokenizer]) -> None:
    tok = tokenizers_by_name["hf"]
    tagged = ChatEncoder(ChatTemplate(CHATML_GENERATION, SPECIAL), tok)
    plain = ChatEncoder(ChatTemplate(CHATML, SPECIAL), tok)
    rng = random.Random(3)
    for _ in range(50):
        messages = random_conversation(rng)
        a, b = tagged.encode(messages), plain.encode(messages)
        assert a.ids.tolist() == b.ids.tolist()
        assert a.supervised.tolist() == b.supervised.tolist()


def _token_bytes(tok: Tokenizer, ids: list[int]) -> list[bytes]:
    """Each token's bytes, from the vocabulary itself (not from encode_chat's offsets)."""
    if tok.backend in ("tiktoken", "bpe-openai"):
        return [tok._enc.decode_single_token_bytes(i) for i in ids]  # type: ignore[attr-defined]
    raw = tok._tok  # type: ignore[attr-defined]
    specials = {t.content for t in raw.get_added_tokens_decoder().values()}
    byte_of = {c: b for b, c in _byte_level_alphabet().items()}
    out = []
    for i in ids:
        piece = raw.id_to_token(i)
        out.append(piece.encode() if piece in specials else bytes(byte_of[c] for c in piece))
    return out


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte-to-character table, which byte-level BPE spells its tokens with."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _expected(
    tok: Tokenizer, text: str, ids: list[int], spans: list[tuple[int, int]]
) -> tuple[list[bool], list[bool]]:
    """(supervised, straddles) per token by the oracle's character spans, in bytes."""
    pieces = _token_bytes(tok, ids)
    assert b"".join(pieces) == text.encode()
    byte_spans = [(len(text[:s].encode()), len(text[:e].encode())) for s, e in spans]
    supervised, straddles, at = [], [], 0
    for piece in pieces:
        lo, hi = at, at + len(piece)
        inside = sum(max(0, min(hi, e) - max(lo, s)) for s, e in byte_spans)
        supervised.append(inside > 0)
        straddles.append(0 < inside < hi - lo)
        at = hi
    return supervised, straddles


_ALPHABET = "ab cdXY\n\t  .,!?'\"-0123éü日本語🙂—{}"
_content = st.text(_ALPHABET, max_size=12)


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_content)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append(
            {"role": draw(st.sampled_from(["user", "tool"])), "content": draw(_content)}
        )
        answer: dict[str, Any] = {"role": "assistant", "content": draw(_content)}
        if draw(st.booleans()):
            answer["reasoning_content"] = draw(_content)
        messages.append(answer)
    if draw(st.booleans()):
        messages.append({"role": "user", "content": draw(_content)})
    return messages


def _rewritten(name: str, messages: list[dict[str, Any]]) -> list[int]:
    """The assistant turns the reasoning template renders differently once the conversation
    goes on: turn i's render Q_i shows the reasoning of an assistant turn j <= i after the
    last user message before i, which the whole text drops (a user message follows j)."""
    if name != "reasoning":
        return []
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    out = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = max((u for u in users if u < i), default=-1)
        after = max(users, default=-1)
        shown = [
            j
            for j in range(before + 1, i + 1)
            if messages[j]["role"] == "assistant" and "reasoning_content" in messages[j]
        ]
        if any(j < after for j in shown):
            out.append(i)
    return out


@pytest.mark.parametrize("backend", ["hf", "tiktoken"])
@pytest.mark.parametrize("name", sorted(TEMPLATES))
@settings(max_examples=25)
@given(messages=conversations())
def test_supervised_tokens_are_exactly_the_assistant_turns(
    tokenizers_by_name: dict[str, Tokenizer], backend: str, name: str, messages: list[Any]
) -> None:
    source, oracle = TEMPLATES[name]
    tok = tokenizers_by_name[backend]
    got = ChatEncoder(ChatTemplate(source, SPECIAL), tok).encode(messages)
    text, spans = oracle(messages)
    assert got.text == text
    supervised, straddles = _expected(tok, text, got.ids.tolist(), spans)
    assert got.supervised.tolist() == supervised  # every assistant turn, nothing else
    kinds = [p.kind for p in got.problems]
    assert kinds.count("straddle") == sum(straddles)
    assert [p.message for p in got.problems if p.kind == "relocated"] == _rewritten(name, messages)
    assert "unlocated" not in kinds


def test_sentencepiece_supervised_runs_are_the_assistant_turns(tmp_path: Path) -> None:
    tok = load_tokenizer(str(build_chat_spm(tmp_path)))
    source, oracle = TEMPLATES["llama3"]
    encoder = ChatEncoder(ChatTemplate(source, SPECIAL), tok)
    rng = random.Random(11)
    for _ in range(40):
        messages = random_conversation(rng)
        got = encoder.encode(messages)
        text, spans = oracle(messages)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], got.supervised, [0]])))
        runs = [
            tok.decode(got.ids[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2], strict=True)
        ]
        assert len(runs) == len(spans)
        for run, (start, end) in zip(runs, spans, strict=True):
            assert " ".join(run.split()) == " ".join(text[start:end].split())


MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "And?"},
    {"role": "assistant", "content": "Bye"},
]


def _runs(tok: Tokenizer, got: Any) -> list[str]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], got.supervised, [0]])))
    return [tok.decode(got.ids[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def test_train_on_and_role_counts(tokenizers_by_name: dict[str, Tokenizer]) -> None:
    tok = tokenizers_by_name["hf"]
    template = ChatTemplate(CHATML, SPECIAL)
    every = ChatEncoder(template, tok).encode(MESSAGES)
    assert _runs(tok, every) == ["Hello<|im_end|>", "Bye<|im_end|>"]
    last = ChatEncoder(template, tok, train_on="last").encode(MESSAGES)
    assert _runs(tok, last) == ["Bye<|im_end|>"]
    everything = ChatEncoder(template, tok, train_on="all").encode(MESSAGES)
    assert everything.supervised.all() and everything.ids.tolist() == every.ids.tolist()
    assert every.role_tokens == everything.role_tokens == everything.role_supervised
    assert sum(every.role_tokens.values()) == every.n_tokens
    assert every.role_supervised == {"system": 0, "user": 0, "assistant": every.n_supervised}
    # Regions: a message's tokens, the assistant's header counted with the message before it.
    index = every.message_index
    assert (np.diff(index) >= 0).all()
    first_user = tok.decode(every.ids[index == 1].tolist())
    assert first_user == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="train_on must be one of"):
        ChatEncoder(template, tok, train_on="assistants")


def test_a_conversation_with_nothing_to_train_on_says_so(
    tokenizers_by_name: dict[str, Tokenizer],
) -> None:
    encoder = ChatEncoder(ChatTemplate(CHATML, SPECIAL), tokenizers_by_name["hf"])
    got = encoder.encode(MESSAGES[:2])
    assert not got.has_supervised and got.n_supervised == 0 and got.n_tokens > 0
    assert encoder.encode(MESSAGES[:3]).has_supervised


def test_rewritten_turns_are_relocated_and_reported(
    tokenizers_by_name: dict[str, Tokenizer],
) -> None:
    tok = tokenizers_by_name["hf"]
    source, _ = TEMPLATES["reasoning"]
    messages = [dict(m) for m in MESSAGES]
    messages[2]["reasoning_content"] = "think once"
    messages[4]["reasoning_content"] = "think twice"
    got = ChatEncoder(ChatTemplate(source, SPECIAL), tok).encode(messages)
    assert "think once" not in got.text  # the template dropped the earlier reasoning
    assert _runs(tok, got) == ["Hello<|im_end|>", "<think>\nthink twice\n</think>\n\nBye<|im_end|>"]
    assert [(p.message, p.kind) for p in got.problems] == [(2, "relocated")]
    assert "supervised the 15 of the turn's 44 characters" in got.problems[0].detail


def test_a_turn_after_a_rewritten_one_is_found_after_the_rewrite(
    tokenizers_by_name: dict[str, Tokenizer],
) -> None:
    """An agent loop: the reasoning of turn 1 is dropped once the user speaks again, so the
    conversation before turn 3 is rewritten too; turn 3 is found after the rewritten text."""
    tok = tokenizers_by_name["hf"]
    source, _ = TEMPLATES["reasoning"]
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Calling.", "reasoning_content": "need a tool"},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "Welcome"},
    ]
    got = ChatEncoder(ChatTemplate(source, SPECIAL), tok).encode(messages)
    assert _runs(tok, got) == ["Calling.<|im_end|>", "Sunny.<|im_end|>", "Welcome<|im_end|>"]
    assert [(p.message, p.kind) for p in got.problems] == [(1, "relocated"), (3, "relocated")]
    assert tok.decode(got.ids[got.message_index == 2].tolist()) == (
        "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_count_written_first_relocates_every_turn(
    tokenizers_by_name: dict[str, Tokenizer],
) -> None:
    """The message count written first: no render of a prefix is a prefix of the whole text,
    yet each turn has one place after the rewritten count (issue 34: it was unlocated)."""
    tok = tokenizers_by_name["hf"]
    source = "{{ messages | length }}" + CHATML
    got = ChatEncoder(ChatTemplate(source, SPECIAL), tok).encode(MESSAGES)
    assert _runs(tok, got) == ["Hello<|im_end|>", "Bye<|im_end|>"]
    assert [(p.message, p.kind) for p in got.problems] == [(2, "relocated")]  # 4 ends T
    assert got.unsupervised_turns == []


# ChatML writing every assistant turn but the last in capitals: the earlier turn's text is
# not what the turn rendered alone ends with, so it cannot be located.
LOUD = CHATML.replace(
    "{{- message['content'] -}}",
    "{{- message['content'] if loop.last else message['content'] | upper -}}",
)


def test_a_turn_that_cannot_be_found_is_not_supervised_and_reported(
    tokenizers_by_name: dict[str, Tokenizer],
) -> None:
    tok = tokenizers_by_name["hf"]
    got = ChatEncoder(ChatTemplate(LOUD, SPECIAL), tok).encode(MESSAGES)
    assert "HELLO" in got.text
    assert _runs(tok, got) == ["Bye<|im_end|>"]
    assert [(p.message, p.kind) for p in got.problems] == [(2, "unlocated")]
    assert got.trained_turns == [2, 4] and got.unsupervised_turns == [2]
    # Its tokens still count as the assistant's (issue 34), not the next user message's.
    assert "HELLO" in tok.decode(got.ids[got.message_index == 2].tolist())
    assert "HELLO" not in tok.decode(got.ids[got.message_index == 3].tolist())
    assert got.role_tokens["assistant"] > got.role_supervised["assistant"]


def test_hf_tokenizer_object_unchanged_for_documents(hf_path: Path) -> None:
    """encode_chat uses its own copy: the document encoder still treats specials as text."""
    tok = load_tokenizer(str(hf_path))
    ChatEncoder(ChatTemplate(CHATML, SPECIAL), tok).encode(MESSAGES)
    ref = tokenizers.Tokenizer.from_file(str(hf_path))
    ref.encode_special_tokens = True
    assert (
        tok.encode("<|im_end|>").tolist() == ref.encode("<|im_end|>", add_special_tokens=False).ids
    )
