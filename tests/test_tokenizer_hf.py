"""Hugging Face tokenizer.json files: ids equal tokenizers' own, BOS/EOS from the tokenizer's
configuration, pack -> read round trips through worker processes, the file hash recorded
and a changed file refused; the missing package names the extra."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tokenizers

import wdstream
from tests.tokenizer_files import build_hf_bpe
from wdstream import Loader, StateMismatchError
from wdstream.errors import TokenizerError
from wdstream.tokenizers import load_tokenizer
from wdstream.write.tokenpool import TokenPool

SEQ, B = 16, 2


def _reference(path: Path) -> tokenizers.Tokenizer:
    """The library itself, documents encoded as wdstream does (specials as plain text)."""
    ref = tokenizers.Tokenizer.from_file(str(path))
    ref.encode_special_tokens = True
    return ref


def _ref_ids(ref: tokenizers.Tokenizer, text: str) -> list[int]:
    return list(ref.encode(text, add_special_tokens=False).ids)


@pytest.fixture(scope="module")
def hf_file(tmp_path_factory: pytest.TempPathFactory, corpus_docs: list[str]) -> Path:
    return build_hf_bpe(tmp_path_factory.mktemp("hf"), corpus_docs)


def test_ids_equal_the_library_and_decode_round_trips(
    hf_file: Path, corpus_docs: list[str]
) -> None:
    tok = load_tokenizer(str(hf_file))
    ref = _reference(hf_file)
    assert tok.backend == "tokenizers" and tok.n_vocab == ref.get_vocab_size()
    for text in corpus_docs[:40] + ["", "ünïcödé 日本語 🙂\n\tcode()"]:
        ids = tok.encode(text)
        assert ids.dtype == np.uint32 and ids.tolist() == _ref_ids(ref, text)
        assert tok.decode(ids) == text
    batch = tok.encode_ordinary_batch(corpus_docs[:40], num_threads=2)
    assert batch == [_ref_ids(ref, t) for t in corpus_docs[:40]]
    assert tok.encode_ordinary_batch(corpus_docs[:5], num_threads=1) == batch[:5]


def test_special_token_text_in_a_document_stays_text(hf_file: Path) -> None:
    tok = load_tokenizer(str(hf_file))
    plain = tokenizers.Tokenizer.from_file(str(hf_file))
    assert (
        plain.encode("a</s>b", add_special_tokens=False).ids.count(2) == 1
    )  # the library's default
    ids = tok.encode("a</s>b").tolist()
    assert tok.eos_id == 2 and 2 not in ids and tok.decode(ids) == "a</s>b"


def test_bos_eos_from_post_processor_then_config(tmp_path: Path, corpus_docs: list[str]) -> None:
    # No tokenizer_config.json: the post-processor's "<s> $A </s>".
    bare = load_tokenizer(str(build_hf_bpe(tmp_path / "bare", corpus_docs[:30])))
    assert (bare.bos_id, bare.eos_id) == (1, 2)
    # tokenizer_config.json wins, strings or {"content": ...}; null means none.
    cfg = {"bos_token": None, "eos_token": {"content": "<pad>", "special": True}}
    folder = tmp_path / "cfg"
    path = build_hf_bpe(folder, corpus_docs[:30], config=cfg)
    tok = load_tokenizer(str(folder))  # a folder holding tokenizer.json works too
    assert (tok.bos_id, tok.eos_id) == (None, 0)
    cfg_sha = hashlib.sha256((folder / "tokenizer_config.json").read_bytes()).hexdigest()
    assert tok.info()["config_sha256"] == cfg_sha
    assert load_tokenizer(str(path)).eos_id == 0


def _jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


@pytest.mark.parametrize("pool", ["processes", "threads"])
def test_pack_round_trip_through_workers(
    tmp_path: Path,
    hf_file: Path,
    corpus_docs: list[str],
    pool: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(TokenPool, "inline_while_starting", False)  # the workers encode
    src = _jsonl(tmp_path / "in.jsonl", corpus_docs)
    out = tmp_path / "ds"
    result = wdstream.pack(
        str(src), str(out), tokenizer=str(hf_file), seq_len=64, workers=1, pool=pool, bos=True,
        batch_bytes=4096, progress=False,
    )  # fmt: skip
    assert result.pool == pool
    info = result.index.tokenizer
    assert info["backend"] == "tokenizers" and info["name"] == str(hf_file)
    assert info["ranks_sha256"] == hashlib.sha256(hf_file.read_bytes()).hexdigest()
    assert (result.index.bos_id, result.index.eos_id) == (1, 2)
    ref = _reference(hf_file)
    got = [d.tolist() for d in wdstream.documents(str(out))]
    assert got == [[1, *_ref_ids(ref, t), 2] for t in corpus_docs if t]


def test_raw_text_reader_in_torch_workers_and_state_pins_the_file(
    tmp_path: Path, corpus_docs: list[str]
) -> None:
    folder = tmp_path / "tok"
    path = build_hf_bpe(folder, corpus_docs)
    for i in range(2):
        _jsonl(tmp_path / f"p-{i}.jsonl", corpus_docs[i * 60 : (i + 1) * 60])
    src = f"{tmp_path}/p-{{0..1}}.jsonl"
    kw = dict(tokenizer=str(path), seq_len=SEQ, batch_size=B, shuffle=False, streams=1, epochs=1)
    # One torch worker process: the tokenizer crosses as its recipe and reloads there.
    rows = np.concatenate(
        [
            np.concatenate([b["input_ids"].numpy(), b["labels"].numpy()[:, -1:]], axis=1)
            for b in Loader(src, num_workers=1, **kw)
        ]
    )
    ref = _reference(path)
    stream = np.array([i for t in corpus_docs[:120] if t for i in [*_ref_ids(ref, t), 2]])
    n = len(stream) // (B * (SEQ + 1)) * B
    assert rows.shape == (n, SEQ + 1)
    assert np.array_equal(rows, stream[: n * (SEQ + 1)].reshape(n, SEQ + 1))

    state = Loader(src, num_workers=0, **kw).state_dict()
    data = json.loads(path.read_text())
    data["added_tokens"][0]["content"] = "<PAD>"  # same vocabulary size, other bytes
    path.write_text(json.dumps(data))
    again = Loader(src, num_workers=0, **kw)
    with pytest.raises(StateMismatchError, match="tokenizer"):
        again.load_state_dict(state)


def test_changed_file_refused_when_loaded_again(tmp_path: Path, corpus_docs: list[str]) -> None:
    path = build_hf_bpe(tmp_path / "tok", corpus_docs[:30])
    tok = load_tokenizer(str(path))
    recipe = pickle.dumps(tok)
    assert len(recipe) < 1000  # the path and hashes, never the vocabulary
    assert pickle.loads(recipe).encode("doc 7").tolist() == tok.encode("doc 7").tolist()
    path.write_bytes(path.read_bytes().replace(b'"<pad>"', b'"<PAD>"'))
    with pytest.raises(TokenizerError, match="changed since it was loaded"):
        pickle.loads(recipe)
    (tmp_path / "tok" / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    fresh = pickle.dumps(load_tokenizer(str(path)))
    (tmp_path / "tok" / "tokenizer_config.json").write_text('{"eos_token": "<s>"}')
    with pytest.raises(TokenizerError, match="tokenizer_config.json changed"):
        pickle.loads(fresh)


def test_bad_file_names_it_and_the_library(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"Hugging Face tokenizer file .*missing\.json"):
        load_tokenizer(str(tmp_path / "missing.json"))
    with pytest.raises(TokenizerError, match="must hold tokenizer.json .* or tokenizer.model"):
        load_tokenizer(str(tmp_path))  # a folder with neither
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(TokenizerError, match="Hugging Face tokenizer file"):
        load_tokenizer(str(bad))


@pytest.mark.parametrize(
    "spec,hidden", [("x/tokenizer.json", "tokenizers"), ("x/m.model", "sentencepiece")]
)
def test_missing_package_names_the_extra(spec: str, hidden: str) -> None:
    code = (
        f"import sys; sys.modules[{hidden!r}] = None\n"
        "import wdstream\n"
        "from wdstream.tokenizers import load_tokenizer\n"
        "try:\n"
        f"    load_tokenizer({spec!r})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "load_tokenizer('cl100k_base')\n"  # the base install still tokenises
        "print('base ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'wdstream[hf]'" in out.stdout and hidden in out.stdout
    assert "base ok" in out.stdout


def test_decoding_a_dataset_refuses_a_changed_tokenizer_file(
    tmp_path: Path, corpus_docs: list[str]
) -> None:
    hf = build_hf_bpe(tmp_path / "tok", corpus_docs[:20])
    src = _jsonl(tmp_path / "in.jsonl", corpus_docs[:20])
    out = tmp_path / "ds"
    wdstream.pack(str(src), str(out), tokenizer=str(hf), seq_len=64, workers=0, progress=False)
    assert wdstream.explain(str(out), 0, batch_size=1, text=True).rows[0].pieces[0].text
    spec = json.loads(hf.read_text())
    spec["added_tokens"][0]["content"] = "<changed>"
    hf.write_text(json.dumps(spec))
    with pytest.raises(TokenizerError, match="recorded in index.json"):
        wdstream.explain(str(out), 0, batch_size=1, text=True)
    from click.testing import CliRunner

    from wdstream.cli import main

    res = CliRunner().invoke(main, ["inspect", str(out)])
    assert "recorded in index.json" in res.output, res.output


def test_one_tokenizer_encodes_documents_and_chat_interleaved_and_concurrently(
    hf_file: Path, corpus_docs: list[str]
) -> None:
    """One loaded tokenizer serves documents (special-token text as text) and chat (special
    tokens recognised), however the calls interleave, from several threads too: each call's
    ids equal those of a library tokenizer fixed to its setting."""
    import threading

    tok = load_tokenizer(str(hf_file))
    as_text = _reference(hf_file)
    special = tokenizers.Tokenizer.from_file(str(hf_file))  # the library's default: recognised
    texts = [f"<s>{t[:80]}</s>" for t in corpus_docs[:30]]
    want_doc = [_ref_ids(as_text, t) for t in texts]
    want_chat = [_ref_ids(special, t) for t in texts]
    assert want_doc != want_chat  # the two settings differ on these texts
    for i, t in enumerate(texts):  # interleaved in one thread
        assert tok.encode(t).tolist() == want_doc[i]
        assert tok.encode_chat(t)[0].tolist() == want_chat[i]
    errors: list[str] = []

    def run(chat: bool) -> None:
        for _ in range(20):
            for i, t in enumerate(texts):
                got = tok.encode_chat(t)[0].tolist() if chat else tok.encode(t).tolist()
                if got != (want_chat if chat else want_doc)[i]:
                    errors.append(f"{'chat' if chat else 'doc'} {i}")
            if not chat and tok.encode_ordinary_batch(texts, num_threads=2) != want_doc:
                errors.append("batch")

    threads = [threading.Thread(target=run, args=(k % 2 == 1,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
