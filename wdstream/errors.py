"""Exceptions that name the offending file, shard and position.

Every error a user can trigger with bad data derives from :class:`WdstreamError`, so a
training script can catch one type; each subclass says *where* the problem is.
"""

from __future__ import annotations

__all__ = ["CorruptShardError", "InputError", "StateMismatchError", "WdstreamError"]


class WdstreamError(Exception):
    """Base class for every error wdstream raises on bad input or bad state."""


class InputError(WdstreamError, ValueError):
    """A document source could not be read: names the file and the line or byte offset."""


class CorruptShardError(WdstreamError, ValueError):
    """A shard or its sidecar index does not decode: names the shard and the byte offset."""


class StateMismatchError(WdstreamError, ValueError):
    """A saved cursor does not belong to this dataset/configuration."""
