"""Template variables (``pack --chat-template-kwargs``, ``chat_template_kwargs=``): every render
gets them as transformers' ``apply_chat_template(**kwargs)`` does. Oracles: transformers'
``apply_chat_template`` with the same kwargs (ids; its assistant mask of the generation-tag
twin, or the text after its own generation prompt), the uninterrupted pack, and transformers'
own signature for the names it keeps."""

from __future__ import annotations

import inspect
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import wdstream
from tests.chat_pack_support import RowOracle, write_conversations
from tests.chat_support import BOS, build_chat_hf
from tests.kwargs_templates import LLAMA31, LLAMA31_GENERATION, QWEN3, TOOLS
from tests.test_pack_resume import _interrupted_writer
from wdstream import Loader
from wdstream.chat.recorded import ChatSettings
from wdstream.chat.template import RENDER_ARGUMENTS, template_variables
from wdstream.cli import main
from wdstream.errors import WdstreamError
from wdstream.storage.local import LocalStore
from wdstream.tokenizers import load_tokenizer

SEQ = 1023
THINK_OFF = {"enable_thinking": False}
LLAMA_KW = {"date_string": "02 Dec 2026", "custom_tools": TOOLS}
_WORDS = ["Hello!", "The answer is 42.", "Zahl: 3,14; <b>x</b>", "日本語のテキスト 🙂", "  padded  ",
          "def f(x):\n    return x ** 2\n", "Русский текст"]  # fmt: skip


def _conversations(n: int, seed: int, turns: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": rng.choice(_WORDS)}] if rng.random() < 0.4 else []
        for _ in range(rng.randint(1, turns)):
            messages += [{"role": "user", "content": rng.choice(_WORDS)},
                         {"role": "assistant", "content": rng.choice(_WORDS)}]  # fmt: skip
        out.append(messages)
    return out


def _reference_tokenizer(folder: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                   bos_token=BOS, eos_token="<|im_end|>")  # fmt: skip


def _rows(root: Path) -> list[tuple[list[int], list[int]]]:
    loader = Loader(str(root), seq_len=SEQ, batch_size=1, epochs=1, shuffle=False, num_workers=0)
    return [(b["input_ids"][0].tolist(), b["labels"][0].tolist()) for b in loader]


def _check_rows(root: Path, refs: list[tuple[list[int], list[int]]]) -> None:
    """Every row holds whole reference conversations with the reference labels, and every
    conversation is in some row."""
    index = json.loads((root / "index.json").read_text())
    oracle = RowOracle(refs, index["eos_id"])
    seen = Counter(i for ids, labels in _rows(root) for i in oracle.check(ids, labels))
    assert sum(seen.values()) == len(refs) == index["stats"]["documents"]
    assert index["stats"]["supervised_tokens"] == sum(sum(m) for _, m in refs)


def _qwen3_reference(ref: Any, convs: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    """transformers' ids of each conversation, supervised from the end of the generation
    prompt it renders for the last answer (same kwargs) to the answer's <|im_end|>."""
    out = []
    for messages in convs:
        whole = ref.apply_chat_template(messages, chat_template=QWEN3, tokenize=False, **kwargs)
        prompt = ref.apply_chat_template(messages[:-1], chat_template=QWEN3, tokenize=False,
                                         add_generation_prompt=True, **kwargs)  # fmt: skip
        assert whole.startswith(prompt) and whole.endswith("<|im_end|>\n")
        enc = ref(whole, add_special_tokens=False, return_offsets_mapping=True)
        lo, hi = len(prompt), len(whole) - 1
        mask = [int(e > lo and s < hi) for s, e in enc["offset_mapping"]]
        out.append((list(enc["input_ids"]), mask))
    return out


@pytest.mark.parametrize("kwargs", [THINK_OFF, {}], ids=["enable_thinking_false", "none"])
def test_qwen3_enable_thinking_is_transformers(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    folder = build_chat_hf(tmp_path / "tok", QWEN3).parent
    convs = _conversations(60, seed=3, turns=1)
    src = write_conversations(tmp_path / "in.jsonl", convs)
    wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer=str(folder), chat=True,
                  seq_len=SEQ, workers=0, chat_template_kwargs=kwargs or None)  # fmt: skip
    refs = _qwen3_reference(_reference_tokenizer(folder), convs, kwargs)
    _check_rows(tmp_path / "ds", refs)
    chat = json.loads((tmp_path / "ds" / "index.json").read_text())["stats"]["chat"]
    assert chat.get("template_kwargs") == (kwargs or None)  # none: the record as before


def test_qwen3_thinking_off_changes_the_mask_only(tmp_path: Path) -> None:
    folder = build_chat_hf(tmp_path / "tok", QWEN3).parent
    ref = _reference_tokenizer(folder)
    convs = _conversations(20, seed=5, turns=1)
    on, off = _qwen3_reference(ref, convs, {}), _qwen3_reference(ref, convs, THINK_OFF)
    assert [ids for ids, _ in on] == [ids for ids, _ in off]
    assert all(sum(a) > sum(b) for (_, a), (_, b) in zip(on, off, strict=True))


def _llama_reference(folder: Path, convs: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    ref = _reference_tokenizer(folder)
    out = []
    for messages in convs:
        got = ref.apply_chat_template(messages, chat_template=LLAMA31_GENERATION, tokenize=True,
                                      return_dict=True, return_assistant_tokens_mask=True,
                                      **kwargs)  # fmt: skip
        out.append((list(got["input_ids"]), list(got["assistant_masks"])))
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Any]]:
    """(tokenizer folder, dataset packed with LLAMA_KW, the conversations)."""
    tmp = tmp_path_factory.mktemp("llama")
    folder = build_chat_hf(tmp / "tok", LLAMA31).parent
    convs = _conversations(40, seed=9, turns=3)
    src = write_conversations(tmp / "in.jsonl", convs)
    wdstream.pack([str(src)], str(tmp / "ds"), tokenizer=str(folder), chat=True, seq_len=SEQ,
                  workers=0, chat_template_kwargs=LLAMA_KW)  # fmt: skip
    return folder, tmp / "ds", convs


def test_llama31_date_string_and_custom_tools_are_transformers(
    llama: tuple[Path, Path, list[Any]],
) -> None:
    folder, root, convs = llama
    refs = _llama_reference(folder, convs, LLAMA_KW)
    _check_rows(root, refs)
    plain = _llama_reference(folder, convs, {})
    assert all(len(a[0]) > len(b[0]) for a, b in zip(refs, plain, strict=True))  # the tools
    chat = json.loads((root / "index.json").read_text())["stats"]["chat"]
    assert chat["template_kwargs"] == LLAMA_KW
    # The record renders again as the pack did (what explain re-encodes with).
    settings = ChatSettings.from_record(chat)
    encoder = settings.encoder(load_tokenizer(str(folder)))
    for messages, (ids, mask) in zip(convs[:10], refs, strict=False):
        enc = encoder.encode(messages)
        assert (enc.ids.tolist(), enc.supervised.astype(int).tolist()) == (ids, mask)


def test_explain_finds_the_turns_with_the_recorded_kwargs(
    llama: tuple[Path, Path, list[Any]],
) -> None:
    _, root, _ = llama
    res = CliRunner().invoke(main, ["explain", str(root), "--step", "0", "--batch-size", "2",
                                    "--no-shuffle", "--format", "jsonl"])  # fmt: skip
    assert res.exit_code == 0, res.output
    pieces = [p for line in res.output.splitlines() for p in json.loads(line)["pieces"]]
    assert pieces and all("error" not in p["turns"] for p in pieces), res.output[:2000]
    assert all(p["turns"]["roles"] for p in pieces)
    stats = CliRunner().invoke(main, ["stats", str(root)])
    assert stats.exit_code == 0 and 'template kwargs {"date_string": "02 Dec 2026"' in stats.output


def test_the_writer_takes_the_same_kwargs(
    llama: tuple[Path, Path, list[Any]], tmp_path: Path
) -> None:
    folder, root, convs = llama
    with wdstream.Writer(str(tmp_path / "w"), tokenizer=str(folder), chat=True, seq_len=SEQ,
                         workers=0, chat_template_kwargs=LLAMA_KW) as writer:  # fmt: skip
        for messages in convs:
            writer.write({"messages": messages})
    got = json.loads((tmp_path / "w" / "index.json").read_text())
    assert got["stats"]["chat"]["template_kwargs"] == LLAMA_KW
    shards = sorted(p.name for p in root.glob("*.tar"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "w").glob("*.tar"))
    for shard in shards:  # the same tokens and masks as pack's (the input name is elsewhere)
        assert (root / shard).read_bytes() == (tmp_path / "w" / shard).read_bytes(), shard


def test_resume_with_other_kwargs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = build_chat_hf(tmp_path / "tok", LLAMA31).parent
    src = write_conversations(tmp_path / "in.jsonl", _conversations(80, seed=2, turns=2))
    kw: dict[str, Any] = dict(tokenizer=str(folder), chat=True, seq_len=SEQ, workers=0,
                              shard_size="8KB")  # fmt: skip
    ref, out = tmp_path / "ref", tmp_path / "out"
    wdstream.pack([str(src)], str(ref), chat_template_kwargs=LLAMA_KW, **kw)
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer("data-000002.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(src)], str(out), chat_template_kwargs=LLAMA_KW, **kw)
    for other in ({"date_string": "01 Jan 2025", "custom_tools": TOOLS}, None):
        with pytest.raises(WdstreamError, match=r"differs in: chat\)"):
            wdstream.pack([str(src)], str(out), chat_template_kwargs=other, **kw)
    assert wdstream.pack([str(src)], str(out), chat_template_kwargs=LLAMA_KW, **kw).resumed_shards
    names = sorted(p.name for p in ref.iterdir())
    assert names == sorted(p.name for p in out.iterdir())
    for name in names:
        assert (ref / name).read_bytes() == (out / name).read_bytes(), name


def test_the_render_arguments_are_transformers_own() -> None:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.utils.chat_template_utils import render_jinja_template

    own = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    own |= set(inspect.signature(render_jinja_template).parameters)
    assert own - {"self", "kwargs"} | {"messages"} == RENDER_ARGUMENTS


@pytest.mark.parametrize(
    ("value", "says"),
    [([1], "expected a JSON object"), ("x", "expected a JSON object"),
     ({"messages": []}, "'messages' is an argument of the render"),
     ({"add_generation_prompt": True}, "'add_generation_prompt' is an argument"),
     ({"tools": TOOLS}, "'tools' is an argument"), ({"x": float("nan")}, "not JSON"),
     ({"x": {1, 2}}, "not JSON"), ({1: 2}, "names must be strings")],
)  # fmt: skip
def test_what_is_not_template_variables_is_refused(value: Any, says: str) -> None:
    with pytest.raises(ValueError, match=f"^chat_template_kwargs: {says}"):
        template_variables(value)


def test_a_tuple_is_recorded_as_the_list_json_gives() -> None:
    assert template_variables({"a": (1, 2), "b": None}) == {"a": [1, 2], "b": None}


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--chat", "--chat-template-kwargs", "[1]"], "--chat-template-kwargs: expected a JSON"),
     (["--chat", "--chat-template-kwargs", "{oops"], "--chat-template-kwargs: not JSON"),
     (["--chat", "--chat-template-kwargs", '{"tools": []}'], "--chat-template-kwargs: 'tools'"),
     (["--chat-template-kwargs", '{"a": 1}'], "are options of chat packs: add --chat")],
)  # fmt: skip
def test_the_cli_refuses_bad_kwargs_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    res = CliRunner().invoke(main, ["pack", str(src), "-o", str(tmp_path / "o"), *args])
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and says in lines[0], res.output


def test_the_writer_refuses_bad_kwargs_when_opened(tmp_path: Path) -> None:
    folder = build_chat_hf(tmp_path / "tok", QWEN3).parent
    with pytest.raises(ValueError, match="^chat_template_kwargs: 'messages' is an argument"):
        wdstream.Writer(str(tmp_path / "w"), tokenizer=str(folder), chat=True, workers=0,
                        chat_template_kwargs={"messages": []})  # fmt: skip
    assert not (tmp_path / "w" / "index.json").exists()
