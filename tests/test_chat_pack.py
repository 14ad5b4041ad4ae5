"""pack --chat: conversations in every input form become the ids and masks transformers' own
apply_chat_template(return_assistant_tokens_mask=True) gives (HF tokenizer, generation-tag
template), the same shards for any worker count and after an interrupt, tiktoken's ids and a
byte-span oracle's mask for cl100k (tiktoken and bpe-openai backends alike), the audit per role
and per template problem, and every rule: long conversations dropped or truncated, conversations
without a supervised token or refused by the template, malformed records, concat, Ray."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import wdstream
from tests.chat_pack_support import (
    RowOracle,
    conversations,
    tiktoken_reference,
    transformers_reference,
    write_conversations,
)
from tests.chat_support import CHATML, CHATML_GENERATION, REASONING, build_chat_hf, oracle_chatml
from wdstream import Loader
from wdstream.cli import main
from wdstream.format.loss import NO_LOSS_BIT
from wdstream.read.sources.shards import iter_samples, read_index
from wdstream.storage import open_store

SEQ = 255


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_hf(tmp_path_factory.mktemp("tok"), CHATML_GENERATION).parent


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory, hf_folder: Path) -> tuple[Path, Path, list[Any]]:
    """(input, dataset packed with 0 workers, transformers' references)."""
    tmp = tmp_path_factory.mktemp("chat")
    convs = conversations(150, seed=4)
    src = write_conversations(tmp / "in.jsonl", convs)
    wdstream.pack([str(src)], str(tmp / "ds"), tokenizer=str(hf_folder), chat=True,
                  seq_len=SEQ, shard_samples=8, workers=0)  # fmt: skip
    return src, tmp / "ds", transformers_reference(hf_folder / "tokenizer.json", convs)


def _rows(root: Path) -> list[tuple[list[int], list[int]]]:
    loader = Loader(str(root), seq_len=SEQ, batch_size=1, epochs=1, shuffle=False, num_workers=0)
    return [(b["input_ids"][0].tolist(), b["labels"][0].tolist()) for b in loader]


def test_ids_and_labels_are_transformers(chat: tuple[Path, Path, list[Any]]) -> None:
    src, root, refs = chat
    index = json.loads((root / "index.json").read_text())
    assert (
        index["loss_mask"] == "bit31" and index["dtype"] == "uint32" and index["mode"] == "bestfit"
    )
    oracle = RowOracle(refs, index["eos_id"])
    seen = Counter(i for ids, labels in _rows(root) for i in oracle.check(ids, labels))
    fits = [i for i, (ids, _) in enumerate(refs) if len(ids) + 1 <= SEQ + 1]
    # Identical conversations are found by their first copy: count copies, not indices.
    by_ids = Counter(tuple(refs[i][0]) for i in fits)
    assert sum(seen.values()) == len(fits) == sum(by_ids.values())
    stats = index["stats"]
    assert stats["long_documents_dropped"] == len(refs) - len(fits) > 0
    assert stats["documents"] == len(fits)
    assert stats["supervised_tokens"] == sum(sum(refs[i][1]) for i in fits)


def test_any_worker_count_writes_the_same_dataset(
    chat: tuple[Path, Path, list[Any]], hf_folder: Path, tmp_path: Path
) -> None:
    src, root, _ = chat
    wdstream.pack([str(src)], str(tmp_path / "w2"), tokenizer=str(hf_folder), chat=True,
                  seq_len=SEQ, shard_samples=8, workers=2, batch_bytes=4096)  # fmt: skip
    names = sorted(p.name for p in root.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "w2").iterdir())
    for name in names:
        assert (root / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name


def test_index_records_the_template_and_the_audit(
    chat: tuple[Path, Path, list[Any]], hf_folder: Path
) -> None:
    _, root, refs = chat
    index = json.loads((root / "index.json").read_text())
    c = index["stats"]["chat"]
    config = json.loads((hf_folder / "tokenizer_config.json").read_text())
    assert c["template"] == config["chat_template"] == CHATML_GENERATION
    assert c["template_origin"].endswith("tokenizer_config.json: chat_template")
    assert (c["train_on"], c["messages_key"], c["now"], c["long_docs"]) == (
        "assistant", "messages", None, "drop")  # fmt: skip
    roles = c["roles"]
    total = sum(r["tokens"] for r in roles.values()) + c["added_tokens"]
    padding = sum(s.doc_lens[-1] for _, _, s in iter_samples(open_store(str(root)),
                                                                read_index(open_store(str(root)))))  # fmt: skip
    assert total == sum(s["tokens"] for s in index["shards"]) - padding
    assert sum(r["supervised"] for r in roles.values()) == index["stats"]["supervised_tokens"]
    assert roles["assistant"]["supervised"] > 0.9 * index["stats"]["supervised_tokens"]
    assert roles["system"]["supervised"] == 0
    assert c["added_tokens"] == index["stats"]["documents"]  # one EOS each
    assert c["problems"]["straddle"]["count"] > 0  # the small BPE merges "\n\n" across edges
    assert all(":" in e and "message" in e for e in c["problems"]["straddle"]["examples"])
    assert c["problems"]["unlocated"]["count"] == c["problems"]["relocated"]["count"] == 0


def test_stats_inspect_and_explain(chat: tuple[Path, Path, list[Any]], tmp_path: Path) -> None:
    src, root, _ = chat
    runner = CliRunner()
    res = runner.invoke(main, ["stats", str(root)])
    assert res.exit_code == 0, res.output
    assert "chat: template" in res.output and "assistant" in res.output
    assert "template problems: " in res.output and "straddle at " in res.output
    assert "documents longer than a row dropped" in res.output
    assert "Warning" not in res.output
    s = json.loads(runner.invoke(main, ["stats", str(root), "--json"]).output)
    assert s["loss_mask"]["chat"]["roles_agree"] is True
    res = runner.invoke(main, ["inspect", str(root), "-n", "1"])
    assert res.exit_code == 0 and "[[" in res.output and "<|im_end|>]]" in res.output
    res = runner.invoke(main, ["explain", str(root), "--step", "2", "--batch-size", "2",
                               "--format", "jsonl", "--text"])  # fmt: skip
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in res.output.splitlines()]
    lines = src.read_text().splitlines()
    for piece in (p for r in records for p in r["pieces"]):
        record = json.loads(lines[piece["line"] - 1])
        messages = record.get("messages") or record.get("conversations") or [1, 1]
        turns = piece["turns"]
        assert turns["first"] == 0 and turns["last"] == len(messages) - 1  # whole conversations
        assert turns["pack_tokens"] == 1  # the EOS
        assert piece["text"].startswith("<|im_start|>")
    res = runner.invoke(main, ["explain", str(root), "--step", "2", "--batch-size", "2"])
    assert "turns 0-" in res.output and "+ 1 pack token" in res.output


def test_explain_says_when_the_input_is_gone(hf_folder: Path, tmp_path: Path) -> None:
    src = write_conversations(tmp_path / "gone.jsonl", conversations(20, seed=9))
    wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer=str(hf_folder), chat=True,
                  seq_len=SEQ, workers=0)  # fmt: skip
    src.rename(tmp_path / "moved.jsonl")
    res = CliRunner().invoke(main, ["explain", str(tmp_path / "ds"), "--step", "0",
                                    "--batch-size", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "turns unknown" in res.output and "cannot open the input" in res.output


@pytest.mark.parametrize("backend", ["tiktoken", "bpe-openai"])
def test_cl100k_ids_and_masks(tmp_path: Path, backend: str) -> None:
    """tiktoken encodes the chat text (bpe-openai recognises no special tokens): both backends
    store tiktoken's ids of the template-layout oracle's text, masked by its spans."""
    if backend == "bpe-openai":
        pytest.importorskip("bpe_openai")
    convs = conversations(40, seed=5)
    src = write_conversations(tmp_path / "in.jsonl", convs)
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer="cl100k_base", backend=backend,
                  chat=True, chat_template=str(template), seq_len=1023, workers=2,
                  shard_samples=4)  # fmt: skip
    refs = tiktoken_reference(oracle_chatml, convs)
    index = json.loads((tmp_path / "ds" / "index.json").read_text())
    assert index["tokenizer"]["backend"] == backend
    assert index["stats"]["chat"]["special_tokens"]["eos_token"] == "<|endoftext|>"
    oracle = RowOracle(refs, index["eos_id"])
    seen = [i for ids, labels in _rows_of(tmp_path / "ds", 1023) for i in oracle.check(ids, labels)]
    assert len(seen) == len(convs)


def _rows_of(root: Path, seq: int) -> list[tuple[list[int], list[int]]]:
    loader = Loader(str(root), seq_len=seq, batch_size=1, epochs=1, shuffle=False, num_workers=0)
    return [(b["input_ids"][0].tolist(), b["labels"][0].tolist()) for b in loader]


def test_relocated_turns_are_counted_with_examples(hf_folder: Path, tmp_path: Path) -> None:
    convs = conversations(40, seed=6, reasoning=True)
    src = write_conversations(tmp_path / "in.jsonl", convs)
    (tmp_path / "r.jinja").write_text(REASONING)
    wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer=str(hf_folder), chat=True,
                  chat_template=str(tmp_path / "r.jinja"), seq_len=1023, workers=0)  # fmt: skip
    c = json.loads((tmp_path / "ds" / "index.json").read_text())["stats"]["chat"]
    relocated = c["problems"]["relocated"]
    assert relocated["count"] > 0 and 0 < len(relocated["examples"]) <= 3
    assert relocated["examples"][0].startswith(f"{src}:")
    res = CliRunner().invoke(main, ["stats", str(tmp_path / "ds")])
    assert f"relocated at {src}:" in res.output


def test_bad_records_refusals_and_train_on(hf_folder: Path, tmp_path: Path) -> None:
    good = conversations(10, seed=7)
    extra = [
        '{"messages": [{"role": "bot", "content": "hi"}]}',  # malformed
        '{"messages": [{"role": "user", "content": "no answer"}]}',  # nothing supervised
        '{"messages": [{"role": "user", "content": "REFUSE"}, {"role": "assistant", "content": "x"}]}',
    ]
    src = write_conversations(tmp_path / "in.jsonl", good, extra)
    template = tmp_path / "t.jinja"
    template.write_text("{% if messages[0]['content'] == 'REFUSE' %}"
                        "{{ raise_exception('no refusals here') }}{% endif %}" + CHATML_GENERATION)  # fmt: skip
    kw: dict[str, Any] = dict(tokenizer=str(hf_folder), chat=True, chat_template=str(template),
                              seq_len=1023, workers=0)  # fmt: skip
    with pytest.raises(wdstream.InputError, match=r"in.jsonl:11: messages\[0\].role"):
        wdstream.pack([str(src)], str(tmp_path / "a"), **kw)
    src.write_text("\n".join(src.read_text().splitlines()[:10] + extra[1:]) + "\n")
    with pytest.raises(wdstream.InputError, match=r"in.jsonl:11: no token .* --allow-unsupervised"):
        wdstream.pack([str(src)], str(tmp_path / "b"), **kw)
    src = write_conversations(tmp_path / "in.jsonl", good, extra)
    stats = wdstream.pack([str(src)], str(tmp_path / "c"), on_error="skip", **kw).index.stats
    assert stats["records_skipped"] == 1 and "in.jsonl:11" in stats["skipped_locations"][0]
    assert stats["unsupervised_documents_refused"] == 1
    refused = stats["chat"]["template_refused"]
    assert refused["count"] == 1 and "in.jsonl:13" in refused["examples"][0]
    assert "no refusals here" in refused["examples"][0]
    assert stats["documents"] == 10
    kept = wdstream.pack([str(src)], str(tmp_path / "d"), on_error="skip", allow_unsupervised=True,
                         **kw).index.stats  # fmt: skip
    assert kept["documents"] == 11 and kept["unsupervised_documents_refused"] == 0
    last = wdstream.pack([str(src)], str(tmp_path / "e"), on_error="skip", train_on="last",
                         **kw).index.stats  # fmt: skip
    every = wdstream.pack([str(src)], str(tmp_path / "f"), on_error="skip", train_on="all",
                          **kw).index.stats  # fmt: skip
    assert last["supervised_tokens"] < stats["supervised_tokens"] < every["supervised_tokens"]
    # train_on=all: every conversation token but its first (no target: nothing before it in
    # the conversation predicts it), only those, the pack's EOS and padding without loss
    roles = every["chat"]["roles"].values()
    assert every["supervised_tokens"] == sum(r["tokens"] for r in roles) - every["documents"]


@pytest.mark.parametrize("rule", ["drop", "truncate"])
def test_long_conversations_dropped_or_truncated(
    hf_folder: Path, tmp_path: Path, rule: str
) -> None:
    convs = conversations(30, seed=8)
    src = write_conversations(tmp_path / "in.jsonl", convs)
    refs = transformers_reference(hf_folder / "tokenizer.json", convs)
    seq = 95
    long = sum(len(ids) + 1 > seq + 1 for ids, _ in refs)
    idx = wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer=str(hf_folder), chat=True,
                        seq_len=seq, long_docs=rule, on_error="skip", workers=0).index  # fmt: skip
    key = "long_documents_dropped" if rule == "drop" else "long_documents_truncated"
    assert idx.stats[key] > 0
    if rule == "drop":
        assert idx.stats[key] == long
        return
    eos = idx.eos_id
    for _, _, smp in iter_samples(open_store(str(tmp_path / "ds")), idx):
        tokens, at = smp.tokens, 0
        for n in idx.document_pieces(smp.doc_lens):
            doc = tokens[at : at + n]
            assert doc[-1] == eos | NO_LOSS_BIT  # a truncated conversation still ends in EOS
            at += n
    assert idx.stats[key] + idx.stats["unsupervised_documents_refused"] == long


def test_options_that_do_not_go_with_chat(hf_folder: Path, tmp_path: Path) -> None:
    src = write_conversations(tmp_path / "in.jsonl", conversations(3, seed=1))
    kw: dict[str, Any] = dict(tokenizer=str(hf_folder), workers=0)
    with pytest.raises(ValueError, match="keeps every conversation whole"):
        wdstream.pack([str(src)], str(tmp_path / "a"), chat=True, mode="concat", **kw)
    with pytest.raises(ValueError, match="engine='ray' packs text only"):
        wdstream.pack([str(src)], str(tmp_path / "b"), chat=True, engine="ray", **kw)
    with pytest.raises(ValueError, match="add --chat"):
        wdstream.pack([str(src)], str(tmp_path / "c"), train_on="last", **kw)
    with pytest.raises(wdstream.WdstreamError, match="give one with --chat-template"):
        wdstream.pack([str(src)], str(tmp_path / "d"), chat=True, workers=0)  # cl100k: no folder
    res = CliRunner().invoke(main, ["pack", str(src), "-o", str(tmp_path / "e"), "--chat",
                                    "--tokenizer", str(hf_folder), "--mode", "concat"])  # fmt: skip
    assert res.exit_code != 0 and res.output.startswith("Error: ") and "bestfit" in res.output
    res = CliRunner().invoke(main, ["pack", str(src), "-o", str(tmp_path / "f"), "--chat",
                                    "--tokenizer", str(hf_folder), "--workers", "0",
                                    "--seq-len", "511"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "loss mask: " in res.output and "chat template problems:" in res.output
    assert json.loads((tmp_path / "f" / "index.json").read_text())["mode"] == "bestfit"


def test_docs_mode_keeps_one_conversation_per_sample(hf_folder: Path, tmp_path: Path) -> None:
    convs = conversations(25, seed=10)
    src = write_conversations(tmp_path / "in.jsonl", convs)
    refs = transformers_reference(hf_folder / "tokenizer.json", convs)
    idx = wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer=str(hf_folder), chat=True,
                        mode="docs", workers=0).index  # fmt: skip
    samples = [s.tokens for _, _, s in iter_samples(open_store(str(tmp_path / "ds")), idx)]
    want = [
        np.array([t if m else t | NO_LOSS_BIT for t, m in zip(ids, mask, strict=True)]
                 + [idx.eos_id | NO_LOSS_BIT])
        for ids, mask in refs
    ]  # fmt: skip
    assert len(samples) == len(want)
    assert all(np.array_equal(a, b) for a, b in zip(samples, want, strict=True))
