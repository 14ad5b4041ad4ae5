"""The resume journal of an interrupted ``pack``: ``.wdstream-pack.json`` at the output root.

Written atomically by the shard writer's thread after every shard commit (after the shard's
sidecar and tar), deleted once ``index.json`` is written. It holds the command's fingerprint,
the committed shards' index entries and the input position after the last committed sample
(see :mod:`wdstream.write.samples` and :class:`~wdstream.inputs.InputPosition`); see ``docs/FORMAT.md``.
The leading dot keeps it out of ``LocalStore.list()``.
"""

from __future__ import annotations

import json
from typing import Any

from wdstream.errors import WdstreamError
from wdstream.format.index import JOURNAL_NAME, ShardEntry
from wdstream.inputs import InputPosition
from wdstream.storage import Store
from wdstream.write.shards import shard_names

__all__ = ["JOURNAL_NAME", "JOURNAL_VERSION", "Journal"]

JOURNAL_VERSION = 1


class Journal:
    """The resume journal: written atomically after every shard commit.

    It only ever names shards ``0, 1, ... n-1`` of ``name``, without gaps: a shard is
    committed only as the next one, so a rerun (and the final ``index.json``, built from
    :attr:`entries`) never skips or repeats a shard, whatever order a writer reports them in.

    Args:
        store: the output.
        fingerprint: everything that decides the output; a journal with another one is refused.
        name: the shard name prefix (``{name}-000000.tar``).
    """

    def __init__(self, store: Store, fingerprint: dict[str, Any], name: str) -> None:
        self.store, self.fingerprint, self.name = store, fingerprint, name
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
        for i, e in enumerate(entries):
            if (e.name, e.sidecar) != shard_names(self.name, i):
                raise WdstreamError(
                    f"{where}: shard {i} is recorded as {e.name!r}, expected "
                    f"{shard_names(self.name, i)[0]!r}; use --overwrite"
                )
            if not (self.store.exists(e.name) and self.store.size(e.name) == e.bytes):
                raise WdstreamError(
                    f"{self.store.child_url(e.name)}: committed shard missing or wrong size; use --overwrite"
                )
        self.entries, self.position = entries, position
        return True

    def commit(
        self, entry: ShardEntry, end: tuple[InputPosition, int], bad_locations: list[str]
    ) -> None:
        """Record ``entry`` as the next committed shard and ``end`` as the resume position.

        The journal file is replaced first; :attr:`entries` and :attr:`position` change only
        once it is written, so they always describe what a rerun would find.

        Args:
            entry: the index entry of the shard just written (sidecar and tar).
            end: the input position of the document holding the shard's last token, and
                how many of that document's tokens are in committed shards.
            bad_locations: the skipped-record locations seen so far (the first
                ``end[0].bad`` of them are before the position).

        Raises:
            WdstreamError: ``entry`` is not the next shard (a gap or a repeat).
        """
        expected = shard_names(self.name, len(self.entries))
        if (entry.name, entry.sidecar) != expected:
            raise WdstreamError(
                f"{self.store.child_url(entry.name)}: committed out of order, the next "
                f"shard to commit is {expected[0]}"
            )
        pos, emitted = end
        entries = [*self.entries, entry]
        position = {
            "position": list(pos),
            "emitted": emitted,
            "bad_locations": bad_locations[: min(pos.bad, len(bad_locations))],
            "next_sample": sum(e.samples for e in entries),
        }
        body = {
            "version": JOURNAL_VERSION,
            "fingerprint": self.fingerprint,
            "shards": [e.__dict__ for e in entries],
            "position": position,
        }
        self.store.write_bytes(JOURNAL_NAME, json.dumps(body, sort_keys=True).encode())
        self.entries, self.position = entries, position
