"""wdstream: pack text into WebDataset tar shards of tokens, stream them into PyTorch.

Layers, bottom to top: format (``tarfmt``, ``sample``, ``shardindex``, ``index``) ->
storage -> writer / reader stages -> ``Loader`` and ``pack`` -> CLI.
"""

from __future__ import annotations

from wdstream.errors import CorruptShardError, InputError, StateMismatchError, WdstreamError
from wdstream.index import DatasetIndex, ShardEntry

__version__ = "0.1.0"

__all__ = [
    "CorruptShardError",
    "DatasetIndex",
    "InputError",
    "ShardEntry",
    "StateMismatchError",
    "WdstreamError",
    "__version__",
]
