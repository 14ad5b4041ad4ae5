"""``os.fork`` watched for the reader's threads, for the tests of a Loader's worker start.

A child forked beside a reader thread (read-ahead, remote fetches) would wait forever on a
thread it does not have; the watch fails the fork instead, at once.
"""

from __future__ import annotations

import os
import threading

import pytest


def watch_forks(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Patch ``os.fork`` to record, at each call, the reader's threads then alive that were
    not alive before (an earlier test's loader in this process may hold its own), and to
    refuse the fork if there are any. Returns the record, one list of names per fork."""
    seen: list[list[str]] = []
    fork = os.fork
    before = set(threading.enumerate())

    def watched() -> int:
        alive = [t.name for t in threading.enumerate()
                 if t.name.startswith("wdstream-") and t not in before]  # fmt: skip
        seen.append(alive)
        assert not alive, f"forked with the reader's threads alive: {alive}"
        return fork()

    monkeypatch.setattr(os, "fork", watched)
    return seen
