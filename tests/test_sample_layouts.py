"""Samples in a layout other than the writer's (another msgpack key order) read the same tokens.

The reader finds token bytes in place for the writer's layout and decodes anything else; a
local shard's layout is searched once per shard, so one odd sample must send the whole shard
down the decoding path, not be read at a wrong offset.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pytest

from wdstream.format.sample import encode_sample
from wdstream.format.tar import END_OF_ARCHIVE, member_bytes
from wdstream.read.sources.packed import ShardSource


def _other_order(tokens: np.ndarray) -> bytes:
    return msgpack.packb(
        {"dtype": "uint32", "doc_lens": [len(tokens)], "cont": False, "tokens": tokens.tobytes()}
    )


def _write_shard(path: Path, samples: list[bytes]) -> None:
    body = b"".join(member_bytes(f"{i:06d}.mp", s) for i, s in enumerate(samples))
    path.write_bytes(body + END_OF_ARCHIVE)


@pytest.mark.parametrize("odd", [[], [3], list(range(6))])
def test_read_located_matches_the_packed_tokens(tmp_path: Path, odd: list[int]) -> None:
    arrays = [(np.arange(40) * 3 + i).astype("<u4") for i in range(6)]
    samples = [
        _other_order(t) if i in odd else encode_sample(t, [len(t)], False)
        for i, t in enumerate(arrays)
    ]
    _write_shard(tmp_path / "odd-000000.tar", samples)
    source = ShardSource(str(tmp_path / "odd-000000.tar"))  # no sidecar: scanned once
    for a, b in [(0, 6), (2, 5), (3, 4)]:
        got = source.read([(0, a, b)])[0].tokens.views()
        assert [t.tolist() for t in got] == [t.tolist() for t in arrays[a:b]]
        decoded = source.read([(0, a, b)], docs=True)[0].tokens.views()
        assert [t.tolist() for t in decoded] == [t.tolist() for t in arrays[a:b]]
