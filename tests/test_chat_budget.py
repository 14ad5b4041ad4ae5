"""Chat templates that would hang or fill memory (issue 33, items 10 and 12): each one is
refused by ``wdstream pack --chat`` in a child process, naming the record's file:line and the
template, within the test's time limit and with a small peak memory (the child's
``ru_maxrss`` as ``wait4`` reports it; the child is forked from :mod:`tests.cli_server`'s
server, which imported the CLI's modules: ~8 MB below a fresh process's peak); with
``--on-error skip`` the conversations it refuses are counted and the others packed.

The bounds are counts (steps, characters), not a clock: which conversations are refused does
not depend on the machine, and no test here measures speed (the limit only tells a hang).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chat_support import CHATML
from tests.cli_server import run_cli_peak
from wdstream.chat import ChatEncoder, ChatTemplate
from wdstream.errors import ConversationError
from wdstream.tokenizers import load_tokenizer

BOMBS = {
    "'x' * 10**9": "{{ 'x' * 10**9 }}",
    "range(100000) twice, silent": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "{% endfor %}{% endfor %}",
    "range(100000) twice, writing": "{% for i in range(100000) %}{% for j in range(100000) %}"
    "x{% endfor %}{% endfor %}",
    "range(100000) twice, filtered": "{% for i in range(100000) %}"
    "{% for j in range(100000) if j < 0 %}{% endfor %}{% endfor %}",
    "recursive loop": "{% for x in range(100000) recursive %}{% if loop.depth < 3 %}"
    "{{ loop(range(100000)) }}{% endif %}{% endfor %}",
    "macro called twice per level": "{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}"
    "{% endif %}{% endmacro %}{{ f(0) }}",
    "'x'|center(10**9)": "{{ 'x' | center(10**9) }}",
    "'x'.ljust(10**9)": "{{ 'x'.ljust(10**9) }}",
    "namespace doubled with ~": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "namespace doubled with +": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
    "a list of new strings kept": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
    "{% set ns.l = ns.l + ['x' * 100000] %}{% endfor %}",
    "a block body of 10**8 characters": "{% set s %}{% for i in range(100000) %}"
    "{{ 'y' * 1000 }}{% endfor %}{% endset %}",
    "join of a repeated string": "{{ (['x' * 10**6] * 1000) | join }}",
    "lipsum(10**6)": "{{ lipsum(10**6) }}",
    "'%999999999d' % 1": "{{ '%999999999d' % 1 }}",
    "'{:>999999999}'.format(1)": "{{ '{:>999999999}'.format(1) }}",
    "replace('', ...)": "{{ ('x' * 10000).replace('', 'x' * 10000) }}",
    "(1).to_bytes(10**9)": "{{ (1).to_bytes(10**9, 'big') }}",
    "2 ** 10**8": "{{ 2 ** 100000000 }}",
    "split of 16 M characters": "{{ ('a ' * 8000000).split() | length }}",
    "indent by 10**6 per line": "{{ ('a\\n' * 1000) | indent(1000000) }}",
    "a sort of 100,000 items per loop item": "{% set l = range(100000) | list %}"
    "{% for i in range(100000) %}{% set x = l | sort %}{% endfor %}",
    "'in' over 16 M characters per loop item": "{% set s = 'x' * 16000000 %}"
    "{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}",
    "a slice of 16 M characters per loop item": "{% set s = 'x' * 16000000 %}"
    "{% for i in range(100000) %}{% set y = s[1:] %}{% endfor %}",
}
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
RSS_LIMIT_MB = 1024  # a refused bomb's child: ~105 MB (a fresh process ~113); 'x' * 10**9: 5 GB


def _pack(tmp: Path, template: str, lines: list[str], *extra: str) -> dict:
    """``wdstream pack --chat`` in a child, its exit code, stderr and peak RSS (MB, as
    ``wait4`` reports it: the child is forked from :mod:`tests.cli_server`'s server)."""
    tmp.mkdir(parents=True, exist_ok=True)
    src, tpl = tmp / "in.jsonl", tmp / "bomb.jinja"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tpl.write_text(template, encoding="utf-8")
    args = ["pack", str(src), "-o", str(tmp / "out"), "--chat", "--tokenizer", "cl100k_base",
            "--chat-template", str(tpl), "--mode", "docs", "--workers", "0", "-q", *extra]  # fmt: skip
    rc, stderr, peak_mb = run_cli_peak(*args, timeout=240)
    return {"rc": rc, "stderr": stderr, "peak_mb": peak_mb, "src": src, "tpl": tpl}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_bomb_is_refused_naming_the_record_and_the_template(tmp_path: Path, name: str) -> None:
    got = _pack(tmp_path, BOMBS[name] + CHATML, [json.dumps({"messages": MESSAGES})])
    assert got["rc"] != 0 and "Traceback" not in got["stderr"], got["stderr"]
    assert got["stderr"].startswith(f"Error: {got['src']}:1: ")
    assert str(got["tpl"]) in got["stderr"] and "refuses the conversation" in got["stderr"]
    assert got["peak_mb"] < RSS_LIMIT_MB, got


def test_skip_counts_the_conversations_a_bomb_goes_off_on(tmp_path: Path) -> None:
    """The bomb goes off only on a conversation starting with 'boom': that one is counted,
    the others packed."""
    bomb = ("{% if messages[0].content == 'boom' %}{% for i in range(100000) %}"
            "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}")  # fmt: skip
    boom = [{"role": "user", "content": "boom"}, MESSAGES[1]]
    lines = [json.dumps({"messages": m}) for m in (MESSAGES, boom, MESSAGES, boom, MESSAGES)]
    got = _pack(tmp_path, bomb + CHATML, lines, "--on-error", "skip")
    assert got["rc"] == 0, got["stderr"]
    stats = json.loads((tmp_path / "out" / "index.json").read_text())["stats"]
    refused = stats["chat"]["template_refused"]
    assert refused["count"] == 2 and f"{got['src']}:2: " in refused["examples"][0]
    # an example is cut to a fixed length, and the paths before the reason vary by host
    assert "RenderBudgetError" in refused["examples"][0]
    assert stats["documents"] == 3


def test_long_honest_conversations_stay_within_the_budget() -> None:
    """A 600-message conversation (300 answers, ~1,000 renders) through a template looping
    over every message twice per render is encoded whole (1.2 M steps of its 1 M and 20,000
    a render)."""
    source = (
        "{%- set ns = namespace(last=-1) -%}{%- for m in messages -%}"
        "{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}"
        "{%- endfor -%}" + CHATML
    )
    messages = [
        {"role": "user" if k % 2 == 0 else "assistant", "content": f"message {k} " * 20}
        for k in range(600)
    ]
    enc = ChatEncoder(ChatTemplate(source), load_tokenizer("cl100k_base")).encode(messages)
    assert enc.n_supervised > 0 and {p.kind for p in enc.problems} <= {"straddle"}


def test_each_render_outside_a_conversation_has_its_own_budget() -> None:
    """ChatTemplate.render alone: a render near the bound does not eat the next one's."""
    template = ChatTemplate(
        "{% for i in range(100000) %}{% endfor %}" * 9 + "{{ messages | length }}"
    )
    for _ in range(3):
        assert template.render(MESSAGES) == "2"
    with pytest.raises(ConversationError, match="the template takes more than"):
        ChatTemplate("{% for i in range(100000) %}{% endfor %}" * 11).render(MESSAGES)
