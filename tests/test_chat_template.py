"""Chat templates: rendered text equal to transformers' own renderer (same environment, filters,
globals, message preparation), the sandbox kept, and every template source with its errors."""

from __future__ import annotations

import json
import random
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.chat_support import BOS, TEMPLATES, build_chat_hf, random_conversation
from wdstream.chat import ChatTemplate, load_chat_template
from wdstream.errors import ChatTemplateError, ConversationError
from wdstream.tokenizers import load_tokenizer

if TYPE_CHECKING:  # imported by the fixture, not at collection (~0.7 CPU-s on every worker)
    from transformers import PreTrainedTokenizerFast

# Exercises what the environment provides: namespace, loop controls, dict(), tojson with its
# options (non-ASCII kept), whitespace control under trim_blocks/lstrip_blocks, tools, and
# the message preparation (null keys dropped, reasoning aliased) through tojson of a message.
FEATURES = """{%- set ns = namespace(n=0) -%}
{% for m in messages %}
  {% if m.role == 'system' %}{% continue %}{% endif %}
  {% set ns.n = ns.n + 1 %}
  {{ ns.n }}: {{ m | tojson }} | {{ m | tojson(indent=2, sort_keys=True) }}
  {{ dict(a=1, b=[1, 2]) | tojson(separators=(',', ':')) }} {{ dict.fromkeys(['k']) | tojson }}
  {% if m.content == 'STOP' %}{% break %}{% endif %}
{% endfor %}
{% if tools %}{{ tools | tojson }}{% endif %}
{{- bos_token + eos_token if add_generation_prompt else '' -}}"""

SPECIAL = {"bos_token": BOS, "eos_token": "<|im_end|>"}


@pytest.fixture(scope="module")
def transformers_tok(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerFast:
    """transformers' own tokenizer class, whose apply_chat_template is the reference."""
    from transformers import PreTrainedTokenizerFast

    path = build_chat_hf(tmp_path_factory.mktemp("hf"))
    return PreTrainedTokenizerFast(tokenizer_file=str(path), **SPECIAL)


def _conversations(n: int, seed: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    out = [random_conversation(rng, reasoning=True) for _ in range(n)]
    out.append(
        [{"role": "user", "content": "x", "name": None}, {"role": "user", "content": "STOP"}]
    )
    out.append([{"role": "assistant", "content": "a", "reasoning": "why", "thinking": None}])
    out.append([{"role": "assistant", "content": "b", "thinking": "hm"}])
    return out


@pytest.mark.parametrize("name", [*TEMPLATES, "features"])
def test_text_equals_transformers(name: str, transformers_tok: PreTrainedTokenizerFast) -> None:
    source = FEATURES if name == "features" else TEMPLATES[name][0]
    template = ChatTemplate(source, SPECIAL)
    tools = [{"type": "function", "function": {"name": "lookup", "description": "日本"}}]
    for i, messages in enumerate(_conversations(40, seed=len(name))):
        for prompt in (False, True):
            extra = {"tools": tools} if i % 3 == 0 else {}
            want = transformers_tok.apply_chat_template(
                messages,
                chat_template=source,
                add_generation_prompt=prompt,
                tokenize=False,
                **extra,
            )
            assert template.render(messages, prompt, **extra) == want


def test_the_template_refusing_a_conversation_is_a_conversation_error() -> None:
    template = ChatTemplate(
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first, please') }}"
        "{% endif %}{{ messages[0].content }}"
    )
    assert template.render([{"role": "system", "content": "ok"}]) == "ok"
    with pytest.raises(ConversationError, match="system first, please"):
        template.render([{"role": "user", "content": "x"}])
    with pytest.raises(ConversationError, match="UndefinedError"):
        ChatTemplate("{{ messages[0].content + 1 }}").render([{"role": "user"}])


@pytest.mark.parametrize(
    ("source", "raised"),
    [
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
        ("{% for i in range(10**9) %}{% endfor %}", "OverflowError"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
        ("{{ 'x' * 2**25 }}", "passes 16,777,216 characters"),
        ("{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}",
         "the template takes more than"),  # its steps (or, on a crawling host, seconds)
        ("{% for i in range(1000) %}{% for j in range(200) %}" + "x" * 100
         + "{% endfor %}{% endfor %}", "passes 16,777,216 characters"),
    ],
)  # fmt: skip
def test_whatever_a_template_raises_is_its_refusal(source: str, raised: str) -> None:
    with pytest.raises(ConversationError, match=raised):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ messages.append(1) }}",  # the environment is immutable
        "{% set ns = namespace(_x=1) %}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}{{ ns._x }}",
    ],
)
def test_the_sandbox_holds(source: str) -> None:
    with pytest.raises(ConversationError, match="SecurityError"):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_strftime_now_writes_the_pinned_time() -> None:
    template = ChatTemplate("{{ strftime_now('%d %b %Y') }}", now=datetime(2024, 7, 23))
    assert template.render([{"role": "user", "content": "x"}]) == "23 Jul 2024"


def _write(path: Path, data: Any) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


def test_template_sources(tmp_path: Path) -> None:
    jinja = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"
    msgs = [{"role": "user", "content": "x"}]
    raw = ChatTemplate.from_file(_write(tmp_path / "t.jinja", jinja))
    assert raw.render(msgs) == "x" and raw.special_tokens == {}
    config = {"chat_template": jinja, "bos_token": {"content": "<B>", "special": True}}
    assert ChatTemplate.from_file(_write(tmp_path / "c.json", config)).render(msgs) == "<B>x"
    named = {
        "chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D"},
        ],
        "eos_token": "</s>",
    }
    assert ChatTemplate.from_file(_write(tmp_path / "n.json", named)).render(msgs) == "D"
    assert ChatTemplate.from_file(str(tmp_path / "n.json"), name="tool_use").render(msgs) == "T"
    folder = tmp_path / "tok"
    folder.mkdir()
    _write(folder / "tokenizer_config.json", {**config, "eos_token": "<E>"})
    assert ChatTemplate.from_folder(str(folder)).render(msgs) == "<B>x<E>"
    _write(folder / "chat_template.jinja", "J{{ eos_token }}")  # transformers' newer layout wins
    assert ChatTemplate.from_folder(str(folder)).render(msgs) == "J<E>"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.json", "{not json", "bad.json: not valid JSON"),
        ("list.json", "[1]", "expected a JSON object, got list"),
        ("none.json", {"bos_token": "<s>"}, "has no 'chat_template' key"),
        ("type.json", {"chat_template": 3}, "chat_template: expected a string or a list"),
        (
            "nodefault.json",
            {"chat_template": [{"name": "a", "template": "x"}]},
            "no template named",
        ),
        ("syntax.jinja", "ok\n{% for m in messages %}", "syntax.jinja: line 2: the chat template"),
    ],
)
def test_a_bad_template_file_names_the_file(
    tmp_path: Path, name: str, content: Any, message: str
) -> None:
    with pytest.raises(ChatTemplateError, match=message.replace("[", r"\[")):
        ChatTemplate.from_file(_write(tmp_path / name, content))


def test_template_of_a_tokenizer(tmp_path: Path) -> None:
    chatml, _ = TEMPLATES["chatml"]
    hf = load_tokenizer(str(build_chat_hf(tmp_path / "hf", chatml).parent))
    from_folder = load_chat_template(hf)
    assert from_folder.source == chatml
    assert from_folder.special_tokens == {"bos_token": BOS, "eos_token": "<|im_end|>"}
    file = _write(tmp_path / "t.jinja", "{{ eos_token }}")
    assert load_chat_template(hf, file).special_tokens == from_folder.special_tokens
    tiktoken = load_tokenizer("cl100k_base", "tiktoken")
    with pytest.raises(ChatTemplateError, match="give one with --chat-template FILE"):
        load_chat_template(tiktoken)
    assert load_chat_template(tiktoken, file).render([]) == "<|endoftext|>"  # its own EOS
    (tmp_path / "hf" / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        load_chat_template(hf)
