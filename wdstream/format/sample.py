"""One training sample: token ids plus the document pieces they are made of.

A sample is the msgpack map stored as member ``KEY.mp`` of a shard (``KEY.msgpack`` in
format v1; webdataset's default decoders unpack ``.mp`` members as msgpack)::

    {"tokens": <bin: little-endian uint16|uint32>, "dtype": "uint16",
     "doc_lens": [700, 1349], "cont": true}

``doc_lens`` are the lengths of consecutive document pieces (they sum to the token count);
``cont`` says whether the first piece continues the last document of the previous sample
in dataset order. With these, documents can be rebuilt exactly and per-document
``position_ids``/``cu_seqlens`` derived. Decoding is zero-copy: ``np.frombuffer`` over the
msgpack binary field.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np

__all__ = [
    "DTYPES",
    "SAMPLE_SUFFIXES",
    "LocatedTokens",
    "Sample",
    "TokenSpans",
    "decode_sample",
    "encode_sample",
    "encoded_size",
    "find_token_spans",
    "token_dtype_for_vocab",
]

DTYPES: dict[str, np.dtype] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_NAME_OF_DTYPE = {dtype: name for name, dtype in DTYPES.items()}

# Member name suffix of a sample, by format version.
SAMPLE_SUFFIXES: dict[int, str] = {1: ".msgpack", 2: ".mp"}

# A sample is at most a few MB (one document in docs mode); refuse anything wildly larger
# so a corrupt or hostile shard cannot make msgpack allocate gigabytes.
_MAX_SAMPLE_BYTES = 1 << 30


def token_dtype_for_vocab(n_vocab: int) -> str:
    """Name of the smallest on-disk dtype that holds every id of a vocabulary of ``n_vocab``."""
    return "uint16" if n_vocab <= 1 << 16 else "uint32"


@dataclass(frozen=True)
class Sample:
    """Decoded sample. ``tokens`` may be a read-only view into the shard bytes."""

    tokens: np.ndarray
    doc_lens: tuple[int, ...]
    cont: bool

    def doc_starts(self) -> np.ndarray:
        """Boolean mask over tokens: True where a document piece begins in this sample."""
        starts = np.zeros(len(self.tokens), dtype=bool)
        offsets = np.cumsum((0,) + self.doc_lens[:-1])
        starts[offsets[offsets < len(self.tokens)]] = True
        return starts


def encode_sample(tokens: np.ndarray, doc_lens: list[int] | tuple[int, ...], cont: bool) -> bytes:
    """Serialise a sample; ``tokens`` must already have the on-disk little-endian dtype.

    Raises:
        ValueError: if the piece lengths do not add up to the token count or the dtype is unknown.
    """
    if sum(doc_lens) != len(tokens):
        raise ValueError(f"doc_lens sum {sum(doc_lens)} != {len(tokens)} tokens")
    return msgpack.packb(_sample_map(tokens.tobytes(), tokens.dtype, doc_lens, cont))


def encoded_size(
    n_tokens: int, dtype: np.dtype, doc_lens: list[int] | tuple[int, ...], cont: bool
) -> int:
    """``len(encode_sample(tokens, doc_lens, cont))`` for ``n_tokens`` tokens of ``dtype``,
    without building the token bytes: the map is encoded around empty tokens, and the bin
    header grows from msgpack's bin 8 to bin 16 or bin 32 with the token bytes."""
    n_bytes = n_tokens * dtype.itemsize
    head = len(msgpack.packb(_sample_map(b"", dtype, doc_lens, cont)))
    return head + n_bytes + _bin_header(n_bytes) - _bin_header(0)


def _sample_map(
    token_bytes: bytes, dtype: np.dtype, doc_lens: list[int] | tuple[int, ...], cont: bool
) -> dict[str, object]:
    """The map a sample is encoded as, its keys in the writer's fixed order."""
    dtype_name = _NAME_OF_DTYPE.get(dtype)
    if dtype_name is None:
        raise ValueError(f"token dtype must be one of {list(DTYPES)}, got {dtype}")
    return {"tokens": token_bytes, "dtype": dtype_name, "doc_lens": list(doc_lens), "cont": cont}


def _bin_header(n_bytes: int) -> int:
    """Bytes of msgpack's header for a bin of ``n_bytes`` (marker and length)."""
    return 2 if n_bytes < 1 << 8 else 3 if n_bytes < 1 << 16 else 5


# The writer emits the map keys in a fixed order, so a sample starts with these bytes followed
# by a msgpack bin header; ``find_token_spans`` relies on that to find the token bytes in place.
_TOKENS_PREFIX = b"\x84\xa6tokens"
# msgpack bin8/16/32 marker byte -> bytes of its big-endian length (0: not a bin marker).
_WIDTH_OF_MARKER = np.zeros(256, dtype=np.int64)
_WIDTH_OF_MARKER[[0xC4, 0xC5, 0xC6]] = [1, 2, 4]
_DTYPE_FIELDS = {b"\xa5dtype\xa6" + n.encode(): d for n, d in DTYPES.items()}


@dataclass(frozen=True)
class TokenSpans:
    """Where the token arrays of consecutive samples lie in a buffer: byte ``start[i]``,
    ``count[i]`` tokens of ``dtype`` (found by :func:`find_token_spans`)."""

    start: np.ndarray  # int64[n], bytes
    count: np.ndarray  # int64[n], tokens
    dtype: np.dtype

    def shifted(self, a: int, b: int, by: int) -> TokenSpans:
        """Samples ``[a, b)`` in a buffer that begins ``by`` bytes later."""
        return TokenSpans(self.start[a:b] - by, self.count[a:b], self.dtype)


@dataclass(frozen=True)
class LocatedTokens:
    """The token arrays of consecutive samples: sample ``i`` is
    ``base[first[i] : first[i] + count[i]]``.

    One array and two index vectors instead of one numpy view per sample: a reader that
    copies rows out of a window creates a view only for the pieces it copies, so a torch
    worker that uses half of a window pays no Python object per sample it skips.
    """

    base: np.ndarray
    first: np.ndarray  # int64[n]
    count: np.ndarray  # int64[n]

    def __len__(self) -> int:
        return len(self.first)

    def views(self) -> list[np.ndarray]:
        """One read-only view per sample."""
        base = self.base
        spans = zip(self.first.tolist(), self.count.tolist(), strict=True)
        return [base[f : f + c] for f, c in spans]

    @classmethod
    def of_arrays(cls, arrays: list[np.ndarray]) -> LocatedTokens:
        """Samples decoded one by one, copied into one array (the slow, rare layouts)."""
        count = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        first = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        base = np.concatenate(arrays) if arrays else np.zeros(0, dtype=DTYPES["uint32"])
        return cls(base, first, count)

    @classmethod
    def in_buffer(cls, data: memoryview, spans: TokenSpans) -> LocatedTokens:
        """The samples ``spans`` locates in ``data``, in place."""
        size, n = spans.dtype.itemsize, len(spans.start)
        shift = int(spans.start[0]) % size if n else 0
        if n and int((spans.start % size != shift).sum()):
            # Token bytes at different phases (not the writer's layout): no common view.
            arrays = [
                np.frombuffer(data, dtype=spans.dtype, count=c, offset=o)
                for o, c in zip(spans.start.tolist(), spans.count.tolist(), strict=True)
            ]
            return cls.of_arrays(arrays)
        # Every sample's tokens start at the same byte phase (the writer's case: tar members
        # are 512-byte aligned and the headers have one width): one view of the whole buffer.
        base = np.frombuffer(data, dtype=spans.dtype, count=(len(data) - shift) // size,
                             offset=shift)  # fmt: skip
        return cls(base, (spans.start - shift) // size, spans.count)


def find_token_spans(data: memoryview, offsets: np.ndarray, sizes: np.ndarray) -> TokenSpans | None:
    """Where the token arrays of many samples of one buffer lie, without unpacking them.

    ``offsets``/``sizes`` locate each sample's msgpack bytes in ``data``. It checks that
    every sample has the canonical layout the writer produces (``tokens`` first, then
    ``dtype``) with a few vectorised numpy operations, so no Python work is done per sample.
    Returns None if any sample has another layout (or the samples mix dtypes); the caller
    then decodes sample by sample.
    """
    n = len(offsets)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return TokenSpans(empty, empty, DTYPES["uint32"])
    if n <= _FEW_SPANS:
        return _few_token_spans(data, offsets.tolist(), sizes.tolist())
    raw = np.frombuffer(data, dtype=np.uint8)
    offs = offsets.astype(np.int64)
    ends = offs + sizes.astype(np.int64)
    head = len(_TOKENS_PREFIX)
    if int(ends.max()) > len(raw) or int((sizes < head + 1).sum()):
        return None
    prefix = np.frombuffer(_TOKENS_PREFIX, dtype=np.uint8)
    if not np.array_equal(raw[offs[:, None] + np.arange(head)], np.broadcast_to(prefix, (n, head))):
        return None
    widths = _WIDTH_OF_MARKER[raw[offs + head]]
    if not widths.all() or int((sizes < head + 1 + widths).sum()):
        return None
    length = np.zeros(n, dtype=np.int64)
    for i in range(int(widths.max())):
        byte = raw[np.minimum(offs + head + 1 + i, len(raw) - 1)]
        length = np.where(widths > i, (length << 8) | byte, length)
    starts = offs + head + 1 + widths
    field_len = 13
    if int((starts + length + field_len > ends).sum()):
        return None
    fields = raw[(starts + length)[:, None] + np.arange(field_len)]
    dtype = _DTYPE_FIELDS.get(fields[0].tobytes())
    if dtype is None or not (fields == fields[0]).all() or int((length % dtype.itemsize).sum()):
        return None
    return TokenSpans(starts, length // dtype.itemsize, dtype)


# Up to this many samples are searched one by one: ~15 numpy calls cost 50-200 us whatever
# the count, and a fresh loader's first batch searches its 8 samples one read each.
_FEW_SPANS = 8


def _few_token_spans(data: memoryview, offsets: list[int], sizes: list[int]) -> TokenSpans | None:
    """:func:`find_token_spans` for a few samples, the same checks in plain Python."""
    head, field_len, size = len(_TOKENS_PREFIX), 13, len(data)
    starts, lengths, first = [], [], b""
    for off, n_bytes in zip(offsets, sizes, strict=True):
        end = off + n_bytes
        if end > size or n_bytes < head + 1 or data[off : off + head] != _TOKENS_PREFIX:
            return None
        width = int(_WIDTH_OF_MARKER[data[off + head]])
        if not width or n_bytes < head + 1 + width:
            return None
        start = off + head + 1 + width
        length = int.from_bytes(data[off + head + 1 : start], "big")
        if start + length + field_len > end:
            return None
        field = bytes(data[start + length : start + length + field_len])
        first = first or field  # every sample's field must be the first's, byte for byte
        dtype = _DTYPE_FIELDS.get(first)
        if dtype is None or field != first or length % dtype.itemsize:
            return None
        starts.append(start)
        lengths.append(length // dtype.itemsize)
    return TokenSpans(np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64),
                      _DTYPE_FIELDS[first])  # fmt: skip


def decode_sample(data: bytes | memoryview) -> Sample:
    """Decode one sample's msgpack bytes without copying the token array.

    Raises:
        ValueError: if the bytes are not a valid sample (callers add shard and offset).
    """
    try:
        obj = msgpack.unpackb(
            data, raw=False, max_bin_len=_MAX_SAMPLE_BYTES, max_array_len=_MAX_SAMPLE_BYTES
        )
        dtype = DTYPES[obj["dtype"]]
        tokens = np.frombuffer(obj["tokens"], dtype=dtype)
        doc_lens = tuple(obj["doc_lens"])
        cont = bool(obj["cont"])
    except (msgpack.UnpackException, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a wdstream sample: {exc!r}") from exc
    if sum(doc_lens) != len(tokens):
        raise ValueError(f"doc_lens sum {sum(doc_lens)} != {len(tokens)} tokens")
    return Sample(tokens=tokens, doc_lens=doc_lens, cont=cont)
