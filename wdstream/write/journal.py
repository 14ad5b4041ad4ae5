"""The resume journal of an interrupted ``pack``: ``.wdstream-pack.json`` at the output root.

Written atomically by the shard writer's thread after every shard commit (after the shard's
sidecar and tar), deleted once ``index.json`` is written. It holds the command's fingerprint,
the committed shards' index entries and the input position after the last committed sample
(see :mod:`wdstream.write.samples` and :class:`~wdstream.inputs.InputPosition`); see ``docs/FORMAT.md``.
The leading dot keeps it out of ``LocalStore.list()``.

Entries are kept in segments: every :data:`SEGMENT` committed shards are written once to
``.wdstream-pack-NNNNNN.json`` (segment ``N``) and leave the live journal, which then holds
at most ``SEGMENT`` entries. Rewriting every entry at every commit made a pack of n shards
write O(n^2) bytes (43 MB a commit at 100,000 shards: ~2 TB in all); now each commit writes
at most ~450 KB, and a segment once. A segment is written before the live journal that
counts it, so a pack stopped in between resumes from the live journal as it was (the
segment is written again, the same bytes).

The command's fingerprint (every input's path, size and mtime, and the options) and the
inputs' ctimes are written once, to ``.wdstream-pack-command.json`` before the first live
journal; the live journal names it by its sha256. Written into every commit they made each
commit O(input files): 9.2 MB and 52 ms of the writer's CPU a commit at 100,000 inputs.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from wdstream.errors import WdstreamError
from wdstream.format.index import JOURNAL_NAME, ShardEntry
from wdstream.inputs import InputPosition
from wdstream.storage import Store
from wdstream.write.shards import shard_names

__all__ = ["COMMAND_NAME", "JOURNAL_NAME", "JOURNAL_VERSION", "Journal", "journal_fingerprint"]

# 3: the fingerprint in COMMAND_NAME; 2: entries in segments; 1: all in the live journal.
# All three are read.
JOURNAL_VERSION = 3
SEGMENT = 1024  # committed shards a journal segment holds
COMMAND_NAME = ".wdstream-pack-command.json"  # the fingerprint and ctimes, written once


def segment_name(k: int) -> str:
    """The object holding the journal's ``k``-th segment of entries."""
    return f".wdstream-pack-{k:06d}.json"


class Journal:
    """The resume journal: written atomically after every shard commit.

    It only ever names shards ``0, 1, ... n-1`` of ``name``, without gaps: a shard is
    committed only as the next one, so a rerun (and the final ``index.json``, built from
    :attr:`entries`) never skips or repeats a shard, whatever order a writer reports them in.

    Args:
        store: the output.
        fingerprint: everything that decides the output; a journal with another one is refused.
        name: the shard name prefix (``{name}-000000.tar``).
        ctimes: the inputs' status-change times (``InputFile.ctime_ns``, in their order),
            kept beside the fingerprint: a journal that recorded others is refused too
            (an input rewritten with its size and mtime put back, or replaced), one that
            recorded none (an older version's) is not.
    """

    def __init__(
        self,
        store: Store,
        fingerprint: dict[str, Any],
        name: str,
        ctimes: list[int | None] | None = None,
    ) -> None:
        self.store, self.fingerprint, self.name = store, fingerprint, name
        self.ctimes = ctimes
        self.entries: list[ShardEntry] = []
        self.position: dict[str, Any] | None = None
        self.sealed = 0  # segments written (their entries: the first sealed * SEGMENT)
        self._samples = 0  # samples in the committed shards
        body: dict[str, Any] = {"fingerprint": fingerprint}
        if ctimes is not None:
            body["input_ctimes"] = ctimes
        self._command = json.dumps(body, sort_keys=True).encode()
        self._command_sha256 = hashlib.sha256(self._command).hexdigest()
        self._command_written = False  # COMMAND_NAME holds self._command

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
            obj = _parse(raw)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            if obj.get("version") not in (1, 2, JOURNAL_VERSION):
                raise ValueError(f"journal version {obj.get('version')!r}")
            command = _command(self.store, obj)
            sealed = obj.get("sealed", 0)
            if type(sealed) is not int or sealed < 0:
                raise ValueError(f"sealed: {sealed!r}")
            entries = [e for k in range(sealed) for e in self._segment(k)]
            entries += [ShardEntry(**e) for e in obj["shards"]]
            position = obj["position"]
        except (ValueError, KeyError, TypeError, FileNotFoundError) as exc:
            raise WdstreamError(
                f"{where}: unreadable pack journal ({exc}); use --overwrite (overwrite=True in Python)"
            ) from exc
        if command["fingerprint"] != self.fingerprint:
            theirs = command["fingerprint"]
            changed = sorted(
                k
                for k in set(theirs) | set(self.fingerprint)
                if theirs.get(k) != self.fingerprint.get(k)
            )
            files = _changed_files(theirs.get("inputs"), self.fingerprint.get("inputs"))
            raise WdstreamError(
                f"{self.store.url} holds an interrupted pack of a different command "
                f"(differs in: {', '.join(changed)}){files}; pack into a fresh output or pass --overwrite (overwrite=True in Python)"
            )
        self._check_ctimes(command.get("input_ctimes"))
        for i, e in enumerate(entries):
            if (e.name, e.sidecar) != shard_names(self.name, i):
                raise WdstreamError(
                    f"{where}: shard {i} is recorded as {e.name!r}, expected "
                    f"{shard_names(self.name, i)[0]!r}; use --overwrite (overwrite=True in Python)"
                )
            if not (self.store.exists(e.name) and self.store.size(e.name) == e.bytes):
                raise WdstreamError(
                    f"{self.store.child_url(e.name)}: committed shard missing or wrong size; use --overwrite (overwrite=True in Python)"
                )
        self.entries, self.position = entries, position
        self.sealed, self._samples = sealed, sum(e.samples for e in entries)
        self._command_written = obj.get("command") == self._command_sha256
        return True

    def _check_ctimes(self, theirs: Any) -> None:
        """Refuse a journal whose inputs, of the same size and mtime (the fingerprint
        matched), have another ctime now: rewritten with the mtime put back, replaced by a
        rename, or seen changing by the interrupted pack itself; its shards hold another
        version of them. A chmod or a restore with ``cp -a`` is refused alike (rare)."""
        ours = self.ctimes
        if not isinstance(theirs, list) or ours is None or len(theirs) != len(ours):
            return
        paths = [str(f[0]) for f in self.fingerprint.get("inputs") or []]
        moved = [p for p, a, b in zip(paths, theirs, ours, strict=False) if a != b]
        if moved and len(paths) == len(ours):
            raise WdstreamError(
                f"{self.store.url} holds an interrupted pack of {_first_three(moved)}, "
                "changed since it (same size and mtime, new ctime: rewritten with its mtime "
                "put back, or replaced); pack into a fresh output or pass --overwrite "
                "(overwrite=True in Python)"
            )

    def _segment(self, k: int) -> list[ShardEntry]:
        """Segment ``k``'s entries (its shards ``k * SEGMENT`` on)."""
        obj = _parse(self.store.read(segment_name(k)))
        if not isinstance(obj, dict) or obj.get("segment") != k or len(obj["shards"]) != SEGMENT:
            raise ValueError(f"{segment_name(k)}: not segment {k} of {SEGMENT} shards")
        return [ShardEntry(**e) for e in obj["shards"]]

    def remove(self) -> None:
        """Delete the live journal, then its segments and command (the pack is committed)."""
        self.store.delete(JOURNAL_NAME)
        for k in range(self.sealed):
            self.store.delete(segment_name(k))
        self.store.delete(COMMAND_NAME)

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
        position = {
            "position": list(pos),
            "emitted": emitted,
            "bad_locations": bad_locations[: min(pos.bad, len(bad_locations))],
            "next_sample": self._samples + entry.samples,
        }
        sealed = self.sealed
        live = [*self.entries[sealed * SEGMENT :], entry]  # at most SEGMENT entries
        if len(live) == SEGMENT:  # a full segment: written once, then out of the live part
            segment = {"segment": sealed, "shards": [e.__dict__ for e in live]}
            self.store.write_bytes(segment_name(sealed), json.dumps(segment).encode())
            sealed, live = sealed + 1, []
        if not self._command_written:  # before the first live journal that names it
            self.store.write_bytes(COMMAND_NAME, self._command)
            self._command_written = True
        body = {
            "version": JOURNAL_VERSION,
            "command": self._command_sha256,
            "sealed": sealed,
            "shards": [e.__dict__ for e in live],
            "position": position,
        }
        self.store.write_bytes(JOURNAL_NAME, json.dumps(body, sort_keys=True).encode())
        self.entries.append(entry)
        self.position, self.sealed = position, sealed
        self._samples += entry.samples


def journal_fingerprint(store: Store) -> dict[str, Any]:
    """The fingerprint of the interrupted pack whose journal is at ``store``.

    Raises:
        FileNotFoundError: there is no journal (or its command object is gone).
        ValueError: the journal or its command object does not parse, do not match, or
            record no fingerprint object.
    """
    fingerprint: dict[str, Any] = _command(store, _parse(store.read(JOURNAL_NAME)))["fingerprint"]
    return fingerprint


def _command(store: Store, journal: Any) -> dict[str, Any]:
    """The fingerprint and input ctimes a live journal records: in :data:`COMMAND_NAME`,
    checked against the sha256 the journal names (version 3), or in the journal itself
    (versions 1 and 2).

    Raises:
        ValueError: it records no fingerprint object (a command object that is not one).
    """
    if not isinstance(journal, dict):
        raise ValueError("not a JSON object")
    where = "the journal"
    if journal.get("version") in (1, 2):
        command = journal
    else:
        raw = store.read(COMMAND_NAME)
        if hashlib.sha256(raw).hexdigest() != journal.get("command"):
            raise ValueError(f"{COMMAND_NAME} is not the command the journal names")
        command, where = _parse(raw), COMMAND_NAME
    if not isinstance(command, dict):
        raise ValueError(f"{where}: not a JSON object")
    if not isinstance(command.get("fingerprint"), dict):
        raise ValueError(f"{where}: no fingerprint object")
    return command


def _parse(raw: bytes) -> Any:
    """``raw`` as JSON; nesting too deep for the parser is a ValueError like any other
    unparsable journal part (json raises RecursionError, which no caller expects)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _changed_files(theirs: Any, ours: Any) -> str:
    """``": X changed since it (size, mtime)"`` naming the input files the refused journal
    recorded with another size or mtime than they have now, so a rerun after an input
    changed names the file as the pack that saw it change did; "" where none is."""
    if not isinstance(theirs, list) or not isinstance(ours, list):
        return ""
    old = {str(f[0]): f for f in theirs if isinstance(f, list) and len(f) == 3}
    names = [str(f[0]) for f in ours if str(f[0]) in old and old[str(f[0])] != list(f)]
    if not names:
        return ""
    return f": {_first_three(names)} changed since it (size or mtime)"


def _first_three(names: list[str]) -> str:
    """``names`` for a message: the first three, then how many more."""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(names[:3]) + more
