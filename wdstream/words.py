"""Counts in messages: ``1 shard``, ``2 shards``, ``1,000 tokens``."""

from __future__ import annotations

__all__ = ["count"]


def count(n: int, noun: str) -> str:
    """``n`` with thousands separators and ``noun``, plural unless ``n == 1``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
