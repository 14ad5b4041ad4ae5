"""What a Ray worker encodes with (no cluster): the warm-up fills the very cache entry the
driver's recipe asks for, and a bpe-openai pack's workers load the binding alone."""

from __future__ import annotations

import pytest

from wdstream.ray import tasks
from wdstream.tokenizers import load_tokenizer
from wdstream.tokenizers.tiktoken import BpeEncoder
from wdstream.write.encoders import encode_flat

TEXTS = ["def f(x):\n    return x  # <|endoftext|> as text", "", "héllo wörld\n\n\tend"]


@pytest.mark.parametrize("backend", ["auto", "bpe-openai", "tiktoken"])
def test_warm_up_caches_what_the_driver_ships(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend != "tiktoken":
        pytest.importorskip("bpe_openai")
    monkeypatch.setattr(tasks, "_tokenizers", {})
    tasks.warm_up("cl100k_base", backend)
    tok = load_tokenizer("cl100k_base", backend)  # the driver's load
    recipe = tasks.worker_recipe(tok)
    assert list(tasks._tokenizers) == [tasks._recipe_key(recipe)]  # the one entry, reused
    worker = tasks.cached_tokenizer(recipe)
    assert isinstance(worker, BpeEncoder) == (backend != "tiktoken")
    flat, lens = encode_flat(worker, TEXTS, None, 100257, "uint32")
    # Oracle: tiktoken's own ids, the pack's EOS after each document.
    want = [[*tok._enc.encode_ordinary(t), 100257] for t in TEXTS]  # type: ignore[attr-defined]
    assert flat.tolist() == [i for ids in want for i in ids]
    assert lens.tolist() == [len(ids) for ids in want]
