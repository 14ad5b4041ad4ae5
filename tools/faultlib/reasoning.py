"""Chat packs through templates that rewrite earlier turns (issue 34 items 1, 2 and 5): rule 2
of ``wdstream/chat/spans.py``, the lost-turn audit and the pack's EOS after a template's own.

Oracles, none of them wdstream's code:

- **transformers**: ``apply_chat_template`` of each conversation with the same template and a
  ChatML byte-level BPE tokenizer (EOS ``<|im_end|>``): the stored conversation (bit 31 cleared,
  less the pack's EOS) decodes to the text it renders, and, where no message spells a special
  token, holds its ids; the pack's EOS is there exactly when those ids do not end with it;
- **markers**: every message holds a word naming its role and place (``USERMARK3x1``,
  ``ANSWERMARK3x1``, ``REASONMARK3x1``); the shards are read with tarfile + msgpack and every
  supervised run decoded with ``tokenizers``: no run holds a system, user or tool marker, nor
  the markers of two turns; an answer marker no run holds is a lost turn, and a pack with one
  must fail naming ``file:line`` (then, with ``--allow-unlocated``, resume byte-identical to a
  fresh pack and count at least as many lost turns as the markers show).
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from faultlib.chat import chat_tokenizer
from faultlib.common import Attempt, index_stats, labelled

ROOT = Path(__file__).resolve().parents[2]
Conv = list[dict[str, Any]]
EOS = "<|im_end|>"
FOREIGN = re.compile(r"(?:SYS|USER|TOOL)MARK\d+x\d+")
OWN = re.compile(r"(?:ANSWER|REASON)MARK(\d+x\d+b?)")
ANSWER = re.compile(r"ANSWERMARK\d+x\d+b?")
FIRST = re.compile(r"USERMARK(\d+)x0 ")
LOST = re.compile(
    r"^Error: [\d,]+ of [\d,]+ assistant turns got no loss \(first: \S+:\d+: message \d+\)"
)
TAGGED = re.compile(r"{%-?\s*generation\s*-?%}")

_HEAD = "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' -}}"
_GEN = "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
_LATER = "(loop.index0 < messages|length - 1)"
_PREV = "messages[loop.index0 - 1].content"


def _chatml(answer: str, other: str = "m.content", end: str = "'<|im_end|>\\n'") -> str:
    """ChatML whose assistant turns render ``answer`` (a Jinja expression over ``m``)."""
    return (_HEAD + "{%- if m.role == 'assistant' -%}{{- " + answer + " -}}{%- else -%}{{- "
            + other + " -}}{%- endif -%}{{- " + end + " -}}{%- endfor -%}" + _GEN)  # fmt: skip


def _tagged(answer: str, before: str = "''") -> str:
    """ChatML whose assistant turns render ``before`` then ``{% generation %}`` around
    ``answer`` and the end of turn (Jinja expressions over ``m``)."""
    return (_HEAD + "{%- if m.role == 'assistant' -%}{{- " + before + " -}}{%- generation -%}{{- "
            + answer + " + '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}{%- else -%}"
            "{{- m.content + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}" + _GEN)  # fmt: skip


def hostile_templates() -> dict[str, str]:
    """Templates that render an earlier turn otherwise once later messages follow, and the
    reasoning templates of ``tests/chat_reasoning_support.py``."""
    sys.path.insert(0, str(ROOT))
    from tests import chat_reasoning_support as reasoning

    cut = "m.content.split('</think>')[-1]"
    return {
        "Qwen3 (reasoning after the last query)": reasoning.QWEN3,
        "last reasoning only": reasoning.LAST_REASONING,
        "reasoning dropped, user recapped": _chatml(
            f"({_PREV} + ' ' if {_LATER} and loop.index0 > 0 else '') + ({cut} if {_LATER} else m.content)"),
        "previous user echoed before the answer": _chatml(
            f"({_PREV} + ' ' if {_LATER} and loop.index0 > 0 else '') + m.content"),
        "previous message in place of the answer": _chatml(
            f"({_PREV} if {_LATER} and loop.index0 > 0 else m.content)"),
        "next user inside the answer": _chatml(
            f"m.content + (' > ' + messages[loop.index0 + 1].content if {_LATER} else '')"),
        "next user before the answer": _chatml(
            f"(messages[loop.index0 + 1].content + ' ' if {_LATER} else '') + m.content"),
        "system footer in earlier answers": _chatml(
            f"m.content + (' [' + messages[0].content + ']' if {_LATER} else '')"),
        "previous user's tail after the answer": _chatml(
            f"m.content + ({_PREV}[-6:] if {_LATER} and loop.index0 > 0 else '')"),
        "answer into the next user turn": _HEAD + "{%- if m.role == 'user' and loop.index0 > 0 -%}"
        "{{- messages[loop.index0 - 1].content + ' / ' -}}{%- endif -%}"
        "{{- m.content + '<|im_end|>\\n' -}}{%- endfor -%}" + _GEN,
        "answer twice when later": _chatml(f"m.content + (' ' + m.content if {_LATER} else '')"),
        "upper-cased when later": _chatml(f"(m.content | upper if {_LATER} else m.content)"),
        "lower-cased when later": _chatml(f"(m.content | lower if {_LATER} else m.content)"),
        "reversed when later": _chatml(f"(m.content | reverse if {_LATER} else m.content)"),
        "stripped when later": _chatml(f"(m.content | trim if {_LATER} else m.content)"),
        "answer dropped when later": _chatml(f"('' if {_LATER} else m.content)"),
        "answer replaced by a constant when later": _chatml(f"('[omitted]' if {_LATER} else m.content)"),
        "turn index": _chatml("loop.index0 | string + ': ' + m.content"),
        "message count": _chatml("(messages | length) | string + ': ' + m.content"),
        "turns so far counted": _chatml("m.content + ' #' + (loop.index | string)"),
        "generation tags, reasoning dropped when later": _tagged(f"({cut} if {_LATER} else m.content)"),
        "generation tags, user recapped outside": _tagged(
            "m.content", f"({_PREV} + ' ' if {_LATER} and loop.index0 > 0 else '')"),
        "generation tags, user recapped inside": _tagged(
            f"({_PREV} + ' ' if {_LATER} and loop.index0 > 0 else '') + m.content"),
    }  # fmt: skip


VARIANTS = ("plain", "apart", "inline", "both", "unclosed", "nested", "several", "empty",
            "equal", "substring", "markup")  # fmt: skip


def marked(rng: random.Random, c: int, variant: str) -> Conv:
    """A conversation with a marker in every message; ``variant`` shapes its answers (odd
    ``<think>`` markup, reasoning apart and inline at once, empty, equal across turns, a
    substring of the user's message, the template's own markup)."""
    system = rng.random() < 0.4
    messages: Conv = [{"role": "system", "content": f"SYSMARK{c}x0 be brief"}] if system else []
    for r in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": f"USERMARK{c}x{r} why so"})
        tag, reason = f"{c}x{r}", f"REASONMARK{c}x{r} hm"
        answer = {"empty": "", "equal": "same answer", "substring": "why so",
                  "markup": "<|im_end|>\n"}.get(variant, f"ANSWERMARK{tag} because")  # fmt: skip
        content = {
            "inline": f"<think>\n{reason}\n</think>\n\n{answer}",
            "both": f"<think>{reason}</think>{answer}",
            "unclosed": f"<think>{reason} {answer}",
            "nested": f"<think><think>{reason}</think></think>{answer}",
            "several": f"<think>{reason}</think>{answer}</think>ANSWERMARK{tag} tail",
        }.get(variant, answer)
        message = {"role": "assistant", "content": content}
        if variant in ("apart", "both"):
            message["reasoning_content"] = reason
        messages.append(message)
        if rng.random() < 0.3:  # consecutive assistant turns
            messages.append({"role": "assistant", "content": f"ANSWERMARK{tag}b more"})
        if rng.random() < 0.3:
            messages.append({"role": "tool", "content": f"TOOLMARK{c}x{r} 42"})
    return messages


def _pack(work: Path, tag: str, convs: list[Conv], template: str, *extra: str,
          out: str = "out") -> tuple[subprocess.CompletedProcess[str] | None, Path, Path]:  # fmt: skip
    """``wdstream pack --chat`` of ``convs`` (None: it ran past 240 s)."""
    folder = work / "reasoning" / tag
    folder.mkdir(parents=True, exist_ok=True)
    src, tpl = folder / "in.jsonl", folder / "template.jinja"
    for path, text in ((src, "".join(json.dumps({"messages": m}) + "\n" for m in convs)),
                       (tpl, template)):  # fmt: skip
        if not path.exists() or path.read_text(encoding="utf-8") != text:  # a rerun resumes
            path.write_text(text, encoding="utf-8")
    args = [sys.executable, "-m", "wdstream.cli", "pack", str(src), "-o", str(folder / out),
            "--chat", "--tokenizer", str(chat_tokenizer(work)), "--chat-template", str(tpl),
            "--workers", "0", "-q", *(("--mode", "docs") if "--mode" not in extra else ()), *extra]  # fmt: skip
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=240,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, src, folder / out
    return proc, src, folder / out


def stored_docs(root: Path) -> list[list[int]]:
    """Every stored document (bit 31 kept) read with tarfile + msgpack: a sample's tokens cut
    by its ``doc_lens`` (a best-fit row's last entry is its padding, docs/FORMAT.md)."""
    import msgpack
    import numpy as np

    index = json.loads((root / "index.json").read_text())
    docs = []
    for shard in index["shards"]:
        with tarfile.open(root / shard["name"]) as tar:
            for member in tar.getmembers():
                f = tar.extractfile(member)
                if f is None or not member.name.endswith((".mp", ".msgpack")):
                    continue
                sample = msgpack.unpackb(f.read())
                raw = np.frombuffer(sample["tokens"], dtype="<u4").tolist()
                lens = sample.get("doc_lens") or [len(raw)]
                lens = lens[:-1] if index.get("mode") == "bestfit" else lens
                at = 0
                for n in lens:
                    docs.append(raw[at : at + n])
                    at += n
    return docs


class Oracle:
    """transformers' renders and ids of conversations through one template."""

    def __init__(self, work: Path, template: str) -> None:
        import tokenizers
        from transformers import PreTrainedTokenizerFast

        folder = chat_tokenizer(work)
        self.ref: Any = PreTrainedTokenizerFast(
            tokenizer_file=str(folder / "tokenizer.json"), eos_token=EOS
        )
        self.raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.eos = int(self.raw.token_to_id(EOS) or 0)
        self.template = template

    def render(self, messages: Conv) -> tuple[str, list[int]]:
        """The text and ids transformers makes of ``messages``."""
        text: str = self.ref.apply_chat_template(
            messages, chat_template=self.template, tokenize=False
        )
        ids = self.ref.apply_chat_template(messages, chat_template=self.template, tokenize=True,
                                           return_dict=True)["input_ids"]  # fmt: skip
        return text, list(ids)

    @property
    def tagged(self) -> bool:
        """Whether the template has ``{% generation %}`` blocks (transformers' masks)."""
        return TAGGED.search(self.template) is not None

    def assistant_mask(self, messages: Conv) -> list[bool]:
        """transformers' ``return_assistant_tokens_mask`` of ``messages``."""
        got = self.ref.apply_chat_template(messages, chat_template=self.template, tokenize=True,
                                           return_dict=True, return_assistant_tokens_mask=True)  # fmt: skip
        return [bool(x) for x in got["assistant_masks"]]

    def decode(self, ids: list[int]) -> str:
        """``ids`` as text, special tokens spelled out."""
        return str(self.raw.decode(ids, skip_special_tokens=False))


def _runs(ids: list[int], mask: list[bool]) -> list[list[int]]:
    runs: list[list[int]] = [[]]
    for i, m in zip(ids, mask, strict=True):
        if m:
            runs[-1].append(i)
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def wrong_pack(oracle: Oracle, out: Path, convs: list[Conv], eos: bool = True) -> str | None:
    """What the oracles find wrong with a committed pack of ``convs`` (None: nothing): every
    conversation stored as transformers renders it (plus the pack's EOS unless the render ends
    with it), no foreign or second turn's marker supervised, lost answers counted."""
    docs = stored_docs(out)
    if len(docs) != len(convs):
        return f"{len(docs)} documents stored of {len(convs)} conversations"
    lost = 0
    for c, (doc, messages) in enumerate(zip(docs, convs, strict=True)):
        ids = [x & 0x7FFFFFFF for x in doc]
        mask = [not x >> 31 for x in doc]
        text, want = oracle.render(messages)
        end = [oracle.eos] if eos and want and want[-1] != oracle.eos else []
        if oracle.decode(ids) != text + EOS * len(end):
            return f"conversation {c}: stored text is not transformers' render (+ EOS {bool(end)})"
        spelled = EOS in json.dumps(messages)
        if not spelled and ids != want + end:
            return f"conversation {c}: stored ids are not transformers' (+ EOS {bool(end)})"
        if oracle.tagged and not spelled and mask[: len(want)] != oracle.assistant_mask(messages):
            return f"conversation {c}: the loss mask is not transformers' assistant mask"
        runs = [oracle.decode(r) for r in _runs(ids, mask)]
        if oracle.tagged:  # what the template's generation blocks hold is the oracle's
            continue
        for run in runs:
            if FOREIGN.search(run) or len(set(OWN.findall(run))) > 1:
                return f"conversation {c}: supervised {run!r}"
        answers = {a for m in messages if m["role"] == "assistant"
                   for a in ANSWER.findall(m.get("content") or "")}  # fmt: skip
        lost += sum(not any(a in run for run in runs) for a in answers)
    chat = index_stats(out)["chat"]
    others = {
        r: v["supervised"] for r, v in chat["roles"].items() if r != "assistant" and v["supervised"]
    }
    if others and not oracle.tagged:
        return f"stats count supervised tokens of {others}"
    counted = chat["assistant_turns"]["unsupervised"]
    return None if counted >= lost else f"{lost} answers unsupervised, {counted} turns counted lost"


def _identical(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir() if p.name != "index.json")
    return names == sorted(p.name for p in b.iterdir() if p.name != "index.json") and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def packed_or_refused(work: Path, tag: str, template: str, convs: list[Conv], *extra: str) -> str:
    """Pack ``convs``: committed and right by :func:`wrong_pack` (handled), or refused in one
    line naming ``file:line``: a lost turn (then ``--allow-unlocated`` resumes it to shards
    byte-identical to a fresh pack, right by the oracles) or a refused conversation (then
    ``--on-error skip`` packs the rest, which must be right)."""
    oracle = Oracle(work, template)
    proc, src, out = _pack(work, tag, convs, template, *extra)
    if proc is None:
        return "hang"
    said = (proc.stderr + proc.stdout).strip()
    if "Traceback" in said or (proc.returncode and not said.startswith(f"Error: {src}:")
                               and not LOST.match(said)):  # fmt: skip
        return f"crash: {said[-240:]}"
    if proc.returncode == 0:
        wrong = wrong_pack(oracle, out, convs)
        return f"silent wrong: {wrong}" if wrong else "handled"
    if LOST.match(said):
        again, _, _ = _pack(work, tag, convs, template, "--allow-unlocated", *extra)
        fresh, _, clean = _pack(
            work, tag, convs, template, "--allow-unlocated", *extra, out="fresh"
        )
        if again is None or fresh is None:
            return "hang"
        if again.returncode or fresh.returncode:
            return f"crash: --allow-unlocated failed: {(again.stderr + fresh.stderr)[-200:]}"
        if not _identical(out, clean):
            return "silent wrong: the resumed pack's shards differ from a fresh pack's"
        wrong = wrong_pack(oracle, out, convs)
        return f"silent wrong: {wrong}" if wrong else "clear error"
    skipped, _, rest = _pack(work, tag, convs, template, "--on-error", "skip",
                             "--allow-unlocated", *extra, out="skip")  # fmt: skip
    if skipped is None:
        return "hang"
    if skipped.returncode:  # every conversation refused: nothing to pack is the clear error
        nothing = skipped.stderr.startswith(f"Error: no non-empty documents in {src}")
        return (
            "clear error" if nothing else f"crash: --on-error skip failed: {skipped.stderr[-200:]}"
        )
    stats = index_stats(rest)
    refused = stats["chat"]["template_refused"]["count"] + stats.get("records_skipped", 0)
    refused += stats.get("unsupervised_documents_refused", 0)
    found = [FIRST.search(oracle.decode([x & 0x7FFFFFFF for x in d])) for d in stored_docs(rest)]
    kept = [convs[int(f.group(1))] for f in found if f]
    if len(kept) != len(found) or len(kept) + refused != len(convs):
        return f"silent wrong: skip: {len(found)} stored, {refused} refused of {len(convs)}"
    wrong = wrong_pack(oracle, rest, kept)
    return f"silent wrong: skip: {wrong}" if wrong else "clear error"


def rewritten_turns(work: Path, scale: float) -> Iterator[Attempt]:
    """Each hostile template over conversations of each variant (every variant for the first
    templates, a seeded choice of a few for the rest at scale < 1)."""
    rng = random.Random(34)
    n = max(3, int(6 * scale))
    for t, (label, template) in enumerate(hostile_templates().items()):
        variants = VARIANTS if scale >= 1 or t < 2 else rng.sample(VARIANTS, 3)
        for variant in variants:
            convs = [marked(rng, c, variant) for c in range(n)]

            def attempt(t: int = t, label: str = label, template: str = template,
                        variant: str = variant, convs: list[Conv] = convs) -> str:  # fmt: skip
                got = packed_or_refused(work, f"rewrite-{t}-{variant}", template, convs)
                return labelled(f"{label} / {variant}", got)

            yield attempt


# A template's end of conversation: (what follows the last message, the last message's role)
ENDS = {
    "EOS alone": ("'<|im_end|>'", "assistant"),
    "EOS and a newline": ("'<|im_end|>\\n'", "assistant"),
    "EOS and spaces": ("'<|im_end|>  '", "assistant"),
    "EOS twice": ("'<|im_end|><|im_end|>'", "assistant"),
    "EOS alone, ending in a user message": ("'<|im_end|>'", "user"),
    "EOS alone, ending in a tool result": ("'<|im_end|>'", "tool"),
}


def template_eos(work: Path, scale: float) -> Iterator[Attempt]:
    """ChatML whose last message ends with the tokenizer's EOS (alone, twice, before
    whitespace), conversations ending with an answer, a user or a tool message; docs and
    best-fit, with and without ``--no-eos``: the pack's EOS comes only where the render does
    not already end with it (transformers' ids), never doubled."""
    rng = random.Random(35)
    modes = [("docs",), ("bestfit", "--seq-len", "2048")]
    for e, (label, (end, last)) in enumerate(ENDS.items()):
        template = _chatml("m.content", end=f"({end} if loop.last else '<|im_end|>\\n')")
        convs = [marked(rng, c, "plain") for c in range(max(3, int(5 * scale)))]
        if last != "assistant":
            convs = [[*m, {"role": last, "content": f"{last.upper()}MARK{c}x9 end"}]
                     for c, m in enumerate(convs)]  # fmt: skip
        for mode in modes:
            for eos in (True, False)[: 1 if mode[0] == "bestfit" else 2]:  # best-fit needs EOS

                def attempt(e: int = e, label: str = label, template: str = template,
                            convs: list[Conv] = convs, mode: tuple[str, ...] = mode,
                            eos: bool = eos) -> str:  # fmt: skip
                    extra = ["--mode", *mode, *([] if eos else ["--no-eos"])]
                    tag = f"eos-{e}-{mode[0]}-{int(eos)}"
                    oracle = Oracle(work, template)
                    proc, src, out = _pack(work, tag, convs, template, "--allow-unlocated", *extra)
                    said = proc.stderr.strip() if proc else ""
                    if proc is None:
                        return "hang"
                    if "Traceback" in said or (
                        proc.returncode and not said.startswith(f"Error: {src}:")
                    ):
                        return labelled(label, f"crash: {said[-200:]}")
                    if proc.returncode:  # a conversation no token of which carries loss
                        return "clear error"
                    wrong = wrong_pack(oracle, out, convs, eos=eos)
                    return labelled(f"{label} / {' '.join(extra)}",
                                    f"silent wrong: {wrong}" if wrong else "handled")  # fmt: skip

                yield attempt


def long_conversations(work: Path, scale: float) -> Iterator[Attempt]:
    """One conversation of 50 and one of 120 rounds (reasoning inline in every answer)
    through Qwen3's template and one that drops every earlier answer: every turn is
    rewritten, so each takes its own renders of the whole conversation (honest work grows as
    rounds**2); the pack must be right by the oracles, or the lost turns refused naming
    ``file:line``, within the attempt's time limit. (Past the render budget's steps, a
    conversation is refused by its wall-time backstop, ``MAX_SECONDS`` of
    ``wdstream/chat/budget.py``: longer than an attempt may take, so not attacked here.)"""
    templates = hostile_templates()
    for rounds in (50, 120):
        for label in ("Qwen3 (reasoning after the last query)", "answer dropped when later"):

            def attempt(rounds: int = rounds, label: str = label) -> str:
                messages: Conv = []
                for r in range(rounds):
                    messages += [{"role": "user", "content": f"USERMARK0x{r} why"},
                                 {"role": "assistant",
                                  "content": f"<think>REASONMARK0x{r}</think>ANSWERMARK0x{r}"}]  # fmt: skip
                tag = f"long-{rounds}-{label[:5]}"
                return labelled(
                    f"{label} / {rounds} rounds",
                    packed_or_refused(work, tag, templates[label], [messages]),
                )

            yield attempt
