"""Reasoning chat templates written from the public models' (Qwen3, DeepSeek-R1, and one that
keeps only the last turn's reasoning), conversations with a marker word in every message and
reasoning inline in ``content`` or given apart, and the layout of each template: where an
assistant turn starts and ends in the rendered text (the oracle of ``test_chat_reasoning``).
"""

from __future__ import annotations

import random
from typing import Any

# Qwen3's published template, less tools: reasoning (``reasoning_content``, or inline
# ``<think>...</think>`` in ``content``, split off) rendered only for the turns after the
# last user query; the last message always gets a (maybe empty) think block.
QWEN3 = (
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) -%}"
    "{%- for message in messages[::-1] -%}"
    "{%- set index = (messages|length - 1) - loop.index0 -%}"
    "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string"
    " and not (message.content.startswith('<tool_response>')"
    " and message.content.endswith('</tool_response>')) -%}"
    "{%- set ns.multi_step_tool = false -%}{%- set ns.last_query_index = index -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message.content is string -%}{%- set content = message.content -%}"
    "{%- else -%}{%- set content = '' -%}{%- endif -%}"
    "{%- if message.role == 'user' or message.role == 'system' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- set reasoning_content = '' -%}"
    "{%- if message.reasoning_content is string -%}"
    "{%- set reasoning_content = message.reasoning_content -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n')"
    " + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}"
    "{%- else -%}{{- '<|im_start|>assistant\\n' + content -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# DeepSeek-R1's: every assistant turn's inline reasoning cut off (``content.split('</think>')
# [-1]``), the generation prompt opening a think block the rendered turns never hold, the
# conversation ended by the EOS itself.
R1_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
DEEPSEEK_R1 = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}{{- message.content -}}"
    "{%- elif message.role == 'user' -%}{{- '<｜User｜>' + message.content -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- set content = message.content -%}"
    "{%- if '</think>' in content -%}{%- set content = content.split('</think>')[-1] -%}"
    "{%- endif -%}"
    "{{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' -}}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<｜Assistant｜><think>\\n' -}}{%- endif -%}"
)

# Reasoning (either form) kept only in the conversation's last message, dropped from every
# earlier assistant turn.
LAST_REASONING = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- set content = message.content -%}"
    "{%- if message.role == 'assistant' -%}"
    "{%- set reasoning = message.reasoning_content if message.reasoning_content is string"
    " else '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip() -%}"
    "{%- set content = content.split('</think>')[-1].strip() -%}"
    "{%- endif -%}"
    "{%- if loop.last and reasoning -%}{{- '<think>' + reasoning + '</think>' -}}{%- endif -%}"
    "{%- endif -%}"
    "{{- content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# name: (template, assistant header, end of turn, whether tool messages render)
LAYOUTS: dict[str, tuple[str, str, str, bool]] = {
    "qwen3": (QWEN3, "<|im_start|>assistant\n", "<|im_end|>", True),
    "deepseek_r1": (DEEPSEEK_R1, "<｜Assistant｜>", "<｜end▁of▁sentence｜>", False),
    "last_reasoning": (LAST_REASONING, "<|im_start|>assistant\n", "<|im_end|>", True),
}


def marked_conversation(rng: random.Random, c: int, tools: bool) -> list[dict[str, Any]]:
    """A conversation whose every message holds a marker word of its own (``USERMARKc x r``,
    ``ANSWERMARKcxr``, ``REASONMARKcxr``...); each answer's reasoning inline in ``content``
    (``<think>...</think>``), apart (``reasoning_content``) or absent; an answer may be
    empty; with ``tools``, tool results after some answers (an agent loop)."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": f"SYSMARK{c} be brief"})
    for r in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": f"USERMARK{c}x{r} why so"})
        for step in range(2 if tools and rng.random() < 0.3 else 1):
            tag = f"{c}x{r}y{step}"
            answer = "" if rng.random() < 0.1 else f"ANSWERMARK{tag} because\nof it."
            form = rng.choice(["inline", "apart", "none"])
            message: dict[str, Any] = {"role": "assistant", "content": answer}
            if form == "inline":
                message["content"] = f"<think>\nREASONMARK{tag} let me see\n</think>\n\n{answer}"
            elif form == "apart":
                message["reasoning_content"] = f"REASONMARK{tag} let me see"
            messages.append(message)
            if step == 0 and tools and rng.random() < 0.5:
                messages.append({"role": "tool", "content": f"TOOLMARK{tag} 42"})
    return messages


def turn_texts(text: str, header: str, end: str) -> list[str]:
    """Each assistant turn's text in ``text`` by the template's layout: after the turn's
    header, through its end-of-turn marker."""
    out, at = [], text.find(header)
    while at >= 0:
        start = at + len(header)
        stop = text.index(end, start) + len(end)
        out.append(text[start:stop])
        at = text.find(header, stop)
    return out
