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
        sample["mp"]["loss_mask"]  # bool per token: False where the token carries no loss

A chat dataset's ids carry their loss mask in bit 31 (:mod:`wdstream.format.loss`); the
decoder splits it off, so ``input_ids`` are plain ids and ``loss_mask`` says which carry
loss (all True for pretraining data).

It does not check the per-sample CRC32C (that lives in the sidecar, which webdataset does
not read); ``wdstream.Loader`` does.
"""

from __future__ import annotations

from typing import Any

from wdstream.format.loss import split_ids
from wdstream.format.sample import SAMPLE_SUFFIXES, decode_sample

__all__ = ["wds_decoder"]

_EXTENSIONS = {suffix.lstrip(".") for suffix in SAMPLE_SUFFIXES.values()}


def wds_decoder(key: str, data: bytes) -> dict[str, Any] | None:
    """Decode one webdataset member if it is a wdstream sample, else return None.

    Args:
        key: the member's key or extension as webdataset passes it (``"mp"``, ``"x.mp"``).
        data: the member's bytes.

    Returns:
        ``{"input_ids": np.ndarray, "doc_lens": list[int], "cont": bool,
        "loss_mask": np.ndarray}``, or None for
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
    ids, no_loss = split_ids(sample.tokens)
    return {"input_ids": ids, "doc_lens": list(sample.doc_lens), "cont": sample.cont,
            "loss_mask": ~no_loss}  # fmt: skip
