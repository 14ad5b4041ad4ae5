"""Reading a chat dataset: labels are -100 exactly where transformers' assistant mask (shifted
by one: a label is the next token) and the EOS/padding rules say, at 0 and 2 workers,
shuffled, resumed mid-epoch, on another world size and through ``batch_at``; doc boundaries
per conversation; a mixture with a pretraining dataset keeps each row's labels; bucketed
batches of a docs-mode SentencePiece pack; a flipped mask bit is a CorruptShardError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import wdstream
from tests.chat_pack_support import (
    RowOracle,
    conversations,
    transformers_reference,
    write_conversations,
)
from tests.chat_support import CHATML_GENERATION, LLAMA3, build_chat_hf, build_chat_spm
from wdstream import CorruptShardError, Loader
from wdstream.chat import ChatEncoder, ChatTemplate
from wdstream.format.loss import NO_LOSS_BIT
from wdstream.testing import assert_resumes_exactly
from wdstream.tokenizers import load_tokenizer

SEQ = 255


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, RowOracle, int]:
    """(dataset, the row oracle from transformers' references, EOS id)."""
    tmp = tmp_path_factory.mktemp("chatread")
    folder = build_chat_hf(tmp / "tok", CHATML_GENERATION).parent
    convs = conversations(160, seed=12)
    src = write_conversations(tmp / "in.jsonl", convs)
    idx = wdstream.pack([str(src)], str(tmp / "ds"), tokenizer=str(folder), chat=True,
                        seq_len=SEQ, shard_samples=6, workers=0).index  # fmt: skip
    assert idx.eos_id is not None
    refs = transformers_reference(folder / "tokenizer.json", convs)
    return str(tmp / "ds"), RowOracle(refs, idx.eos_id), idx.eos_id


def _loader(root: str, **kw: Any) -> Loader:
    opts: dict[str, Any] = dict(seq_len=SEQ, batch_size=4, num_workers=0, epochs=1, seed=3)
    return Loader(root, **{**opts, **kw})


def _check(batches: list[dict[str, torch.Tensor]], oracle: RowOracle) -> list[int]:
    found = []
    for b in batches:
        for ids, labels in zip(b["input_ids"].tolist(), b["labels"].tolist(), strict=True):
            found += oracle.check(ids, labels)
    return found


@pytest.mark.parametrize("workers", [0, 2])
def test_labels_are_transformers_masks(chat: tuple[str, RowOracle, int], workers: int) -> None:
    root, oracle, _ = chat
    batches = list(_loader(root, num_workers=workers, shuffle=True))
    found = _check(batches, oracle)
    assert len(found) > 100
    index = json.loads(Path(root, "index.json").read_text())
    rows = sum(len(b["input_ids"]) for b in batches)
    assert rows == sum(s["samples"] for s in index["shards"]) // 4 * 4


def test_resume_mid_epoch(chat: tuple[str, RowOracle, int]) -> None:
    root, oracle, _ = chat
    items = assert_resumes_exactly(
        lambda: _loader(root, num_workers=2, shuffle=True), steps=9, check_at=[0, 4, 8]
    )
    _check([{k: torch.tensor(v) for k, v in b.items()} for b in items], oracle)


def test_doc_boundaries_are_the_conversations(chat: tuple[str, RowOracle, int]) -> None:
    root, oracle, eos = chat
    for b in _loader(root, return_doc_boundaries=True):
        for r, (ids, labels) in enumerate(zip(b["input_ids"].tolist(), b["labels"].tolist(),
                                              strict=True)):  # fmt: skip
            lengths = [len(oracle.docs[i][0]) + 1 for i in oracle.check(ids, labels)]
            starts = np.cumsum([0, *lengths[:-1]])
            positions = b["position_ids"][r].tolist()
            doc_ids = b["doc_ids"][r].tolist()
            for k, (start, n) in enumerate(zip(starts.tolist(), lengths, strict=True)):
                end = min(start + n, SEQ)
                assert positions[start:end] == list(range(end - start))
                assert doc_ids[start:end] == [k] * (end - start)
            # The padding after the conversations (stored with the no-loss bit) is padding.
            used = min(sum(lengths), SEQ)
            assert doc_ids[used:] == [-1] * (SEQ - used)
        assert "cu_seqlens" in b


def test_other_world_size_and_batch_at(chat: tuple[str, RowOracle, int]) -> None:
    root, oracle, _ = chat
    one = list(_loader(root))
    two = [list(_loader(root, batch_size=2, rank=r, world_size=2)) for r in range(2)]
    for k, b in enumerate(one):
        joined = torch.cat([two[0][k]["labels"], two[1][k]["labels"]])
        assert torch.equal(b["labels"], joined)
    loader = _loader(root)
    for k in (0, len(one) - 1):
        assert all(torch.equal(loader.batch_at(k)[f], one[k][f]) for f in one[k])
    saver = _loader(root, batch_size=2, rank=1, world_size=2)
    it = iter(saver)
    for _ in range(2):
        next(it)
    resumed = _loader(root, num_workers=1)
    resumed.load_state_dict(json.loads(json.dumps(saver.state_dict())))
    rest = list(resumed)
    assert all(torch.equal(a["labels"], b["labels"]) for a, b in zip(rest, one[2:], strict=True))
    _check(rest, oracle)


def test_mixture_with_pretraining_text_keeps_each_rows_labels(
    chat: tuple[str, RowOracle, int], tmp_path: Path
) -> None:
    root, oracle, eos = chat
    src = tmp_path / "text.jsonl"
    # Text of ids the chat tokenizer never starts a conversation with: "zz..." documents.
    src.write_text("".join(json.dumps({"text": "zz " * (5 + i % 40)}) + "\n" for i in range(300)))
    tok = json.loads(Path(root, "index.json").read_text())["tokenizer"]["name"]
    text = str(tmp_path / "text")
    wdstream.pack([str(src)], text, tokenizer=tok, mode="bestfit", seq_len=SEQ, workers=0)
    loader = Loader({"chat": root, "text": text}, weights={"chat": 1, "text": 1}, seq_len=SEQ,
                    batch_size=4, num_workers=0, seed=1)  # fmt: skip
    chat_rows = text_rows = 0
    first = load_tokenizer(tok).encode("zz")[0]
    for _, b in zip(range(15), loader, strict=False):
        for ids, labels in zip(b["input_ids"].tolist(), b["labels"].tolist(), strict=True):
            if ids[0] == first:  # pretraining: every target but those after an EOS, padding
                text_rows += 1
                want = [-100 if x == eos else y for x, y in zip(ids, ids[1:], strict=False)]
                assert labels[:-1] == want
            else:
                chat_rows += 1
                oracle.check(ids, labels)
    assert chat_rows and text_rows
    spec = tmp_path / "mix.json"
    spec.write_text(json.dumps({"sources": {"chat": root, "text": text},
                                "weights": {"chat": 1, "text": 1}}))  # fmt: skip
    from wdstream.read.mixture.inspect import explain_mixture, mixture_explanation_records

    exp = explain_mixture(str(spec), 3, batch_size=4, seq_len=SEQ, seed=1)
    for row in mixture_explanation_records(exp):
        for piece in row["pieces"]:
            assert ("turns" in piece) == (row["source"] == "chat")
            if "turns" in piece:
                assert piece["turns"]["first"] == 0 and "error" not in piece["turns"]


def test_a_flipped_mask_bit_is_a_corrupt_shard(
    chat: tuple[str, RowOracle, int], tmp_path: Path
) -> None:
    root, _, _ = chat
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    data = bytearray((bad / "data-000000.tar").read_bytes())
    from wdstream.read.sources.shards import iter_samples, read_index
    from wdstream.storage import open_store

    first = next(iter_samples(open_store(root), read_index(open_store(root))))[2].tokens
    at = bytes(data).find(first.astype("<u4").tobytes())
    k = int(np.flatnonzero(first < NO_LOSS_BIT)[0])  # supervised: give it the no-loss bit
    data[at + 4 * k + 3] ^= 0x80
    (bad / "data-000000.tar").write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match="data-000000.tar"):
        for _ in _loader(str(bad), shuffle=False):
            pass


def test_sentencepiece_docs_mode_buckets(tmp_path: Path) -> None:
    """A docs-mode pack read as length-bucketed batches: each row is one conversation, its
    labels the ChatEncoder's mask shifted by one (ChatEncoder is checked against the
    templates' oracles in test_chat_masks)."""
    model = build_chat_spm(tmp_path / "spm")
    template = tmp_path / "t.json"
    template.write_text(json.dumps({"chat_template": LLAMA3, "bos_token": "<|begin_of_text|>"}))
    convs = conversations(30, seed=13)
    src = write_conversations(tmp_path / "in.jsonl", convs)
    idx = wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer=str(model), chat=True,
                        chat_template=str(template), mode="docs", workers=0).index  # fmt: skip
    tok = load_tokenizer(str(model))
    encoder = ChatEncoder(ChatTemplate(LLAMA3, {"bos_token": "<|begin_of_text|>"}), tok)
    want = {}
    for m in convs:
        enc = encoder.encode(m)
        ids = [*enc.ids.tolist(), idx.eos_id]
        sup = [*enc.supervised.tolist(), False]
        want[tuple(ids[:-1])] = [t if s else -100 for t, s in zip(ids[1:], sup[1:], strict=True)]
    seen = 0
    for b in Loader(
        str(tmp_path / "ds"), seq_len=1024, batch_size=1, max_tokens=4096, epochs=1, seed=2
    ):
        for ids, labels in zip(b["input_ids"].tolist(), b["labels"].tolist(), strict=True):
            n = next((k for k in range(len(ids) + 1) if tuple(ids[:k]) in want and
                      all(x == idx.eos_id for x in ids[k:])), None)  # fmt: skip
            assert n is not None
            assert labels[:n] == want[tuple(ids[:n])] and all(x == -100 for x in labels[n:])
            seen += 1
    assert seen == len(convs)
