"""Chat packs (``pack --chat``): hostile conversation records and hostile chat templates.

Oracle: ``transformers``' ``apply_chat_template(..., return_assistant_tokens_mask=True)`` on the
same conversations and the same template (with ``{% generation %}`` tags around each
assistant turn's content and end token, the span wdstream supervises), through the same
``tokenizer.json``; for the template that rewrites earlier turns, the tests' string-layout
oracle and tiktoken. A conversation ``transformers`` refuses (it raises, renders nothing,
or supervises nothing) must be refused: a clear error naming ``file:line`` (or the
template), or counted with ``--on-error skip``; every other conversation must be stored
exactly as ``transformers`` encodes it, then the pack's EOS with bit 31 (``--mode docs``:
one conversation a sample, decoded with tarfile + msgpack).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np

from faultlib.common import (
    Attempt,
    compare,
    flipped,
    index_stats,
    labelled,
    run_checked,
    split_mask,
    stored_samples,
)
from wdstream import Loader

ROOT = Path(__file__).resolve().parents[2]
Conv = list[dict]
Encoded = tuple[list[int], list[int]] | None  # (ids, mask), None: must be refused


def _support() -> object:
    """The chat tests' shared module (templates, conversations, the tokenizer builder)."""
    sys.path.insert(0, str(ROOT))
    import tests.chat_support as support

    return support


def chat_tokenizer(work: Path) -> Path:
    """A byte-level BPE folder with ChatML's special tokens, EOS ``<|im_end|>``, built once."""
    folder = work / "chat-tok"
    if not (folder / "tokenizer.json").exists():
        _support().build_chat_hf(folder)  # type: ignore[attr-defined]
    return folder


def conversations(n: int, seed: int, reasoning: bool = False) -> list[Conv]:
    rng = random.Random(seed)
    return [_support().random_conversation(rng, reasoning) for _ in range(n)]  # type: ignore[attr-defined]


def transformers_encoded(folder: Path, convs: list[Conv], template: str) -> list[Encoded]:
    """``transformers``' ids and assistant masks of each conversation, None where it raises,
    renders nothing or supervises nothing."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                  eos_token="<|im_end|>")  # fmt: skip
    out: list[Encoded] = []
    for messages in convs:
        try:
            got = tok.apply_chat_template(messages, chat_template=template, tokenize=True,
                                          return_dict=True, return_assistant_tokens_mask=True)  # fmt: skip
        except Exception:  # noqa: BLE001 - transformers refusing is the oracle's answer
            out.append(None)
            continue
        ids, mask = list(got["input_ids"]), list(got["assistant_masks"])
        out.append((ids, mask) if ids and any(mask) else None)
    return out


def _eos(folder: Path) -> int:
    from tokenizers import Tokenizer

    return int(Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id("<|im_end|>"))


def stored_wrong(out: Path, want: list[Encoded], eos: int, skip: bool) -> str | None:
    """What differs between the pack at ``out`` and ``want`` (None: nothing): every
    conversation not None stored as encoded plus EOS (bit 31), in order; with ``skip`` the
    others counted (skipped, refused by the template or for no supervised token)."""
    kept = [(ids + [eos], mask + [0]) for ids, mask in filter(None, want)]
    got = [split_mask(s) for s in stored_samples(str(out))]
    if got != kept:
        same = sum(a == b for a, b in zip(got, kept, strict=False))
        return f"{len(got)} conversations stored, {len(kept)} expected, {same} equal in order"
    stats = index_stats(out)
    counted = (stats.get("records_skipped", 0) + stats["chat"]["template_refused"]["count"]
               + stats.get("unsupervised_documents_refused", 0))  # fmt: skip
    refused = sum(w is None for w in want)
    if counted != (refused if skip else 0):
        return f"{counted} conversations counted as refused, {refused} were"
    return None


def _pack(work: Path, tag: str, lines: list[str], folder: Path, skip: bool,
          template: Path | None = None) -> tuple[list[str], Path, Path]:  # fmt: skip
    src = work / f"chat-in-{tag}.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = work / f"chat-out-{tag}-{int(skip)}"
    args = ["pack", str(src), "-o", str(out), "--chat", "--tokenizer", str(folder), "--mode",
            "docs", "--workers", "0", "-q"]  # fmt: skip
    args += ["--chat-template", str(template)] if template is not None else []
    args += ["--on-error", "skip"] if skip else []
    return args, src, out


def _records(big: str) -> dict[str, tuple[str, Conv | None]]:
    """Hostile lines and what ``transformers`` is given for them: None for a line that is
    no conversation (wdstream's parser must refuse it; transformers is not asked)."""
    u, a = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}

    def msgs(*m: object) -> str:
        return json.dumps({"messages": list(m)})

    return {
        "role a number": (msgs({"role": 3, "content": "x"}, a), None),
        "no role": (msgs({"content": "x"}, a), None),
        "no content": (msgs({"role": "user"}, a), None),
        "unknown role": (msgs({"role": "bot", "content": "x"}, a), None),
        "content a number": (msgs({"role": "user", "content": 5}, a), None),
        "content an object": (msgs({"role": "user", "content": {"a": 1}}, a), None),
        "null content, no tool_calls": (msgs(u, {"role": "assistant", "content": None}), None),
        "messages empty": (json.dumps({"messages": []}), None),
        "messages a string": (json.dumps({"messages": "hi"}), None),
        "record an array": ("[1, 2]", None),
        "lone surrogate": ('{"messages": [{"role": "user", "content": "a\\ud800b"}, '
                           '{"role": "assistant", "content": "y"}]}', None),  # fmt: skip
        "100k-deep field": ('{"messages": [{"role": "user", "content": "x", "x": '
                            + "[" * 100_000 + "]" * 100_000 + '}]}', None),  # fmt: skip
        "ShareGPT unknown from": (json.dumps({"conversations": [{"from": "alien", "value": "x"}]}), None),
        "ShareGPT no value": (json.dumps({"conversations": [{"from": "human"}]}), None),
        "ShareGPT value a number": (json.dumps({"conversations": [{"from": "gpt", "value": 1}]}), None),
        "prompt without completion": (json.dumps({"prompt": "x"}), None),
        "completion a number": (json.dumps({"prompt": "x", "completion": 3}), None),
        "tools a string": (json.dumps({"messages": [u, a], "tools": "t"}), None),
        "content parts (template concatenates)": (
            msgs({"role": "user", "content": [{"type": "text", "text": "x"}]}, a),
            [{"role": "user", "content": [{"type": "text", "text": "x"}]}, a]),
        "no assistant turn": (msgs(u), [u]),
        "empty contents": (msgs({"role": "user", "content": ""}, {"role": "assistant", "content": ""}),
                           [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]),
        "1 MB content": (msgs({"role": "user", "content": big}, a),
                         [{"role": "user", "content": big}, a]),
        "prompt/completion": (json.dumps({"prompt": "Hi", "completion": "Yo"}), [u, a]),
        "ShareGPT": (json.dumps({"conversations": [{"from": "human", "value": "Hi"},
                                                   {"from": "gpt", "value": "Yo"}]}), [u, a]),
    }  # fmt: skip


def chat_records(work: Path, scale: float) -> Iterator[Attempt]:
    """A hostile line among 10 generated conversations, strict and ``--on-error skip``."""
    support = _support()
    folder = chat_tokenizer(work)
    good = conversations(10, 7)
    template = support.CHATML_GENERATION  # type: ignore[attr-defined]
    for i, (label, (line, given)) in enumerate(_records("alpha beta " * 100_000).items()):
        lines = [json.dumps({"messages": m}) for m in good[:5]] + [line]
        lines += [json.dumps({"messages": m}) for m in good[5:]]
        for skip in (False, True):

            def attempt(i: int = i, label: str = label, lines: list[str] = lines,
                        given: Conv | None = given, skip: bool = skip) -> str:  # fmt: skip
                args, src, out = _pack(work, f"r{i}", lines, folder, skip)
                odd = transformers_encoded(folder, [given], template)[0] if given else None
                want = [*transformers_encoded(folder, good[:5], template), odd,
                        *transformers_encoded(folder, good[5:], template)]  # fmt: skip
                names = "" if skip else f"{src}:6"
                got = run_checked(args, 50, lambda: stored_wrong(out, want, _eos(folder), skip),
                                  names)  # fmt: skip
                return labelled(label, got)

            yield attempt


def _templates(chatml: str) -> dict[str, tuple[str, bool]]:
    """Hostile templates: ``(text, ask transformers)``; not asked, every conversation must
    be refused (a bomb transformers would spend minutes or gigabytes on)."""
    system_raises = ("{%- if messages[0]['role'] == 'system' -%}"
                     "{{- raise_exception('no system messages') -}}{%- endif -%}")  # fmt: skip
    return {
        "a syntax error": ("{% for m in messages %}{{ m.content }", False),
        "raise_exception always": ("{{ raise_exception('refused') }}" + chatml, True),
        "raise_exception on a system message": (system_raises + chatml, True),
        "''.__class__.__mro__ escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}" + chatml, True),
        "raise_exception.__globals__": ("{{ raise_exception.__globals__ }}" + chatml, True),
        "cycler.__init__.__globals__": ("{{ cycler.__init__.__globals__ }}" + chatml, True),
        "namespace(_x=1)": ("{% set ns = namespace(_x=1) %}" + chatml, True),
        "a macro calling itself": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}" + chatml, True),
        "range(10**9)": ("{% for i in range(10**9) %}{% endfor %}" + chatml, True),
        "1/0": ("{{ 1 / 0 }}" + chatml, True),
        "renders nothing": ("", True),
        "renders no assistant turn": ("{%- for m in messages if m.role != 'assistant' -%}"
                                      "{{ m.content }}{%- endfor -%}", True),
        "'x' * 10**8": ("{{ 'x' * 10**8 }}" + chatml, False),
        "100,000 x 100,000 loop writing": ("{% for i in range(100000) %}{% for j in range(100000) %}"
                                           "x{% endfor %}{% endfor %}" + chatml, False),
        "100,000 x 100,000 loop, silent": ("{% for i in range(100000) %}{% for j in range(100000) %}"
                                           "{% endfor %}{% endfor %}" + chatml, False),
    }  # fmt: skip


def chat_templates(work: Path, scale: float) -> Iterator[Attempt]:
    """10 generated conversations packed with a hostile ``--chat-template``, strict and
    ``--on-error skip``; then the template that rewrites earlier turns (Qwen3's reasoning)."""
    support = _support()
    folder = chat_tokenizer(work)
    good = conversations(10, 8)
    lines = [json.dumps({"messages": m}) for m in good]
    for i, (label, (text, ask)) in enumerate(_templates(support.CHATML_GENERATION).items()):  # type: ignore[attr-defined]
        path = work / f"chat-t{i}.jinja"
        path.write_text(text, encoding="utf-8")
        for skip in (False, True):

            def attempt(i: int = i, label: str = label, text: str = text, ask: bool = ask,
                        path: Path = path, skip: bool = skip) -> str:  # fmt: skip
                args, src, out = _pack(work, f"t{i}-{int(skip)}", lines, folder, skip, path)
                want = transformers_encoded(folder, good, text) if ask else [None] * len(good)
                first = next((k for k, w in enumerate(want) if w is None), 0)
                # strict: a syntax error or a bomb names the template, a refused conversation
                # its line; skipping, only "nothing to pack" fails
                names = "" if skip else f"{src}:{first + 1}" if ask else str(path)
                got = run_checked(args, 30, lambda: stored_wrong(out, want, _eos(folder), skip),
                                  names)  # fmt: skip
                return labelled(label, got)

            yield attempt
    yield lambda: _rewriting_template(work, support)


def _rewriting_template(work: Path, support: object) -> str:
    """Qwen3-style reasoning (dropped from turns before the last user message): rule 2 of
    ``docs/CHAT.md``; the tests' layout oracle gives the text and supervised spans, tiktoken
    the tokens (a token with a supervised byte is supervised)."""
    sys.path.insert(0, str(ROOT))
    from tests.chat_pack_support import tiktoken_reference

    convs = conversations(12, 9, reasoning=True)
    path = work / "chat-reasoning.jinja"
    path.write_text(support.REASONING, encoding="utf-8")  # type: ignore[attr-defined]
    src = work / "chat-reasoning.jsonl"
    src.write_text("\n".join(json.dumps({"messages": m}) for m in convs) + "\n", encoding="utf-8")
    out = work / "chat-reasoning-out"
    want = tiktoken_reference(support.oracle_reasoning, convs)  # type: ignore[attr-defined]
    want = [w if any(w[1]) else None for w in want]
    args = ["pack", str(src), "-o", str(out), "--chat", "--tokenizer", "cl100k_base",
            "--chat-template", str(path), "--mode", "docs", "--workers", "0", "-q",
            "--on-error", "skip"]  # fmt: skip
    return run_checked(args, 50, lambda: stored_wrong(out, want, 100257, True))


def _chat_pack(work: Path) -> Path:
    """A best-fit chat pack of 60 generated conversations (the mask in bit 31)."""
    out = work / "chat-flips"
    if not out.exists():
        src = work / "chat-flips.jsonl"
        src.write_text("\n".join(json.dumps({"messages": m}) for m in conversations(60, 10)) + "\n")
        subprocess.run([sys.executable, "-m", "wdstream.cli", "pack", str(src), "-o", str(out),
                        "--chat", "--tokenizer", str(chat_tokenizer(work)), "--seq-len", "127",
                        "--shard-size", "8KB", "--workers", "0", "-q"], check=True)  # fmt: skip
    return out


def _rows_and_labels(root: str) -> np.ndarray:
    """Every row of one epoch, ``input_ids`` then ``labels`` (the mask's -100s)."""
    loader = Loader(root, seq_len=127, batch_size=2, num_workers=0, seed=1, epochs=1)
    return np.concatenate([np.concatenate([b["input_ids"], b["labels"]], axis=1) for b in loader])


def chat_mask_flips(work: Path, scale: float) -> Iterator[Attempt]:
    """Bit 31 (the loss mask) of a random stored token of a chat pack flipped: the epoch read
    must be refused (the sample's CRC32C) or equal the clean read (rows and labels)."""
    from wdstream.format.sidecar import ShardSidecar

    root = _chat_pack(work)
    want = _rows_and_labels(str(root))
    shards = sorted(p.name for p in root.glob("*.tar"))
    rng = np.random.default_rng(21)
    for i in range(max(4, int(60 * scale))):
        name = shards[int(rng.integers(len(shards)))]
        sc = ShardSidecar.from_bytes((root / name).with_suffix(".idx").read_bytes())
        k = int(rng.integers(len(sc)))
        raw = (root / name).read_bytes()[int(sc.offsets[k]) : int(sc.offsets[k] + sc.sizes[k])]
        tokens = msgpack.unpackb(raw)["tokens"]
        first = int(sc.offsets[k]) + raw.index(tokens)  # where the token array starts
        byte = first + 4 * int(rng.integers(len(tokens) // 4)) + 3  # a token's top byte
        dst = work / f"chat-flip-{i}"

        def attempt(dst: Path = dst, name: str = name, byte: int = byte) -> str:
            return compare(
                lambda: _rows_and_labels(flipped(str(root), dst, name, 8 * byte + 7)), want
            )

        yield attempt
