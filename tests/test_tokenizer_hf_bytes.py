"""A byte-level BPE's chat offsets from its tokens' bytes (wdstream.tokenizers.hf_bytes): the
same ids and spans as ``tokenizers``' own offsets, used only where they are exactly that, and
``tokenizers``' offsets wherever they are not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    from tokenizers import normalizers, pre_tokenizers, processors

    tok = tokenizers.Tokenizer.from_file(str(path))
    if change == "trim_offsets":
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
    elif change == "nfc":
        tok.normalizer = normalizers.NFC()
    elif change == "rstrip":
        tok.add_special_tokens([tokenizers.AddedToken("<|tool|>", rstrip=True, special=True)])
    elif change == "rstrip_spaces":  # and a run of spaces as an added token (CodeGen's)
        tok.add_special_tokens([tokenizers.AddedToken("<|tool|>", rstrip=True, special=True)])
        tok.add_tokens([tokenizers.AddedToken("  ", normalized=False)])
    elif change in ("prefix_space", "metaspace"):  # a space added, made up by an rstrip
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=change == "prefix_space")
        tok.pre_tokenizer = byte_level
        if change == "metaspace":
            meta = pre_tokenizers.Metaspace(" ", prepend_scheme="always", split=False)
            tok.pre_tokenizer = pre_tokenizers.Sequence([meta, byte_level])
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


ADDS_SPACE = ("prefix_space", "metaspace")
# Each added token's text then a space it takes, then text the pre-tokenizer puts a space
# before: the ids' bytes are the text's, but tokenizers puts the space in the added token.
SPACE_TAKEN = "<|tool|> b<|im_start|> user<|tool|> x y"


@pytest.mark.parametrize("change", ADDS_SPACE)
def test_a_pre_tokenizer_that_adds_a_space_is_read_from_offsets(
    hf_path: Path, tmp_path: Path, change: str
) -> None:
    tok = _changed(hf_path, tmp_path / change, change)
    want_ids, want_spans = _own(tok, SPACE_TAKEN)
    assert want_spans[:2] == [[0, 9], [9, 10]]  # "<|tool|> " and "b" (not " b")
    ids, spans = tok.encode_chat(SPACE_TAKEN)
    assert (ids.tolist(), spans.tolist()) == (want_ids, want_spans)
    assert tok._byte_offsets is None


def test_a_space_taken_by_an_added_token_masks_as_transformers_does(
    hf_path: Path, tmp_path: Path
) -> None:
    """The same through a whole conversation: a generation region that starts with the
    space an rstrip token takes supervises that token in transformers, so here too."""
    from transformers import PreTrainedTokenizerFast

    from wdstream.chat import ChatEncoder, ChatTemplate

    template = (
        "{% for m in messages %}<|tool|> {{ m.role }}:{% if m.role == 'assistant' %}"
        "<|tool|>{% generation %} {{ m.content }}<|im_end|>{% endgeneration %}"
        "{% else %} {{ m.content }}<|im_end|>{% endif %}{% endfor %}"
    )
    special = {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}
    tok = _changed(hf_path, tmp_path / "prefix", "prefix_space")
    messages = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "yes"}]
    ref = PreTrainedTokenizerFast(tokenizer_file=tok.path, **special)
    want: Any = ref.apply_chat_template(
        messages, chat_template=template, tokenize=True, return_dict=True,
        return_assistant_tokens_mask=True,
    )  # fmt: skip
    got = ChatEncoder(ChatTemplate(template, special), tok).encode(messages)
    assert got.ids.tolist() == want["input_ids"]
    assert got.supervised.astype(int).tolist() == want["assistant_masks"]


def test_spaces_an_added_token_strips_and_the_next_token_has(hf_path: Path, tmp_path: Path) -> None:
    """tokenizers gives an rstrip token the spaces after it even where the next token, an
    added run of spaces, has them too: overlapping offsets, the bytes joined the text's."""
    tok = _changed(hf_path, tmp_path / "rstrip_spaces", "rstrip_spaces")
    text = "<|im_start|>tool\n<|tool|>  x<|im_end|>"
    want_ids, want_spans = _own(tok, text)
    assert want_spans[-4:-2] == [[17, 27], [25, 27]]
    ids, spans = tok.encode_chat(text)
    assert (ids.tolist(), spans.tolist()) == (want_ids, want_spans)


# Pieces of adversarial chat text: added tokens (one that strips, one of spaces), characters
# of 2-4 bytes, combining marks (NFC and not), ZWJ emoji, controls, line separators.
PIECES = ["<|im_start|>", "<|im_end|>", "<|tool|>", "<|tool|>  ", "  ", " ", "\n", "\r\n", "\t", "\u200b",
          "\u2028", "\u3000", "e", "\u0301", "\u0323", "é", "日本", "🙂", "\u200d", "\U0001f9d1", "12",
          "Ġ", "ÄŁ", "\x00", "\ufeff", "x", "\u1100\u1161"]  # fmt: skip


@pytest.fixture(scope="module")
def changed_toks(hf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[HFTokenizer]:
    folder = tmp_path_factory.mktemp("p")
    return [_changed(hf_path, folder / change, change) for change in ("rstrip_spaces", "nfc")]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES) | st.text(max_size=2), max_size=16).map("".join))
def test_any_text_gets_tokenizers_ids_and_offsets(
    changed_toks: list[HFTokenizer], text: str
) -> None:
    """The property the fast path promises, on random text, for a tokenizer with an added
    token that strips and an NFC one: ids and spans are tokenizers'. Most texts take the
    fast path, so a wrong byte-to-character step or a missed fallback fails."""
    for tok in changed_toks:
        ids, spans = tok.encode_chat(text)
        assert (ids.tolist(), spans.tolist()) == _own(tok, text)
