"""What a Ray worker encodes with (no cluster): the warm-up fills the very cache entry the
driver's recipe asks for, a bpe-openai pack's workers load the binding alone, and a tiktoken
pack's workers build the encoding from the ranks the driver ships."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import ray

from wdstream.ray import tasks
from wdstream.tokenizers import load_tokenizer
from wdstream.tokenizers.tiktoken import BpeEncoder, TiktokenTokenizer
from wdstream.write.encoders import encode_flat

TEXTS = ["def f(x):\n    return x  # <|endoftext|> as text", "", "héllo wörld\n\n\tend"]


@pytest.mark.parametrize("backend", ["auto", "bpe-openai"])
def test_warm_up_caches_what_the_driver_ships(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def test_workers_build_a_tiktoken_encoding_from_the_ranks_the_driver_ships(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm-up loads nothing for a tiktoken encoding; the shipped recipe builds one that
    encodes tiktoken's ids, once per worker process, reused by the next pack's recipe."""
    monkeypatch.setattr(tasks, "_tokenizers", {})
    tasks.warm_up("cl100k_base", "tiktoken")
    assert tasks._tokenizers == {}
    shipped: list[Any] = []  # the object store, without a cluster: put keeps, get returns

    def put(value: Any) -> int:
        shipped.append(value)
        return len(shipped) - 1

    monkeypatch.setattr(ray, "put", put)
    monkeypatch.setattr(ray, "get", lambda ref: shipped[ref])
    tok = load_tokenizer("cl100k_base", "tiktoken")  # the driver's load
    worker = tasks.cached_tokenizer(tasks.shipped_recipe(tok))
    assert isinstance(worker, TiktokenTokenizer) and worker is not tok
    assert (worker.name, worker.eos_id, worker.n_vocab) == (tok.name, tok.eos_id, tok.n_vocab)
    flat, lens = encode_flat(worker, TEXTS, None, 100257, "uint32")
    want = [[*tok._enc.encode_ordinary(t), 100257] for t in TEXTS]  # type: ignore[attr-defined]
    assert flat.tolist() == [i for ids in want for i in ids]
    assert lens.tolist() == [len(ids) for ids in want]
    assert tasks.cached_tokenizer(tasks.shipped_recipe(tok)) is worker  # another pack's put
    assert len(shipped) == 2 and len(tasks._tokenizers) == 1


def test_the_task_module_imports_no_index_json_parser() -> None:
    """A Ray worker imports the task code afresh for every pack; its tasks write shards but
    never read an ``index.json``, so its parser and validation rules stay unimported, while
    the package's names for them still resolve."""
    code = (
        "import sys\n"
        "import wdstream.ray.tasks\n"
        "print(sorted(m for m in sys.modules if m.startswith('wdstream.format.index')))\n"
        "import wdstream, wdstream.format.index as ix\n"
        "print(wdstream.ShardEntry is ix.ShardEntry, wdstream.DatasetIndex is ix.DatasetIndex,"
        " callable(wdstream.wds_decoder))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "True True True"]
