"""Waiting on Ray objects while the driver's own raylet is watched.

When the raylet of the driver's node dies, Ray does not always fail a pending ``ray.get``:
it may try to rebuild the objects that lived there (resubmitting their tasks) and then end
the driver process itself, with status 1 and nothing printed (seen in
``tests/test_ray_system_kill.py`` on a loaded 2-core host: the driver blocked in
``ray.get`` of a shard task for ~15 s, then gone). A pack must instead end with its one
``Error:`` line, so the driver waits in short slices and, between them, checks that its
raylet still answers on its socket; a dead one is reported as Ray reports it.
"""

from __future__ import annotations

import socket
from typing import Any

import ray

__all__ = ["get_watched"]

# Seconds between raylet checks while an object is not ready (a ready one returns at once).
_SLICE_S = 1.0


def get_watched(ref: Any) -> Any:
    """``ray.get(ref)``, raising ``ray.exceptions.LocalRayletDiedError`` once the driver's
    raylet stops answering, instead of waiting for Ray to end the process."""
    while True:
        try:
            return ray.get(ref, timeout=_SLICE_S)
        except ray.exceptions.GetTimeoutError:
            if not _raylet_answers():
                raise ray.exceptions.LocalRayletDiedError() from None


def _raylet_answers() -> bool:
    """Whether the local raylet accepts a connection on its socket (a killed raylet leaves
    the socket file with no one listening: refused). True where it cannot be told."""
    node = getattr(ray._private.worker.global_worker, "node", None)  # Ray's own handle
    path = getattr(node, "raylet_socket_name", None)
    if not isinstance(path, str) or not path.startswith("/"):
        return True
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True
    return True
