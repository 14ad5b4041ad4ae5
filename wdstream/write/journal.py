"""The resume journal of an interrupted ``pack``: ``.wdstream-pack.json`` at the output root.

Written atomically by the shard writer's thread after every shard commit (after the shard's
sidecar and tar), deleted once ``index.json`` is written. It holds the command's fingerprint,
the committed shards' index entries and the input position after the last committed sample
(see :mod:`wdstream.write.samples` and :class:`~wdstream.write.inputs.Position`); see ``docs/FORMAT.md``.
The leading dot keeps it out of ``LocalStore.list()``.
"""

from __future__ import annotations

import json
from typing import Any

from wdstream.errors import WdstreamError
from wdstream.format.index import JOURNAL_NAME, ShardEntry
from wdstream.storage import Store
from wdstream.write.inputs import Position

__all__ = ["JOURNAL_NAME", "JOURNAL_VERSION", "Journal"]

JOURNAL_VERSION = 1


class Journal:
    """The resume journal: written atomically after every shard commit."""

    def __init__(self, store: Store, fingerprint: dict[str, Any]) -> None:
        self.store, self.fingerprint = store, fingerprint
        self.entries: list[ShardEntry] = []
        self.position: dict[str, Any] | None = None

    def load(self) -> bool:
        """Read an existing journal; True if it belongs to this command.

        Raises:
            WdstreamError: if it belongs to a different command or does not parse.
        """
        try:
            raw = self.store.read(JOURNAL_NAME)
        except FileNotFoundError:
            return False
        where = self.store.child_url(JOURNAL_NAME)
        try:
            obj = json.loads(raw)
            if obj.get("version") != JOURNAL_VERSION:
                raise ValueError(f"journal version {obj.get('version')!r}")
            entries = [ShardEntry(**e) for e in obj["shards"]]
            position = obj["position"]
        except (ValueError, KeyError, TypeError) as exc:
            raise WdstreamError(
                f"{where}: unreadable pack journal ({exc}); use --overwrite"
            ) from exc
        if obj.get("fingerprint") != self.fingerprint:
            theirs = obj.get("fingerprint") or {}
            changed = sorted(
                k
                for k in set(theirs) | set(self.fingerprint)
                if theirs.get(k) != self.fingerprint.get(k)
            )
            raise WdstreamError(
                f"{self.store.url} holds an interrupted pack of a different command "
                f"(differs in: {', '.join(changed)}); pack into a fresh output or pass --overwrite"
            )
        for e in entries:
            if not (self.store.exists(e.name) and self.store.size(e.name) == e.bytes):
                raise WdstreamError(
                    f"{self.store.child_url(e.name)}: committed shard missing or wrong size; use --overwrite"
                )
        self.entries, self.position = entries, position
        return True

    def commit(
        self, entry: ShardEntry, end: tuple[Position, int], bad_locations: list[str]
    ) -> None:
        pos, emitted = end
        self.entries.append(entry)
        self.position = {
            "position": list(pos),
            "emitted": emitted,
            "bad_locations": bad_locations[: min(pos.bad, len(bad_locations))],
            "next_sample": sum(e.samples for e in self.entries),
        }
        body = {
            "version": JOURNAL_VERSION,
            "fingerprint": self.fingerprint,
            "shards": [e.__dict__ for e in self.entries],
            "position": self.position,
        }
        self.store.write_bytes(JOURNAL_NAME, json.dumps(body, sort_keys=True).encode())
