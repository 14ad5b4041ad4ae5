"""A webdataset decoder for wdstream samples: ``wds.WebDataset(urls).decode(wds_decoder)``.

Format v2 names sample members ``KEY.mp``, which webdataset's default decoders already
unpack as msgpack (to a dict whose ``tokens`` are still raw bytes); v1 members are
``KEY.msgpack``, which webdataset leaves as bytes. This handler, placed before the defaults,
turns either into ready arrays::

    import webdataset as wds
    import wdstream

    ds = wds.WebDataset(urls, nodesplitter=wds.split_by_node).decode(wdstream.wds_decoder)
    for sample in ds:
        sample["mp"]["input_ids"]  # numpy uint16/uint32 token ids
        sample["mp"]["doc_lens"], sample["mp"]["cont"]

It does not check the per-sample CRC32C (that lives in the sidecar, which webdataset does
not read); ``wdstream.Loader`` does.
"""

from __future__ import annotations

from typing import Any

from wdstream.format.sample import SAMPLE_SUFFIXES, decode_sample

__all__ = ["wds_decoder"]

_EXTENSIONS = {suffix.lstrip(".") for suffix in SAMPLE_SUFFIXES.values()}


def wds_decoder(key: str, data: bytes) -> dict[str, Any] | None:
    """Decode one webdataset member if it is a wdstream sample, else return None.

    Args:
        key: the member's key or extension as webdataset passes it (``"mp"``, ``"x.mp"``).
        data: the member's bytes.

    Returns:
        ``{"input_ids": np.ndarray, "doc_lens": list[int], "cont": bool}``, or None for
        members of other kinds (webdataset then tries its other handlers).

    Raises:
        ValueError: if a sample member does not decode (names the key).
    """
    if key.rsplit(".", 1)[-1].lower() not in _EXTENSIONS:
        return None
    try:
        sample = decode_sample(data)
    except ValueError as exc:
        raise ValueError(f"member {key!r}: {exc}") from exc
    return {"input_ids": sample.tokens, "doc_lens": list(sample.doc_lens), "cont": sample.cont}
