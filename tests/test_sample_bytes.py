"""The packing process's sample encoder (``write.shards.sample_bytes``) against the format's
own ``encode_sample`` (a msgpack map): the same bytes for every size of token data and of
piece lengths msgpack encodes differently, and the same errors."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdstream.format.sample import decode_sample, encode_sample
from wdstream.write.shards import sample_bytes

# Lengths around msgpack's boundaries: fixint, uint8, uint16, uint32; arrays of 15/16 items.
_LENS = st.lists(
    st.sampled_from([1, 2, 127, 128, 255, 256, 65535, 65536, 70000]), min_size=1, max_size=17
)


@settings(max_examples=60, deadline=None)
@given(lens=_LENS, cont=st.booleans(), dtype=st.sampled_from(["<u2", "<u4"]))
def test_sample_bytes_equal_encode_sample(lens: list[int], cont: bool, dtype: str) -> None:
    tokens = (np.arange(sum(lens)) % 50_000).astype(dtype)
    packer = msgpack.Packer()
    want = encode_sample(tokens, lens, cont)
    assert sample_bytes(tokens, lens, cont, packer) == want
    assert sample_bytes(tokens, tuple(lens), cont) == want
    back = decode_sample(want)
    assert back.doc_lens == tuple(lens) and back.cont == cont


def test_small_and_strided_samples() -> None:
    for n in (1, 2, 127, 128, 129, 255, 256):
        tokens = np.arange(n, dtype="<u2")
        assert sample_bytes(tokens, [n], False) == encode_sample(tokens, [n], False)
    strided = np.arange(20, dtype="<u4")[::2]
    assert sample_bytes(strided, [4, 6], True) == encode_sample(strided, [4, 6], True)


def test_sample_bytes_refuse_what_encode_sample_refuses() -> None:
    with pytest.raises(ValueError, match="doc_lens sum"):
        sample_bytes(np.arange(5, dtype="<u2"), [2, 2], False)
    with pytest.raises(ValueError, match="token dtype"):
        sample_bytes(np.arange(5, dtype="<i8"), [5], False)
