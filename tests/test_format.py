"""The v1 format building blocks: samples, zero-copy token views, tar members, sidecar, index."""

from __future__ import annotations

import io
import tarfile

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wdstream.format.index import DatasetIndex, ShardEntry
from wdstream.format.sample import (
    LocatedTokens,
    decode_sample,
    encode_sample,
    encoded_size,
    find_token_spans,
)
from wdstream.format.sidecar import ShardSidecar, scan_tar
from wdstream.format.tar import (
    END_OF_ARCHIVE,
    _fast_header,
    _tarfile_header,
    member_bytes,
    member_size,
)


def _pack_many(
    lengths: list[int], dtype: str, gap: bytes = b"pad", align: int = 1
) -> tuple[bytes, list[int], list[int], list[np.ndarray]]:
    """Samples one after the other, each after ``gap`` and starting at a multiple of
    ``align`` (512 is the tar case: every token array then starts at the same byte phase)."""
    parts, offsets, sizes, arrays, pos = [], [], [], [], 0
    for i, n in enumerate(lengths):
        tokens = (np.arange(n) * 7 + i).astype(dtype)
        blob = encode_sample(tokens, [n] if n else [], cont=bool(i % 2))
        lead = gap + b"\0" * (-(pos + len(gap)) % align)
        parts += [lead, blob]
        offsets.append(pos + len(lead))
        sizes.append(len(blob))
        pos += len(lead) + len(blob)
        arrays.append(tokens)
    return b"".join(parts), offsets, sizes, arrays


@given(
    lengths=st.lists(st.integers(0, 70_000), min_size=1, max_size=6),
    dtype=st.sampled_from(["<u2", "<u4"]),
    align=st.sampled_from([1, 512]),
)
def test_token_spans_equal_full_decode(lengths: list[int], dtype: str, align: int) -> None:
    data, offsets, sizes, arrays = _pack_many(lengths, dtype, align=align)
    spans = find_token_spans(memoryview(data), np.array(offsets), np.array(sizes))
    assert spans is not None
    # In place (one phase, align=512) or copied (phases differ, align=1): the same tokens.
    views = LocatedTokens.in_buffer(memoryview(data), spans).views()
    for view, want, off, size in zip(views, arrays, offsets, sizes, strict=True):
        assert view.dtype == want.dtype and np.array_equal(view, want)
        assert np.array_equal(decode_sample(data[off : off + size]).tokens, want)


@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=8),
    dtype=st.sampled_from(["<u2", "<u4"]),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=3),
)
def test_few_token_spans_agree_with_the_vectorised_search(
    lengths: list[int], dtype: str, flips: list[tuple[int, int]]
) -> None:
    """The search of a few samples one by one (a first batch's) finds what the vectorised
    one finds, on the writer's bytes and on bytes with some flipped (same spans, or None)."""
    from wdstream.format import sample as sample_module

    data, offsets, sizes, _ = _pack_many(lengths, dtype, align=512)
    buf = bytearray(data)
    for at, x in flips:
        buf[at % len(buf)] ^= x
    offs, n_bytes = np.array(offsets, dtype=np.int64), np.array(sizes, dtype=np.int64)
    few = sample_module._few_token_spans(memoryview(bytes(buf)), offsets, sizes)
    limit, sample_module._FEW_SPANS = sample_module._FEW_SPANS, 0  # the vectorised path
    try:
        many = find_token_spans(memoryview(bytes(buf)), offs, n_bytes)
    finally:
        sample_module._FEW_SPANS = limit
    assert (few is None) == (many is None)
    if few is not None and many is not None:
        assert few.dtype == many.dtype
        assert np.array_equal(few.start, many.start) and np.array_equal(few.count, many.count)


def test_token_spans_refuse_other_layouts() -> None:
    other_order = msgpack.packb(
        {"dtype": "uint32", "tokens": b"abcd", "doc_lens": [1], "cont": False}
    )
    size = np.array([len(other_order)])
    assert find_token_spans(memoryview(other_order), np.array([0]), size) is None
    good = encode_sample(np.arange(3, dtype="<u2"), [3], False)
    truncated = good[:-1]
    assert find_token_spans(memoryview(truncated), np.array([0]), np.array([len(good)])) is None


def test_sample_rejects_inconsistent_pieces() -> None:
    with pytest.raises(ValueError, match="doc_lens"):
        encode_sample(np.arange(4, dtype="<u4"), [3], False)
    with pytest.raises(ValueError, match="not a wdstream sample"):
        decode_sample(b"\x93\x01\x02")


def test_doc_starts_mark_every_piece() -> None:
    sample = decode_sample(encode_sample(np.arange(6, dtype="<u2"), [2, 1, 3], True))
    assert sample.doc_starts().tolist() == [True, False, True, True, False, False]


def test_tar_members_are_plain_tar_and_scannable() -> None:
    blobs = [encode_sample(np.arange(n, dtype="<u4"), [n], False) for n in (1, 300, 5)]
    data = (
        b"".join(member_bytes(f"{i:012d}.msgpack", b) for i, b in enumerate(blobs)) + END_OF_ARCHIVE
    )
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert [tar.extractfile(m).read() for m in tar.getmembers()] == blobs  # type: ignore[union-attr]
    members = scan_tar(data)
    assert [data[o : o + n] for _, o, n in members] == blobs
    with pytest.raises(ValueError, match="without an end-of-archive"):
        scan_tar(data[: -len(END_OF_ARCHIVE)])


def test_sidecar_round_trip_and_byte_range() -> None:
    side = ShardSidecar(
        offsets=np.array([512, 2048, 4096], dtype="<u8"),
        sizes=np.array([100, 200, 300], dtype="<u4"),
        tokens=np.array([10, 20, 30], dtype="<u4"),
    )
    back = ShardSidecar.from_bytes(side.to_bytes())
    assert back.byte_range(1, 3) == (2048, 4396)
    assert np.array_equal(back.tokens, side.tokens)
    with pytest.raises(IndexError):
        back.byte_range(2, 4)


def test_index_json_round_trip_and_version_check() -> None:
    shard = ShardEntry("d-000000.tar", "d-000000.idx", 3, 30, 2, 4096, "ab" * 32, "cd" * 32)
    index = DatasetIndex(
        tokenizer={
            "name": "cl100k_base",
            "backend": "tiktoken",
            "ranks_sha256": "ef" * 32,
            "n_vocab": 100277,
        },
        eos_id=100257,
        bos_id=None,
        dtype="uint32",
        mode="concat",
        seq_len=9,
        sample_tokens=10,
        shards=(shard,),
        checksum="crc32c",
    )
    assert DatasetIndex.from_json(index.to_json()) == index
    with pytest.raises(ValueError, match="format version 99"):
        DatasetIndex.from_json(
            index.to_json().replace('"version": 2', '"version": 99'), "x/index.json"
        )


@given(
    name=st.text(min_size=1, max_size=100).filter(
        lambda n: "\0" not in n and len(n.encode()) <= 100
    ),
    size=st.integers(0, 8**11 - 1),
)
def test_patched_tar_header_equals_tarfile(name: str, size: int) -> None:
    assert _fast_header(name.encode(), size) == _tarfile_header(name, size)


def test_member_bytes_long_names_go_through_tarfile() -> None:
    name = "d/" * 60 + "x.msgpack"
    assert member_bytes(name, b"ab")[:512] == _tarfile_header(name, 2)


@given(
    pieces=st.lists(st.integers(0, 70_000), min_size=1, max_size=20),
    dtype=st.sampled_from(["<u2", "<u4"]),
    cont=st.booleans(),
)
def test_encoded_size_is_the_encoding_length(pieces: list[int], dtype: str, cont: bool) -> None:
    """Sizes laid out ahead (the Ray driver) equal the encoded samples' lengths, across
    msgpack's bin 8/16/32 token headers and every int width of the piece lengths."""
    tokens = np.zeros(sum(pieces), dtype=dtype)
    want = len(encode_sample(tokens, pieces, cont))
    assert encoded_size(len(tokens), np.dtype(dtype), pieces, cont) == want


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 70_000])
@pytest.mark.parametrize("name", ["000000000007.mp", "d/" * 60 + "x.mp"])
def test_member_size_is_the_member_length(name: str, size: int) -> None:
    assert member_size(name, size) == len(member_bytes(name, b"x" * size))


def test_kept_layouts_few_samples_alone_then_whole_shard() -> None:
    """A read of a few samples (at most FEW, under a quarter of the shard: the first batch's,
    read alone) searches only them, also when the shard was read before; a larger read of
    a shard read before searches it whole, and later reads use the kept layout. Every read's
    tokens equal the samples' full decode."""
    from wdstream.format.sidecar import ShardSidecar
    from wdstream.read.sources.layouts import FEW, KeptLayouts

    data, offsets, sizes, arrays = _pack_many([5 + i % 9 for i in range(100)], "<u4", align=512)
    sidecar = ShardSidecar(
        offsets=np.array(offsets, dtype=np.uint64),
        sizes=np.array(sizes, dtype=np.uint32),
        tokens=np.array([len(a) for a in arrays], dtype=np.uint32),
    )
    kept = KeptLayouts(limit=4)
    mapped: list[int] = []

    def whole(end: int) -> memoryview:
        mapped.append(end)
        return memoryview(data)[:end]

    assert 3 <= FEW < 20
    for a, b in [(3, 5), (30, 33), (50, 70), (10, 12)]:
        begin = offsets[a] - 7  # a read starts before its first sample
        spans = kept.of_local(0, sidecar, a, b, begin, whole)
        assert spans is not None
        got = LocatedTokens.in_buffer(memoryview(data)[begin:], spans).views()
        for view, want in zip(got, arrays[a:b], strict=True):
            assert np.array_equal(view, want)
    # The two few-sample reads mapped only up to their last sample; the larger one (20
    # samples, under a quarter) the whole shard, after which every read is served from the
    # kept layout (nothing mapped).
    assert mapped == [offsets[4] + sizes[4], offsets[32] + sizes[32], len(data)]
