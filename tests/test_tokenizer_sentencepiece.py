"""SentencePiece .model files: ids equal sentencepiece's own, BOS/EOS from the model, pack ->
read round trips through a worker process, the file hash recorded and a changed file refused."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import sentencepiece

import wdstream
from tests.tokenizer_files import build_spm
from wdstream.errors import TokenizerError
from wdstream.tokenizers import load_tokenizer
from wdstream.write.tokenpool import TokenPool


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, corpus_docs: list[str]) -> Path:
    return build_spm(tmp_path_factory.mktemp("spm"), corpus_docs)


def _reference(path: Path) -> sentencepiece.SentencePieceProcessor:
    return sentencepiece.SentencePieceProcessor(model_file=str(path))


def test_ids_equal_the_library_and_specials_from_the_model(
    model: Path, corpus_docs: list[str]
) -> None:
    tok = load_tokenizer(str(model))
    ref = _reference(model)
    assert tok.backend == "sentencepiece" and tok.n_vocab == ref.get_piece_size() == 1000
    assert (tok.bos_id, tok.eos_id) == (ref.bos_id(), ref.eos_id()) == (1, 2)
    texts = corpus_docs[:40] + ["", "ünïcödé 日本語 🙂 </s> <s>"]
    for text in texts:
        ids = tok.encode(text)
        assert ids.dtype == np.uint32 and ids.tolist() == ref.encode(text, out_type=int)
    assert tok.eos_id not in tok.encode("a </s> b").tolist()  # control-symbol text stays text
    assert tok.encode_ordinary_batch(texts, num_threads=2) == [
        ref.encode(t, out_type=int) for t in texts
    ]
    assert tok.decode(tok.encode("doc 3: ünï 🙂")) == ref.decode(ref.encode("doc 3: ünï 🙂"))


def test_model_without_bos_and_eos(tmp_path: Path, corpus_docs: list[str]) -> None:
    path = build_spm(tmp_path / "nobos", corpus_docs, bos_id=-1, eos_id=-1)
    tok = load_tokenizer(str(path))
    assert tok.bos_id is None and tok.eos_id is None
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "hello"}) + "\n")
    with pytest.raises(ValueError, match="has no EOS token; pass eos=False"):
        wdstream.pack(str(src), str(tmp_path / "ds"), tokenizer=str(path), workers=0)


def test_pack_round_trip_in_a_worker_process(
    tmp_path: Path, model: Path, corpus_docs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(TokenPool, "inline_while_starting", False)  # the worker encodes
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus_docs))
    out = tmp_path / "ds"
    result = wdstream.pack(
        str(src), str(out), tokenizer=str(model), seq_len=32, workers=1, pool="processes",
        bos=True, batch_bytes=4096, progress=False,
    )  # fmt: skip
    assert result.pool == "processes"
    info = result.index.tokenizer
    assert info["backend"] == "sentencepiece" and info["n_vocab"] == 1000
    assert info["ranks_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert (result.index.bos_id, result.index.eos_id, result.index.dtype) == (1, 2, "uint16")
    ref = _reference(model)
    got = [d.tolist() for d in wdstream.documents(str(out))]
    assert got == [[1, *ref.encode(t, out_type=int), 2] for t in corpus_docs if t]


def test_changed_file_refused_when_loaded_again(tmp_path: Path, corpus_docs: list[str]) -> None:
    path = build_spm(tmp_path / "a", corpus_docs)
    recipe = pickle.dumps(load_tokenizer(str(path)))
    assert len(recipe) < 1000  # the path and hash, never the model
    path.write_bytes(build_spm(tmp_path / "b", corpus_docs, vocab_size=900).read_bytes())
    with pytest.raises(TokenizerError, match=r"spm\.model changed since it was loaded"):
        pickle.loads(recipe)


def test_bad_file_names_it_and_the_library(tmp_path: Path) -> None:
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match=r"SentencePiece model .*bad\.model"):
        load_tokenizer(str(bad))
    with pytest.raises(TokenizerError, match=r"SentencePiece model .*gone\.model"):
        load_tokenizer(str(tmp_path / "gone.model"))
