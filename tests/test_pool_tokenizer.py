"""A chat pack's process workers load one tokenizer: a bpe-openai chat pack's workers load the
tiktoken encoder the chat encoder brings (the very object, so unpickled once), not the unused
bpe-openai binding beside it; a text pack's still only the binding. The output is the same as
encoding inline (the oracle: the workers=0 pack, byte for byte)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import wdstream
from tests.chat_pack_support import conversations, write_conversations
from tests.chat_support import CHATML
from wdstream.tokenizers import load_tokenizer
from wdstream.write import tokenpool
from wdstream.write.documents import PackDocuments


def _encoder(tok: wdstream.tokenizers.Tokenizer, tmp_path: Path, chat: bool) -> object:
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    docs = PackDocuments(chat=chat, chat_template=str(template) if chat else None)
    return docs.resolve(tok, (None, tok.eos_id, "uint32"), ("bestfit", 255), "raise", ["x"]).encoder


def test_a_bpe_openai_chat_worker_gets_the_encoders_own_tokenizer(tmp_path: Path) -> None:
    pytest.importorskip("bpe_openai")
    tok = load_tokenizer("cl100k_base", "bpe-openai")
    assert tok.backend == "bpe-openai"
    chat = _encoder(tok, tmp_path, chat=True)
    recipe = tokenpool._worker_tokenizer(tok, chat)  # type: ignore[arg-type]
    assert recipe is chat.tokenizer and recipe.backend == "tiktoken"  # type: ignore[attr-defined]
    # The pool's initargs cross as one pickle: the worker unpickles one tokenizer, not two.
    worker_tok, worker_encoder = pickle.loads(pickle.dumps((recipe, chat)))
    assert worker_tok is worker_encoder.tokenizer
    text = _encoder(tok, tmp_path, chat=False)
    assert tokenpool._worker_tokenizer(tok, text) == "cl100k_base"  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["bpe-openai", "tiktoken"])
def test_chat_workers_write_what_inline_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    if backend == "bpe-openai":
        pytest.importorskip("bpe_openai")
    monkeypatch.setattr(tokenpool.TokenPool, "inline_while_starting", False)
    src = write_conversations(tmp_path / "in.jsonl", conversations(60, seed=12))
    (tmp_path / "chatml.jinja").write_text(CHATML)
    kw = dict(tokenizer="cl100k_base", backend=backend, chat=True, seq_len=255,
              chat_template=str(tmp_path / "chatml.jinja"), shard_samples=4, batch_bytes=2048)  # fmt: skip
    wdstream.pack([str(src)], str(tmp_path / "w0"), workers=0, **kw)  # type: ignore[arg-type]
    result = wdstream.pack([str(src)], str(tmp_path / "w2"), workers=2, **kw)  # type: ignore[arg-type]
    assert result.pool == "processes"
    names = sorted(p.name for p in (tmp_path / "w0").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "w2").iterdir())
    for name in names:
        assert (tmp_path / "w0" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name
