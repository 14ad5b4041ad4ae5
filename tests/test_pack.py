"""pack: token conservation, determinism, shard limits, formats, readability by webdataset."""

from __future__ import annotations

import gzip
import io
import json
import random
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zstandard

import wdstream
from wdstream.format.index import DatasetIndex
from wdstream.format.sample import decode_sample
from wdstream.tokenizer import load_tokenizer
from wdstream.write.samples import ConcatPacker

TOK = "cl100k_base"


def expected_docs(texts: list[str], eos: bool = True, bos: bool = False) -> list[np.ndarray]:
    tok = load_tokenizer(TOK, "tiktoken")
    out = []
    for t in texts:
        if not t:
            continue
        ids = tok.encode(t).tolist()
        out.append(np.array(([tok.eos_id] if bos else []) + ids + ([tok.eos_id] if eos else [])))
    return out


def assert_same_docs(root: Path, texts: list[str], **kw: bool) -> None:
    got = list(wdstream.documents(str(root)))
    want = expected_docs(texts, **kw)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(g, w), f"document {i} differs"


def files_of(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_token_conservation_and_index(
    tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs)
    res = wdstream.pack([str(src)], str(tmp_path / "out"), seq_len=63, shard_size="16KB", workers=0)
    idx = res.index
    assert isinstance(idx, DatasetIndex) and len(idx.shards) > 5
    assert idx.mode == "concat" and idx.sample_tokens == 64 and idx.dtype == "uint32"
    assert idx.tokenizer["name"] == TOK and idx.tokenizer["n_vocab"] == 100277
    assert idx.tokenizer["backend"] in ("tiktoken", "bpe-openai")
    assert idx.stats["documents"] == len(corpus_docs) == idx.total_documents
    assert_same_docs(tmp_path / "out", corpus_docs)
    # Every sample but the last has exactly seq_len + 1 tokens; names are global keys.
    on_disk = DatasetIndex.from_json((tmp_path / "out" / "index.json").read_text())
    assert on_disk == idx
    key = 0
    sizes = []
    for shard in idx.shards:
        with tarfile.open(tmp_path / "out" / shard.name) as tf:
            for m in tf.getmembers():
                assert m.name == f"{key:012d}.mp"
                key += 1
                sizes.append(len(decode_sample(tf.extractfile(m).read()).tokens))  # type: ignore[union-attr]
    assert all(s == 64 for s in sizes[:-1]) and 0 < sizes[-1] <= 64
    assert not (tmp_path / "out" / ".wdstream-pack.json").exists()


@pytest.mark.parametrize("shard_size,shard_samples", [("10KB", None), ("1GB", 7), ("3KB", None)])
def test_shard_limits(
    tmp_path: Path,
    corpus_docs: list[str],
    write_jsonl: Callable[..., Path],
    shard_size: str,
    shard_samples: int | None,
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:60])
    out = tmp_path / "out"
    idx = wdstream.pack(
        [str(src)],
        str(out),
        seq_len=255,
        shard_size=shard_size,
        shard_samples=shard_samples,
        workers=0,
    ).index
    limit = wdstream.write.pack.parse_size(shard_size)
    for s in idx.shards:
        assert (out / s.name).stat().st_size == s.bytes
        if shard_samples:
            assert s.samples <= shard_samples
        if s.samples > 1:
            assert s.bytes <= limit
    if shard_size == "3KB":  # one 256-token uint32 sample (~1.5 KB tar member) exceeds nothing;
        assert all(s.samples >= 1 for s in idx.shards)
    assert_same_docs(out, corpus_docs[:60])


def test_single_sample_larger_than_shard(tmp_path: Path, write_jsonl: Callable[..., Path]) -> None:
    texts = ["word " * 3000, "small"]
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    idx = wdstream.pack(
        [str(src)], str(tmp_path / "out"), mode="docs", shard_size="4KB", workers=0
    ).index
    assert idx.shards[0].samples == 1 and idx.shards[0].bytes > 4000
    assert idx.sample_tokens is None and idx.mode == "docs"
    assert_same_docs(tmp_path / "out", texts)


def test_determinism_across_workers(
    tmp_path: Path,
    corpus_docs: list[str],
    write_jsonl: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from wdstream.write.tokenpool import TokenPool

    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs)
    outs = []
    configs = [(0, "auto", True), (1, "threads", True), (2, "threads", True)]
    configs += [(2, "processes", True), (2, "processes", False), (1, "processes", False)]
    for i, (workers, pool, inline_first) in enumerate(configs):
        # inline_first=False: every batch goes through the process pool, none is encoded
        # in this process while the workers start.
        monkeypatch.setattr(TokenPool, "inline_while_starting", inline_first)
        out = tmp_path / f"out{i}"
        res = wdstream.pack(
            [str(src)], str(out), seq_len=100, shard_size="20KB", workers=workers, pool=pool,
            backend="tiktoken", batch_bytes=4096,
        )  # fmt: skip
        assert res.pool == ("inline" if workers == 0 else pool)
        outs.append(files_of(out))
    assert all(o == outs[0] for o in outs[1:])
    assert len(outs[0]) > 6


def test_backends_give_identical_shards(
    tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs)
    a = wdstream.pack(
        [str(src)],
        str(tmp_path / "a"),
        seq_len=100,
        shard_size="20KB",
        workers=0,
        backend="tiktoken",
    )
    b = wdstream.pack(
        [str(src)],
        str(tmp_path / "b"),
        seq_len=100,
        shard_size="20KB",
        workers=0,
        backend="bpe-openai",
    )
    assert b.index.tokenizer["backend"] == "bpe-openai"
    fa, fb = files_of(tmp_path / "a"), files_of(tmp_path / "b")
    assert {k: v for k, v in fa.items() if k != "index.json"} == {
        k: v for k, v in fb.items() if k != "index.json"
    }
    assert a.index.shards == b.index.shards


def test_webdataset_and_tarfile_read_shards(
    tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]
) -> None:
    import webdataset as wds

    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:40])
    out = tmp_path / "out"
    idx = wdstream.pack([str(src)], str(out), seq_len=127, shard_size="16KB", workers=0).index
    url = f"{out}/data-{{000000..{len(idx.shards) - 1:06d}}}.tar"
    keys, tokens = [], []
    for s in wds.WebDataset(url, shardshuffle=False).decode(wdstream.wds_decoder):
        keys.append(s["__key__"])
        tokens.append(s["mp"]["input_ids"])
    assert keys == [f"{k:012d}" for k in range(idx.total_samples)]
    assert int(sum(len(t) for t in tokens)) == idx.total_tokens
    with tarfile.open(out / idx.shards[0].name) as tf:
        assert len(tf.getnames()) == idx.shards[0].samples


def test_input_formats(tmp_path: Path, corpus_docs: list[str]) -> None:
    docs = corpus_docs[:30]
    d = tmp_path / "in"
    (d / "sub").mkdir(parents=True)
    lines = [json.dumps({"a": {"body": t}}) + "\n" for t in docs]
    (d / "part-000.jsonl").write_text("".join(lines[:10]))
    with gzip.open(d / "part-001.jsonl.gz", "wt") as f:
        f.write("".join(lines[10:20]))
    (d / "sub" / "part-002.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress("".join(lines[20:]).encode())
    )
    (d / "notes.md").write_text("ignored: not an input suffix")
    # A directory, a brace pattern and a glob all expand to the same sorted file list.
    for i, pattern in enumerate(
        [
            str(d),
            str(d) + "/{part-000.jsonl,part-001.jsonl.gz,sub/part-002.jsonl.zst}",
            str(d) + "/**/part-*",
        ]
    ):
        out = tmp_path / f"out{i}"
        res = wdstream.pack(
            [pattern], str(out), text_key="a.body", seq_len=50, shard_size="8KB", workers=0
        )
        assert res.index.stats["input_files"] == 3
        assert_same_docs(out, docs)


def test_text_files_and_lines(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("first file\nsecond line\n")
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "c.txt").write_text("third\n\nfourth")
    out = tmp_path / "out"
    idx = wdstream.pack([str(tmp_path / "*.txt")], str(out), mode="docs", workers=0).index
    assert_same_docs(out, ["first file\nsecond line\n", "third\n\nfourth"])
    assert idx.stats["empty_documents_skipped"] == 1
    wdstream.pack(
        [str(tmp_path / "*.txt")], str(out), lines=True, overwrite=True, seq_len=7, workers=0
    )
    assert_same_docs(out, ["first file", "second line", "third", "fourth"])


def test_bos_no_eos_and_o200k_uint32(tmp_path: Path, write_jsonl: Callable[..., Path]) -> None:
    texts = ["hello there", "general kenobi", "x"]
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    idx = wdstream.pack(
        [str(src)], str(tmp_path / "a"), bos=True, eos=False, seq_len=4, workers=0
    ).index
    assert idx.bos_id == 100257 and idx.eos_id is None
    assert_same_docs(tmp_path / "a", texts, eos=False, bos=True)
    idx = wdstream.pack(
        [str(src)], str(tmp_path / "b"), tokenizer="o200k_base", bos=True, bos_id=5, workers=0
    ).index
    assert idx.bos_id == 5 and idx.dtype == "uint32"
    first = next(wdstream.documents(str(tmp_path / "b")))
    assert first[0] == 5 and first[-1] == 199999


def test_uint16_vocab(tmp_path: Path, write_jsonl: Callable[..., Path]) -> None:
    """A small ``.tiktoken`` vocabulary gives uint16 samples."""
    import base64

    ranks = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello"]
    vocab = tmp_path / "tiny.tiktoken"
    vocab.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    src = write_jsonl(tmp_path / "in.jsonl", ["hello hello", "yellow"])
    idx = wdstream.pack(
        [str(src)], str(tmp_path / "out"), tokenizer=str(vocab), seq_len=3, workers=0
    ).index
    assert idx.dtype == "uint16" and idx.eos_id == len(ranks)
    docs = list(wdstream.documents(str(tmp_path / "out")))
    assert docs[0].dtype == np.uint16 and docs[0][0] == 259 and docs[0][-1] == len(ranks)


def test_refuses_complete_dataset_without_overwrite(
    tmp_path: Path, write_jsonl: Callable[..., Path]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", ["a b c", "d e f"])
    wdstream.pack([str(src)], str(tmp_path / "out"), workers=0)
    with pytest.raises(wdstream.WdstreamError, match="overwrite"):
        wdstream.pack([str(src)], str(tmp_path / "out"), workers=0)
    # --overwrite replaces it, removing shards the new pack does not produce.
    wdstream.pack([str(src)], str(tmp_path / "out"), workers=0, overwrite=True, mode="docs")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "data-000000.idx",
        "data-000000.tar",
        "index.json",
    ]


def test_packer_property_random() -> None:
    """Any batching of any documents: samples tile the stream, doc_lens/cont rebuild docs."""
    for trial in range(200):
        rng = random.Random(trial)
        size = rng.randint(1, 12)
        docs = [
            np.arange(rng.randint(1, 15), dtype=np.uint32) + 1000 * i
            for i in range(rng.randint(1, 20))
        ]
        p = ConcatPacker(size, np.dtype(np.uint32))
        out, i = [], 0
        while i < len(docs):
            k = rng.randint(1, 4)
            b = docs[i : i + k]
            out += list(p.add(np.concatenate(b), [len(d) for d in b], list(range(i, i + len(b)))))
            i += k
        out += list(p.flush())
        assert all(len(o.tokens) == size for o in out[:-1])
        rebuilt: list[np.ndarray] = []
        for o in out:
            st = 0
            for j, n in enumerate(o.doc_lens):
                piece = o.tokens[st : st + n]
                st += n
                if j == 0 and o.cont:
                    rebuilt[-1] = np.concatenate([rebuilt[-1], piece])
                else:
                    rebuilt.append(piece)
        assert len(rebuilt) == len(docs) and all(
            np.array_equal(a, b) for a, b in zip(rebuilt, docs, strict=True)
        )
        assert sum(o.new_docs for o in out) == len(docs)
        total = 0
        for o in out:  # ``end`` is exactly where the sample stops in the document stream
            total += len(o.tokens)
            d, emitted = o.end
            assert sum(len(x) for x in docs[:d]) + emitted == total


def test_stdin_via_cli(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from wdstream.cli import main

    data = "".join(json.dumps({"text": f"line {i} " * (i + 1)}) + "\n" for i in range(50))
    res = CliRunner().invoke(
        main,
        ["pack", "-", "-o", str(tmp_path / "out"), "--workers", "0", "--seq-len", "31"],
        input=io.StringIO(data).read(),
    )
    assert res.exit_code == 0, res.output
    assert_same_docs(tmp_path / "out", [f"line {i} " * (i + 1) for i in range(50)])


def test_numeric_braces_and_bom(tmp_path: Path) -> None:
    texts = [f"part {i} text" for i in range(12)]
    for i in range(12):
        bom = "\ufeff" if i == 0 else ""
        (tmp_path / f"part-{i:03d}.jsonl").write_text(
            bom + json.dumps({"text": texts[i]}) + "\n", encoding="utf-8"
        )
    out = tmp_path / "out"
    idx = wdstream.pack(
        [str(tmp_path / "part-{000..011}.jsonl")], str(out), workers=0, mode="docs"
    ).index
    assert idx.stats["input_files"] == 12
    assert_same_docs(out, texts)
