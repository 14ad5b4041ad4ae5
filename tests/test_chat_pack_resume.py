"""An interrupted pack --chat resumes byte-identical to an uninterrupted one: shards and
index.json, the audit counts, the rules' counts (truncated conversations at shard ends
included) and the time a template's strftime_now prints, which the resume takes from the
interrupted pack's journal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import wdstream
from tests.chat_pack_support import conversations, write_conversations
from tests.chat_support import CHATML_GENERATION, build_chat_hf
from tests.test_pack_resume import _interrupted_writer
from wdstream.read.sources.shards import iter_samples, read_index
from wdstream.storage import open_store
from wdstream.storage.local import LocalStore
from wdstream.tokenizers import load_tokenizer

DATED = "{{- '<|im_start|>system\\nToday is ' + strftime_now('%d %B %Y') + '<|im_end|>\\n' -}}"


def _same(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("long_docs", ["drop", "truncate"])
def test_interrupted_chat_pack_resumes_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, long_docs: str
) -> None:
    folder = build_chat_hf(tmp_path / "tok", CHATML_GENERATION).parent
    template = tmp_path / "dated.jinja"
    template.write_text(DATED + CHATML_GENERATION)
    bad = ['{"messages": "not a list"}', '{"messages": [{"role": "user", "content": "?"}]}']
    src = write_conversations(tmp_path / "in.jsonl", conversations(120, seed=14), bad)
    kw: dict[str, Any] = dict(tokenizer=str(folder), chat=True, chat_template=str(template),
                              seq_len=95, long_docs=long_docs, shard_size="6KB",
                              on_error="skip", workers=0)  # fmt: skip
    ref, out = tmp_path / "ref", tmp_path / "out"
    wdstream.pack([str(src)], str(ref), chat_now="2024-05-01T10:00:00", **kw)
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer("data-000003.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(src)], str(out), chat_now="2024-05-01T10:00:00", **kw)
    # The resume is not told the time: it takes the interrupted pack's.
    assert wdstream.pack([str(src)], str(out), **kw).resumed_shards == 3
    _same(ref, out)
    stats = json.loads((out / "index.json").read_text())["stats"]
    assert stats["chat"]["now"] == "2024-05-01T10:00:00"
    assert stats["records_skipped"] == 1 and stats["unsupervised_documents_refused"] >= 1
    key = "long_documents_dropped" if long_docs == "drop" else "long_documents_truncated"
    assert stats[key] > 0
    store = open_store(str(out))
    first = next(iter_samples(store, read_index(store)))[2].tokens & 0x7FFFFFFF
    assert "Today is 01 May 2024" in load_tokenizer(str(folder)).decode(first[:40].tolist())


def test_a_template_without_the_clock_records_no_time(tmp_path: Path) -> None:
    folder = build_chat_hf(tmp_path / "tok", CHATML_GENERATION).parent
    src = write_conversations(tmp_path / "in.jsonl", conversations(10, seed=15))
    kw: dict[str, Any] = dict(tokenizer=str(folder), chat=True, seq_len=511, workers=0)
    wdstream.pack([str(src)], str(tmp_path / "a"), chat_now="2020-01-01T00:00:00", **kw)
    wdstream.pack([str(src)], str(tmp_path / "b"), **kw)
    _same(tmp_path / "a", tmp_path / "b")  # the time changes nothing: it is not recorded
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    assert index["stats"]["chat"]["now"] is None
    with pytest.raises(ValueError, match="ISO 8601"):
        template = tmp_path / "dated.jinja"
        template.write_text(DATED + CHATML_GENERATION)
        wdstream.pack([str(src)], str(tmp_path / "c"), chat_template=str(template),
                      chat_now="yesterday", **kw)  # fmt: skip
