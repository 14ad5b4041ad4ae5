"""Tokenizer.encode_chat: ids with the special tokens a template writes recognised, nothing
added, and each token's character span, checked against each library's own answer (tiktoken,
transformers' tokenizer, SentencePiece's pieces); ordinary encoding unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sentencepiece

from tests.chat_support import BOS, build_chat_hf, build_chat_spm
from wdstream.tokenizers import load_tokenizer
from wdstream.tokenizers.base import char_spans

TEXT = (
    "<|begin_of_text|><|im_start|>user\nhéllo 日本語🙂 x</s><|im_end|>\n"
    "<|im_start|>assistant\n  two  spaces\tand tabs<|endoftext|><|im_end|>\n<s>end"
)


def test_char_spans_from_byte_spans() -> None:
    text = "aé日🙂"  # 1, 2, 3 and 4 bytes
    # byte spans: "a", half of "é", its other half with "日", a whole emoji, an empty token
    got = char_spans(text, np.array([0, 1, 2, 6, 10]), np.array([1, 2, 6, 10, 10]))
    assert got.tolist() == [[0, 1], [1, 2], [1, 3], [3, 4], [4, 4]]
    ascii_spans = char_spans("abc", np.array([0, 1]), np.array([1, 3]))
    assert ascii_spans.tolist() == [[0, 1], [1, 3]]


@pytest.mark.parametrize("backend", ["tiktoken", "bpe-openai"])
def test_tiktoken_ids_and_spans(backend: str) -> None:
    tok = load_tokenizer("cl100k_base", backend)
    enc = tok._enc  # type: ignore[attr-defined]
    ids, spans = tok.encode_chat(TEXT)
    assert ids.tolist() == enc.encode(TEXT, allowed_special="all")
    assert enc.eot_token in ids.tolist()  # <|endoftext|> is the special token, not text
    _, starts = enc.decode_with_offsets(ids.tolist())
    assert spans[:, 0].tolist() == starts
    # A token's span ends where the characters holding its last byte end.
    for k, token in enumerate(ids.tolist()):
        head = enc.decode_bytes(ids[: k + 1].tolist())
        whole_chars = head.decode("utf-8", errors="ignore")
        cut = len(whole_chars) + (len(head) != len(whole_chars.encode("utf-8")))
        assert spans[k, 1] == cut, (k, token)
    assert tok.encode("<|endoftext|>").tolist() != [enc.eot_token]  # documents: still text


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_hf(tmp_path_factory.mktemp("hf"))


def test_hf_ids_and_offsets_equal_transformers(hf_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast  # here, not at collection (~0.7 CPU-s)

    tok = load_tokenizer(str(hf_path))
    ref = PreTrainedTokenizerFast(tokenizer_file=str(hf_path), bos_token=BOS, eos_token="</s>")
    want = ref(TEXT, add_special_tokens=False, return_offsets_mapping=True)
    ids, spans = tok.encode_chat(TEXT)
    assert ids.tolist() == want["input_ids"]
    assert [tuple(s) for s in spans.tolist()] == [tuple(o) for o in want["offset_mapping"]]
    assert ref.convert_tokens_to_ids("<|im_end|>") in ids.tolist()
    # Documents still encode special-token text as text, after encode_chat as before.
    assert ref.convert_tokens_to_ids("<|im_end|>") not in tok.encode(TEXT).tolist()
    assert tok.decode(tok.encode(TEXT)) == TEXT


def test_sentencepiece_ids_and_spans(tmp_path: Path) -> None:
    path = build_chat_spm(tmp_path)
    tok = load_tokenizer(str(path))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    ids, spans = tok.encode_chat(TEXT)
    got = ids.tolist()
    assert got.count(sp.bos_id()) == 1 and got.count(sp.eos_id()) == 1  # <s>, </s> as ids
    for marker in ("<|begin_of_text|>", "<|im_start|>", "<|im_end|>"):
        assert sp.piece_to_id(marker) in got  # user-defined symbols, SentencePiece's own
    # Between the control pieces, the ids are SentencePiece's own for that text.
    cut = TEXT.index("</s>")
    assert got[: got.index(sp.eos_id())] == sp.encode(TEXT[:cut])
    assert got[got.index(sp.bos_id()) + 1 :] == sp.encode("end")
    # Each token's span holds that piece's text (whitespace as SentencePiece normalises it).
    assert (np.diff(spans[:, 0]) >= 0).all() and spans[-1, 1] == len(TEXT)
    for token, (start, end) in zip(got, spans.tolist(), strict=True):
        piece = sp.id_to_piece(token)
        if sp.is_byte(token) or start == end:
            continue
        assert " ".join(TEXT[start:end].split()) == piece.replace("\u2581", " ").strip()
    assert sp.bos_id() not in tok.encode(TEXT).tolist()  # documents: still text
