"""Calls of a bound method that do not keep its object alive.

A reader's parts hand each other bound methods (a window cache calls its reads' loader, the
reads call the order's plans): a bound method holds its object, so each such hand-off made
a reference cycle, and a dropped Loader's objects (its mapped shard table's descriptors,
its read-ahead threads, its windows' bytes) lived until the cyclic collector ran, which a
long-running process (evaluation Loaders made again and again, or ``gc.disable()``) may
postpone indefinitely. :func:`weak_method` gives the part a call that reaches the object
only while its owner keeps it (``docs/READER.md``, "Resources per process").
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, ParamSpec, TypeVar

__all__ = ["weak_method"]

P = ParamSpec("P")
R = TypeVar("R")


class _WeakMethod(Generic[P, R]):
    """``method`` called through a weak reference to its object."""

    __slots__ = ("_ref",)

    def __init__(self, method: Callable[P, R]) -> None:
        self._ref = weakref.WeakMethod(method)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        method = self._ref()
        if method is None:
            raise ReferenceError("called after its reader was dropped")
        return method(*args, **kwargs)


def weak_method(method: Callable[P, R]) -> Callable[P, R]:
    """A call of the bound ``method`` that does not keep its object alive (no cycle through
    it); raises ``ReferenceError`` once the object is gone."""
    return _WeakMethod(method)
