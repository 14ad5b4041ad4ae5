"""wdstream: pack text into WebDataset tar shards of tokens, stream them into PyTorch.

Layers, bottom to top: format (``tarfmt``, ``sample``, ``shardindex``, ``index``) ->
storage -> writer / reader stages -> ``Loader`` and ``pack`` -> CLI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from wdstream.errors import CorruptShardError, InputError, StateMismatchError, WdstreamError
from wdstream.index import DatasetIndex, ShardEntry

if TYPE_CHECKING:
    from wdstream.dataset import TokenDataset
    from wdstream.loader import Loader
    from wdstream.packing import PackResult, pack
    from wdstream.shardread import documents

# The reader imports torch (~2 s); the writer's tokenizer processes import this package too
# and must not pay for it, so these names are imported on first use (PEP 562).
_LAZY = {
    "Loader": "wdstream.loader",
    "PackResult": "wdstream.packing",
    "TokenDataset": "wdstream.dataset",
    "documents": "wdstream.shardread",
    "pack": "wdstream.packing",
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
    "InputError",
    "Loader",
    "PackResult",
    "ShardEntry",
    "StateMismatchError",
    "TokenDataset",
    "WdstreamError",
    "__version__",
    "documents",
    "pack",
]
