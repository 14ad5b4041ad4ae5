"""What the chat tests share: templates written for the tests, an independent oracle of each
template's text and supervised spans, generated conversations, and tokenizers with the chat
special tokens built locally.

The oracles build the rendered text and the characters that must carry loss by plain string
concatenation, knowing each template's layout: they share no code with ``wdstream.chat``.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import make_corpus
from tests.tokenizer_files import build_hf_bpe, build_spm

CHAT_SPECIALS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

# ChatML, no generation tags. Tool calls are part of the assistant's turn.
CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- message['content'] -}}"
    "{%- if message.tool_calls is defined -%}"
    "{{- '<tool_call>' + message.tool_calls | tojson + '</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# The same text, with {% generation %} around each assistant turn's content and end token:
# the span wdstream's default rule supervises, so transformers' mask must equal ours. One
# definition, the bench's (its chat part times the same template against transformers).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from benchlib.chat_corpus import CHATML_GENERATION  # noqa: E402

# Llama 3 style: BOS, header tokens, trimmed content, <|eot_id|>.
LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}"
    "{{- message['content'] | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{%- endif -%}"
)

# Qwen3 style: an assistant turn's reasoning is rendered only after the last user message, so
# earlier turns are rewritten once a later user message follows (the prefix property breaks).
REASONING = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' and loop.index0 > ns.last_user"
    " and message.reasoning_content is defined -%}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

BOS = "<|begin_of_text|>"
Spans = list[tuple[int, int]]


def _tool_calls_json(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls")
    return (
        ""
        if calls is None
        else "<tool_call>" + json.dumps(calls, ensure_ascii=False) + "</tool_call>"
    )


def oracle_chatml(messages: list[dict[str, Any]]) -> tuple[str, Spans]:
    """The text of CHATML / CHATML_GENERATION and each assistant turn's supervised span."""
    text, spans = "", []
    for m in messages:
        text += f"<|im_start|>{m['role']}\n"
        if m["role"] == "assistant":
            body = m["content"] + _tool_calls_json(m) + "<|im_end|>"
            spans.append((len(text), len(text) + len(body)))
            text += body + "\n"
        else:
            text += m["content"] + "<|im_end|>\n"
    return text, spans


def oracle_llama3(messages: list[dict[str, Any]]) -> tuple[str, Spans]:
    text, spans = BOS, []
    for m in messages:
        text += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n"
        body = m["content"].strip() + "<|eot_id|>"
        if m["role"] == "assistant":
            spans.append((len(text), len(text) + len(body)))
        text += body
    return text, spans


def oracle_reasoning(messages: list[dict[str, Any]]) -> tuple[str, Spans]:
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    text, spans = "", []
    for i, m in enumerate(messages):
        text += f"<|im_start|>{m['role']}\n"
        body = ""
        if m["role"] == "assistant" and i > last_user and "reasoning_content" in m:
            body = "<think>\n" + m["reasoning_content"] + "\n</think>\n\n"
        body += m["content"] + "<|im_end|>"
        if m["role"] == "assistant":
            spans.append((len(text), len(text) + len(body)))
        text += body + "\n"
    return text, spans


TEMPLATES: dict[str, tuple[str, Callable[[list[dict[str, Any]]], tuple[str, Spans]]]] = {
    "chatml": (CHATML, oracle_chatml),
    "chatml_generation": (CHATML_GENERATION, oracle_chatml),
    "llama3": (LLAMA3, oracle_llama3),
    "reasoning": (REASONING, oracle_reasoning),
}

_CONTENTS = [
    "",
    "Hello!",
    "The answer is 42.",
    "  padded with spaces  ",
    "\n\nstarts with blank lines",
    "ends with a newline\n",
    "ünïcödé façade — “quotes” 日本語のテキスト 🙂🚀",
    "def f(x):\n    return x ** 2\n",
    "Zahl: 3,14; <b>markup</b> & {braces} {{ not jinja }}",
    "Русский текст и العربية",
    "a" * 40,
]


def random_conversation(rng: random.Random, reasoning: bool = False) -> list[dict[str, Any]]:
    """A conversation: maybe a system message, then user/assistant turns, some assistant turns
    calling a tool answered by a tool message; contents from a pool with the corners."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(_CONTENTS)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": rng.choice(_CONTENTS)})
        if rng.random() < 0.25:
            function = {"name": "lookup", "arguments": {"q": "日本"}}
            call = {"type": "function", "function": function}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": rng.choice(_CONTENTS)})
        answer: dict[str, Any] = {"role": "assistant", "content": rng.choice(_CONTENTS)}
        if reasoning and rng.random() < 0.7:
            answer["reasoning_content"] = rng.choice(_CONTENTS[1:])
        messages.append(answer)
    if rng.random() < 0.15:
        messages.append({"role": "user", "content": rng.choice(_CONTENTS)})
    return messages


def chat_texts() -> list[str]:
    """Training text for the small tokenizers: the shared corpus plus the chat contents."""
    return make_corpus(n_docs=60, stdlib_files=1) + _CONTENTS * 3


def build_chat_hf(folder: Path, template: str = CHATML) -> Path:
    """A byte-level BPE ``tokenizer.json`` with the chat special tokens, and a
    ``tokenizer_config.json`` holding ``template`` and BOS/EOS (one as an AddedToken)."""
    import tokenizers

    path = build_hf_bpe(folder, chat_texts())
    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.add_special_tokens(CHAT_SPECIALS)
    tok.save(str(path))
    config = {
        "chat_template": template,
        "bos_token": {"__type": "AddedToken", "content": BOS, "special": True},
        "eos_token": "<|im_end|>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def build_chat_spm(folder: Path) -> Path:
    """A SentencePiece model with the chat markers as user-defined symbols."""
    return build_spm(folder, chat_texts(), vocab_size=800, user_defined_symbols=CHAT_SPECIALS)
