"""A byte-level BPE's chat offsets from its tokens' bytes (wdstream.tokenizers.hf_bytes): the
same ids and spans as ``tokenizers``' own offsets, used only where they are exactly that, and
``tokenizers``' offsets wherever they are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chat_support import build_chat_hf
from wdstream.tokenizers import load_tokenizer
from wdstream.tokenizers.hf import HFTokenizer

TEXTS = [
    "<|im_start|>user\nhéllo 日本語🙂 x</s><|im_end|>\n<|im_start|>assistant\n  two\tspaces",
    "e\u0301 (not NFC) ü 🙂🙂 \U0001f9d1\u200d\U0001f4bb<|im_end|>",  # split multi-byte chars
    " leading space, trailing newline\n\n",
    "",
]


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_hf(tmp_path_factory.mktemp("hf"))


def _own(tok: HFTokenizer, text: str) -> tuple[list[int], list[list[int]]]:
    """``tokenizers``' ids and offsets of chat text (special tokens recognised)."""
    with tok._special.set_to(False) as raw:
        enc = raw.encode(text, add_special_tokens=False)
    return enc.ids, [list(o) for o in enc.offsets]


def _changed(path: Path, folder: Path, change: str) -> HFTokenizer:
    """The tokenizer at ``path`` with one part changed, saved in ``folder``."""
    import tokenizers
    from tokenizers import normalizers, processors

    tok = tokenizers.Tokenizer.from_file(str(path))
    if change == "trim_offsets":
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
    elif change == "nfc":
        tok.normalizer = normalizers.NFC()
    elif change == "rstrip":
        tok.add_special_tokens([tokenizers.AddedToken("<|tool|>", rstrip=True, special=True)])
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    loaded = load_tokenizer(str(folder / "tokenizer.json"))
    assert isinstance(loaded, HFTokenizer)
    return loaded


def test_spans_from_bytes_equal_tokenizers_offsets(hf_path: Path) -> None:
    tok = load_tokenizer(str(hf_path))
    assert isinstance(tok, HFTokenizer)
    offsets = tok._byte_offsets
    assert offsets is not None  # a byte-level BPE whose post-processor adds nothing here
    for text in TEXTS:
        want_ids, want_spans = _own(tok, text)
        assert offsets.spans(text, want_ids, tok._native(text)[0]) is not None  # no fallback
        ids, spans = tok.encode_chat(text)
        assert (ids.tolist(), spans.tolist()) == (want_ids, want_spans), text


@pytest.mark.parametrize("change", ["trim_offsets", "nfc", "rstrip"])
def test_other_offsets_are_tokenizers_own(hf_path: Path, tmp_path: Path, change: str) -> None:
    """A post-processor that trims offsets is never read from bytes; non-NFC text under an
    NFC normalizer, or an added token that takes the spaces after it, falls back per text."""
    tok = _changed(hf_path, tmp_path / change, change)
    assert (tok._byte_offsets is None) == (change == "trim_offsets")
    texts = [*TEXTS, "<|im_start|>tool\n<|tool|>   x<|im_end|>"]
    for text in texts:
        ids, spans = tok.encode_chat(text)
        assert (ids.tolist(), spans.tolist()) == _own(tok, text), text
    if change == "trim_offsets":  # " b" without its space
        assert _own(tok, " a b") == (tok.encode(" a b").tolist(), [[0, 2], [3, 4]])
    elif change == "nfc":
        assert tok._byte_offsets is not None
        text = TEXTS[1]
        assert tok._byte_offsets.spans(text, _own(tok, text)[0], tok._native(text)[0]) is None
    else:
        assert tok._byte_offsets is not None
        text = texts[-1]
        assert tok._byte_offsets.spans(text, _own(tok, text)[0], tok._native(text)[0]) is None
