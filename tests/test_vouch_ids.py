"""The ids check of a read (``IdLimit.check``) against a per-sample Python oracle.

Samples read in place lie at an odd byte phase (after each tar and msgpack header), evenly
spaced in a packed shard: the check takes those as rows of one strided view, and any other
spacing through ``maximum.reduceat``. Both must name the first sample holding an id outside
the vocabulary, and the token, exactly as the oracle finds them; and pass every clean read.
"""

from __future__ import annotations

import numpy as np
import pytest

from wdstream.errors import IndexValidationError
from wdstream.format.loss import NO_LOSS_BIT
from wdstream.format.sample import LocatedTokens
from wdstream.read.sources.vouch import IdLimit

N_VOCAB = 1000


def located(rng: np.random.Generator, counts: list[int], gaps: list[int]) -> LocatedTokens:
    """Samples of ``counts`` tokens, ``gaps[i]`` tokens of header garbage (ids far past the
    vocabulary) before sample ``i``, in a uint32 view at byte phase 1 of its buffer."""
    total = sum(counts) + sum(gaps) + 1
    raw = bytearray(4 * total + 1)
    base = np.frombuffer(memoryview(raw), dtype=np.uint32, count=total, offset=1)
    assert not base.flags.aligned
    view = np.ndarray((total,), np.uint32, buffer=memoryview(raw), offset=1)  # writable
    view[:] = rng.integers(NO_LOSS_BIT, 2**32 - 1, total, dtype=np.uint32)  # garbage
    first, at = [], 0
    for c, g in zip(counts, gaps, strict=True):
        at += g
        view[at : at + c] = rng.integers(0, N_VOCAB, c, dtype=np.uint32)
        first.append(at)
        at += c
    return LocatedTokens(base, np.array(first, dtype=np.int64), np.array(counts, dtype=np.int64))


def oracle(tokens: LocatedTokens, masked: bool) -> tuple[int, int] | None:
    """(sample, token) of the first id outside the vocabulary, by plain Python."""
    for k, (f, c) in enumerate(zip(tokens.first.tolist(), tokens.count.tolist(), strict=True)):
        for t in range(c):
            v = int(tokens.base[f + t])
            if (v & (NO_LOSS_BIT - 1) if masked else v) >= N_VOCAB:
                return k, t
    return None


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("layout", ["even", "uneven", "one", "two"])
def test_the_check_names_the_first_bad_id_as_the_oracle_does(layout: str, masked: bool) -> None:
    rng = np.random.default_rng([7, len(layout), masked])
    limit = IdLimit(N_VOCAB, masked, "index.json")
    n = {"even": 40, "uneven": 40, "one": 1, "two": 2}[layout]
    for trial in range(30):
        if layout == "uneven":
            counts = rng.integers(1, 60, n).tolist()
            gaps = rng.integers(0, 9, n).tolist()
        else:
            counts, gaps = [37] * n, [5] * n
        tokens = located(rng, counts, gaps)
        if masked:  # the loss bit on some ids: stripped before the comparison
            f = int(tokens.first[0])
            tokens.base[f : f + 3] |= np.uint32(NO_LOSS_BIT)
        if trial % 3:  # a bad id in a random sample at a random token
            k = int(rng.integers(n))
            t = int(rng.integers(tokens.count[k]))
            tokens.base[int(tokens.first[k]) + t] = N_VOCAB + int(rng.integers(5))
        want = oracle(tokens, masked)
        if want is None:
            limit.check(tokens, "shard.tar", 100)
            continue
        with pytest.raises(IndexValidationError) as info:
            limit.check(tokens, "shard.tar", 100)
        assert f"shard.tar: sample {100 + want[0]}, token {want[1]}: " in str(info.value)
