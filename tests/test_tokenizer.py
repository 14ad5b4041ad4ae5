"""Offline tokenizer resolution and backend agreement."""

from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import wdstream.tokenizers.tiktoken as T
from wdstream.errors import TokenizerError
from wdstream.tokenizers import load_tokenizer
from wdstream.tokenizers.tiktoken import CHECK_TEXT

CL100K_FILE_SHA = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def test_cl100k_offline_and_hash() -> None:
    tok = load_tokenizer("cl100k_base", "tiktoken")
    assert tok.name == "cl100k_base"
    assert tok.n_vocab == 100277 and tok.eos_id == 100257
    # Canonical hash equals the hash of the rank-sorted .tiktoken file (recomputed here from
    # the ranks: ranks_sha256 takes the file's hash for files known to be canonical).
    assert tok.ranks_sha256 == CL100K_FILE_SHA
    assert T._canonical_ranks_sha256(tok._enc._mergeable_ranks) == CL100K_FILE_SHA
    assert T._CANONICAL_FILES == {CL100K_FILE_SHA}
    assert tok.decode(tok.encode("hello world")) == "hello world"


def test_o200k_offline() -> None:
    tok = load_tokenizer("o200k_base", "tiktoken")
    assert tok.name == "o200k_base" and tok.eos_id == 199999 and tok.n_vocab == 200019
    assert tok.decode(tok.encode(CHECK_TEXT)) == CHECK_TEXT


def test_tiktoken_file_path(tmp_path: Path) -> None:
    import tiktoken_ext

    src = Path(tiktoken_ext.__path__[0]) / "data" / "cl100k_base.tiktoken"
    path = tmp_path / "myvocab.tiktoken"
    shutil.copy(src, path)
    tok = load_tokenizer(str(path))
    ref = load_tokenizer("cl100k_base", "tiktoken")
    assert tok.name == "myvocab" and tok.backend == "tiktoken"
    assert tok.eos_id == 100256  # appended after the ranks
    assert tok.ranks_sha256 == ref.ranks_sha256
    assert np.array_equal(tok.encode(CHECK_TEXT), ref.encode(CHECK_TEXT))


def test_non_canonical_tiktoken_file_hashes_its_ranks(tmp_path: Path) -> None:
    import tiktoken_ext

    src = Path(tiktoken_ext.__path__[0]) / "data" / "cl100k_base.tiktoken"
    lines = src.read_bytes().splitlines(keepends=True)
    path = tmp_path / "reversed.tiktoken"
    path.write_bytes(b"".join(reversed(lines)))  # same ranks, other bytes
    tok = load_tokenizer(str(path), "tiktoken")
    assert hashlib.sha256(path.read_bytes()).hexdigest() != CL100K_FILE_SHA
    assert tok.ranks_sha256 == CL100K_FILE_SHA  # the canonical hash, not the file's


def test_unknown_name_lists_what_was_tried(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="nosuch_enc") as info:
        load_tokenizer("nosuch_enc")
    assert "tiktoken.get_encoding('nosuch_enc')" in str(info.value)
    with pytest.raises(TokenizerError, match="tiktoken file"):
        load_tokenizer(str(tmp_path / "missing.tiktoken"))


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_bpe_openai_matches_tiktoken(name: str, corpus_docs: list[str]) -> None:
    fast = load_tokenizer(name, "bpe-openai")
    ref = load_tokenizer(name, "tiktoken")
    assert fast.backend == "bpe-openai" and fast.info()["backend"] == "bpe-openai"
    long_doc = "\n".join(corpus_docs) * 15  # > 1M characters: the raw binding takes it
    assert len(long_doc) > 1_000_000
    for text in [*corpus_docs, CHECK_TEXT, long_doc, "", "<|endoftext|>"]:
        assert np.array_equal(fast.encode(text), ref.encode(text))


def test_backend_fallback_on_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    real = T.TiktokenTokenizer.encode

    def broken(self: T.TiktokenTokenizer, text: str) -> np.ndarray:
        ids = real(self, text)
        return ids[::-1] if self.backend == "bpe-openai" else ids

    monkeypatch.setattr(T.TiktokenTokenizer, "encode", broken)
    with pytest.warns(UserWarning, match="differ"):
        tok = load_tokenizer("cl100k_base", "bpe-openai")
    assert tok.backend == "tiktoken"
    with pytest.warns(UserWarning, match="differ"):
        assert load_tokenizer("cl100k_base", "auto").backend == "tiktoken"


def test_tokenizer_pickles_to_same_backend() -> None:
    tok = load_tokenizer("cl100k_base", "auto")
    again = pickle.loads(pickle.dumps(tok))
    assert again.backend == tok.backend and again.name == tok.name
    assert np.array_equal(again.encode(CHECK_TEXT), tok.encode(CHECK_TEXT))


def test_unknown_name_suggests_and_lists_offline_names() -> None:
    with pytest.raises(TokenizerError) as info:
        load_tokenizer("cl100k_bsae")
    msg = str(info.value)
    assert "tiktoken.get_encoding('cl100k_bsae')" in msg  # what was tried
    assert "Did you mean 'cl100k_base'?" in msg
    assert "Names that work offline: cl100k_base, o200k_base" in msg


@pytest.mark.parametrize(("bos", "eos"), [(None, 100257), (100258, 100257), (None, None)])
def test_bpe_worker_encoder_flat_ids_equal_tiktoken(bos: int | None, eos: int | None) -> None:
    """The process workers' bpe-openai path (ids gathered straight into one array) gives the
    tiktoken backend's flat ids and document lengths, BOS/EOS and empty documents included."""
    from wdstream.tokenizers.tiktoken import BpeEncoder
    from wdstream.write.tokenpool import encode_flat

    texts = [CHECK_TEXT, "", "x", CHECK_TEXT[::-1] * 3, "  \n\t naïve café 日本語 🙂"]
    reference = load_tokenizer("cl100k_base", "tiktoken")
    fast_ids, fast_lens = encode_flat(BpeEncoder("cl100k_base"), texts, bos, eos, "uint32")
    ids, lens = encode_flat(reference, texts, bos, eos, "uint32")
    assert fast_ids.dtype == np.uint32 and fast_lens.dtype == np.int64
    np.testing.assert_array_equal(fast_ids, ids)
    np.testing.assert_array_equal(fast_lens, lens)
    assert int(fast_lens.sum()) == len(fast_ids)
