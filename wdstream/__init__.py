"""wdstream: pack text into WebDataset tar shards of tokens, stream them into PyTorch.

Layers, bottom to top: ``format`` (tar members, samples, sidecars, ``index.json``) ->
``storage`` -> ``write`` (``pack``) / ``read`` (``Loader``) -> ``cli``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from wdstream.errors import (
    CorruptShardError,
    IncompleteDatasetError,
    IndexValidationError,
    InputError,
    ListingNotSupportedError,
    PackLockedError,
    QuarantineLimitError,
    RemoteReadError,
    RemoteStoreError,
    RemoteWriteError,
    StateMismatchError,
    TokenizerError,
    WdstreamError,
    WorkerTimeoutError,
)

if TYPE_CHECKING:
    from wdstream.format.entry import ShardEntry
    from wdstream.format.index import DatasetIndex
    from wdstream.format.wds import wds_decoder
    from wdstream.inspect import documents
    from wdstream.read.mixture.inspect import explain_mixture
    from wdstream.read.order.global_sequence import global_batch_at
    from wdstream.read.provenance import explain
    from wdstream.read.torch.dataset import TokenDataset
    from wdstream.read.torch.loader import Loader
    from wdstream.write.pack import PackResult, pack
    from wdstream.write.writer import Writer, pack_records

# The reader imports torch (~2 s); the writer's tokenizer processes import this package too
# and must not pay for it, so these names are imported on first use (PEP 562). Nor for
# index.json's parser and rules (~20 ms from source): a Ray worker imports this package
# afresh for every pack, and its tasks never read an index.json.
_LAZY = {
    "DatasetIndex": "wdstream.format.index",
    "ShardEntry": "wdstream.format.entry",
    "wds_decoder": "wdstream.format.wds",
    "Loader": "wdstream.read.torch.loader",
    "PackResult": "wdstream.write.pack",
    "TokenDataset": "wdstream.read.torch.dataset",
    "Writer": "wdstream.write.writer",
    "documents": "wdstream.inspect",
    "explain": "wdstream.read.provenance",
    "explain_mixture": "wdstream.read.mixture.inspect",
    "global_batch_at": "wdstream.read.order.global_sequence",
    "pack": "wdstream.write.pack",
    "pack_records": "wdstream.write.writer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wdstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "CorruptShardError",
    "DatasetIndex",
    "IncompleteDatasetError",
    "IndexValidationError",
    "InputError",
    "ListingNotSupportedError",
    "Loader",
    "PackLockedError",
    "PackResult",
    "QuarantineLimitError",
    "RemoteReadError",
    "RemoteStoreError",
    "RemoteWriteError",
    "ShardEntry",
    "StateMismatchError",
    "TokenDataset",
    "TokenizerError",
    "WdstreamError",
    "WorkerTimeoutError",
    "Writer",
    "__version__",
    "documents",
    "explain",
    "explain_mixture",
    "global_batch_at",
    "pack",
    "pack_records",
    "wds_decoder",
]
