"""The process pool's task and result pipes are widened to 1 MiB where Linux allows it (a
speed-up only: a batch crosses in one read), and the pool's results are unchanged: the oracle
is the tokenizer's own encoding of each text, made in this process."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from wdstream.tokenizers import load_tokenizer
from wdstream.write import tokenpool
from wdstream.write.encoders import TextEncoder

fcntl = pytest.importorskip("fcntl")


def _can_widen() -> bool:
    """Whether this kernel lets this process give a fresh pipe 1 MiB."""
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        return False
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
        return True
    except OSError:
        return False
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.skipif(not _can_widen(), reason="the kernel refuses 1 MiB pipes here")
def test_pool_pipes_are_widened_and_results_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenpool.TokenPool, "inline_while_starting", False)  # all through pipes
    tok = load_tokenizer("cl100k_base", "tiktoken")
    texts = [f"document {i} " * (1 + i * 997 % 5000) for i in range(40)]  # ~2 MB of tokens
    pool = tokenpool.TokenPool(tok, 2, "processes", TextEncoder(None, tok.eos_id, "uint32"))
    try:
        executor = pool._executor
        ends = (executor._call_queue._writer, executor._result_queue._reader)  # type: ignore[union-attr]
        assert [fcntl.fcntl(e.fileno(), fcntl.F_GETPIPE_SZ) for e in ends] == [1 << 20] * 2
        batches = [(texts[i : i + 10], i) for i in range(0, len(texts), 10)]
        got = list(pool.map(batches))
    finally:
        pool.close()
    for (meta, encoded, _), (batch, i) in zip(got, batches, strict=True):
        assert meta == i
        want = [np.append(tok.encode(t), tok.eos_id) for t in batch]
        assert encoded.lens.tolist() == [len(w) for w in want]
        assert encoded.flat.tolist() == np.concatenate(want).tolist()


def test_an_executor_without_those_pipes_is_left_alone() -> None:
    with ThreadPoolExecutor(1) as executor:
        tokenpool._widen_pipes(executor)  # type: ignore[arg-type]
        assert executor.submit(sum, [1, 2]).result() == 3
