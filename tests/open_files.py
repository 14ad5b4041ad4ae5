"""This process's open descriptors as the kernel lists them (``/proc/self/fd``): the oracle
of the tests that bound what a reader holds (mapped shards, tables, sockets)."""

from __future__ import annotations

import os
from collections.abc import Callable


def open_descriptors(matches: Callable[[str], bool]) -> int:
    """How many of this process's descriptors have a target (a path, or ``socket:[...]``)
    that ``matches``; one closed while listed is not counted."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += matches(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return count
