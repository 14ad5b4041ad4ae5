"""wdstream: pack text into WebDataset tar shards of tokens, stream them into PyTorch.

Layers, bottom to top: format (``tarfmt``, ``sample``, ``shardindex``, ``index``) ->
storage -> writer / reader stages -> ``Loader`` and ``pack`` -> CLI.
"""

from __future__ import annotations

from wdstream.dataset import TokenDataset
from wdstream.errors import CorruptShardError, InputError, StateMismatchError, WdstreamError
from wdstream.index import DatasetIndex, ShardEntry
from wdstream.loader import Loader
from wdstream.packing import PackResult, pack
from wdstream.shardread import documents

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
