"""Pack on a Ray cluster: ``pack(..., engine="ray")`` and the Ray Data sink :class:`Sink`.

Importing this package imports Ray (``pip install 'wdstream[ray]'``); nothing else in
wdstream does. Design, faults and the scaling model: ``docs/RAY.md``.
"""

from __future__ import annotations

__all__: list[str] = []
