"""Pack on a Ray cluster: ``pack(..., engine="ray")`` and the Ray Data sink :class:`Sink`.

Importing this package imports Ray (``pip install 'wdstream[ray]'``); nothing else in
wdstream does, and the local engine never imports it. Design, faults and the scaling model:
``docs/RAY.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wdstream.ray.sink import Sink

__all__ = ["Sink"]


def __getattr__(name: str) -> Any:
    # Ray Data (~1 s to import) only for the sink; pack's engine does not need it.
    if name == "Sink":
        return importlib.import_module("wdstream.ray.sink").Sink
    raise AttributeError(f"module 'wdstream.ray' has no attribute {name!r}")
