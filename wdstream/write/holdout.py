"""A held-out split: a fixed fraction of the documents, chosen by their content, packed into
a second dataset at ``OUTPUT/holdout/`` that training never reads (``pack --holdout 0.01``).

Where the split happens (the packing thread, after the document rules, so every kind of
document alike: text, pre-tokenized ids, chat conversations rendered whole)::

    tokens -> DocumentRules -> held out? -- no  --> Side: builder -> ShardWriter -> OUTPUT/
                                         \\- yes --> Side: builder -> ShardWriter -> OUTPUT/holdout/

A document is held out when the first 8 bytes of ``blake2b(ids)`` (digest size 8, read
little-endian) are below ``floor(fraction * 2**64)``, ``ids`` being its stored token ids as
little-endian uint32 with the loss bit (bit 31) cleared: the document as packed, BOS/EOS
included, without its mask. So the choice is a pure function of the document: duplicates
land on the same side, a re-pack (any worker count, a resumed pack) chooses the same
documents, and the expected share is exactly ``fraction``. A chat conversation is one
document, so it is hashed whole; ``train_on`` changes only the mask, never the choice.
Another tokenizer (or ``--bos``/``--eos``) gives other ids, and so another split.

Each dataset is a :class:`Side` with its own sample builder, shard writer, journal and
resume point. A resumed pack reads the inputs from the earlier of the two sides' resume
positions (:func:`earliest`); the side that is further on skips its documents before its
own position, then resumes exactly as a pack without a holdout does
(:func:`wdstream.write.resume.drop_packed`). In a masked pack each side counts its own
supervised tokens, carried in its documents' positions (``InputPosition.supervised``) so
that a resumed side continues its count where its committed shards end.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

import numpy as np

from wdstream.errors import InputError, WdstreamError
from wdstream.format.index import INDEX_NAME, JOURNAL_NAME, DatasetIndex
from wdstream.format.loss import NO_LOSS_BIT, carries_loss
from wdstream.inputs import InputPosition
from wdstream.storage import LocalStore, Store, open_store
from wdstream.words import count
from wdstream.write.builders import SampleBuilder
from wdstream.write.commit import Dataset
from wdstream.write.documents import DocumentParts, mask_stats
from wdstream.write.journal import Journal, journal_fingerprint
from wdstream.write.output import remove_journal_parts
from wdstream.write.resume import ResumePoint, drop_packed, resume_point
from wdstream.write.shards import ShardWriter
from wdstream.write.sizing import choose_shard_bytes

__all__ = [
    "HOLDOUT_DIR",
    "HoldoutTarget",
    "Side",
    "check_fraction",
    "describe_holdout",
    "document_hashes",
    "earliest",
    "held_out",
    "held_out_datasets",
    "holdout_target",
    "open_holdout",
    "route",
]

HOLDOUT_DIR = "holdout"  # the held-out dataset's root, under the pack's output
_ID_BITS = NO_LOSS_BIT - 1  # a stored token's id, without its loss bit


def check_fraction(fraction: float | None) -> float | None:
    """``fraction`` as a float in (0, 1), or None for no holdout.

    Raises:
        ValueError: anything else, naming it.
    """
    if fraction is None:
        return None
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise ValueError(f"holdout must be a fraction in (0, 1), got {fraction!r:.80}")
    if not 0.0 < float(fraction) < 1.0:
        raise ValueError(f"holdout must be a fraction in (0, 1), got {fraction!r}")
    return float(fraction)


def document_hashes(flat: np.ndarray, lens: np.ndarray) -> list[int]:
    """Each document's 64-bit content hash (see the module docstring)."""
    ids = (flat.astype("<u4") & _ID_BITS).astype("<u4", copy=False)
    data = memoryview(ids.tobytes())
    out, start = [], 0
    for end in (np.cumsum(lens) * 4).tolist():
        digest = blake2b(data[start:end], digest_size=8).digest()
        out.append(int.from_bytes(digest, "little"))
        start = end
    return out


def held_out(flat: np.ndarray, lens: np.ndarray, fraction: float) -> np.ndarray:
    """bool per document: True where it goes to the held-out dataset."""
    threshold = int(fraction * 2**64)  # exact: scaling by a power of two
    return np.array([h < threshold for h in document_hashes(flat, lens)], dtype=bool)


@dataclass(frozen=True)
class HoldoutTarget:
    """Where a pack's held-out documents go: the fraction, and the held-out dataset's store,
    journal and resume point (:func:`wdstream.pack` opens them under the output's lock)."""

    fraction: float
    store: Store
    journal: Journal
    resume: ResumePoint
    shard_bytes: int


def open_holdout(
    output: Store,
    options: dict[str, Any] | None,
    fraction: float | None,
    overwrite: bool,
    wrap: Callable[[Store], Store],
) -> Store | None:
    """The held-out dataset's store at ``OUTPUT/holdout/`` (``wrap``-ped as the output's
    is), opened under the output's lock: for a pack with a holdout (its leftover partial
    objects swept), or for ``overwrite`` where an earlier pack's held-out dataset is there
    (which it clears; anything else there is left alone); else None.

    Raises:
        WdstreamError: a held-out dataset of an earlier, complete pack is there (and no
            ``overwrite``); a local ``OUTPUT/holdout`` is a symbolic link or not a folder.
    """
    if fraction is None and not overwrite:
        return None
    if _not_a_folder(output, fraction is not None):
        return None  # a file named holdout beside a pack without one: not ours to clear
    url = output.child_url(HOLDOUT_DIR)
    store = wrap(open_store(url, create=fraction is not None, **(options or {})))
    if fraction is None and not _clearable(store):
        return None  # not a held-out dataset: --overwrite of a pack without one leaves it
    if fraction is not None:
        store.remove_partials()
        if not overwrite and store.exists(INDEX_NAME) and not store.exists(JOURNAL_NAME):
            raise WdstreamError(
                f"{store.child_url(INDEX_NAME)} exists: a held-out dataset of an earlier pack; "
                "pack into a fresh output or pass --overwrite (overwrite=True in Python)"
            )
    return store


def remove_leftovers(output: Store, options: dict[str, Any] | None) -> None:
    """Delete what a pack stopped while removing its journals left beside its published
    ``index.json`` (the caller checked there and holds the lock): the journal parts at the
    output, and a held-out dataset's whole journal when ``OUTPUT/holdout`` holds an
    ``index.json`` too (:func:`~wdstream.write.commit.commit_datasets` removes the held-out
    journal last). Nothing else would remove them but ``--overwrite``."""
    remove_journal_parts(output)
    try:
        if _not_a_folder(output, False):
            return
    except WdstreamError:
        return  # a link there: not ours to touch; the caller's refusal says what matters
    held = open_store(output.child_url(HOLDOUT_DIR), **(options or {}))
    if held.exists(INDEX_NAME):
        held.delete(JOURNAL_NAME)
        remove_journal_parts(held)


def _not_a_folder(output: Store, needed: bool) -> bool:
    """Whether a local ``OUTPUT/holdout`` exists and is no folder (a pack without a holdout
    leaves such a thing alone: it is not ``needed``).

    Raises:
        WdstreamError: it is a symbolic link (its target lies outside the output, and
            --overwrite would delete another folder's dataset through it), or it is no
            folder and a held-out dataset is ``needed`` there; naming the path.
    """
    if not isinstance(output, LocalStore):
        return False
    path = output.root / HOLDOUT_DIR
    if path.is_symlink():
        raise WdstreamError(
            f"{path} is a symbolic link: a pack writes (and --overwrite clears) its held-out "
            "dataset only inside its output; remove the link"
        )
    if not path.exists() or path.is_dir():
        return False
    if needed:
        raise WdstreamError(f"{path} is not a folder: the held-out dataset goes there; remove it")
    return True


def _clearable(store: Store) -> bool:
    """Whether --overwrite of a pack without a holdout clears ``store``: it holds a pack's
    held-out dataset (complete or interrupted: its ``index.json`` or journal says ``split:
    holdout``), or neither an index nor a journal (at most the shards of a pack killed
    before its first commit). A dataset of any other kind there is left alone."""
    if not store.exists(INDEX_NAME) and not store.exists(JOURNAL_NAME):
        return True
    marks = (
        (lambda: json.loads(store.read(INDEX_NAME)), ("stats", "holdout", "split")),
        (lambda: journal_fingerprint(store), ("split",)),
    )
    for read, keys in marks:
        try:
            value: Any = read()
        except (OSError, ValueError, WdstreamError):
            continue  # absent or unreadable: not a pack's
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value == "holdout":
            return True
    return False


def holdout_target(
    store: Store,
    fingerprint: dict[str, Any],
    name: str,
    fraction: float,
    shard_size: str | int | None,
    input_bytes: int | None,
) -> HoldoutTarget:
    """The held-out dataset's side of a pack: its journal (the pack's ``fingerprint``, with
    its own shard size and ``split``), its resume point, and its shard size (given, or chosen
    from its expected share of the input)."""
    share = None if input_bytes is None else int(input_bytes * fraction)
    shard_bytes = choose_shard_bytes(shard_size, share)
    journal = Journal(store, {**fingerprint, "shard_bytes": shard_bytes, "split": "holdout"}, name)
    return HoldoutTarget(fraction, store, journal, resume_point(journal), shard_bytes)


def describe_holdout(held: DatasetIndex) -> str:
    """The held-out dataset's part of a pack's one-line summary."""
    return (
        f"; held out {count(held.total_documents, 'document')}, "
        f"{count(held.total_tokens, 'token')} in {count(len(held.shards), 'shard')} "
        f"at {HOLDOUT_DIR}/ ({held.stats['holdout']['fraction']:g} chosen by content hash)"
    )


def earliest(a: ResumePoint, b: ResumePoint) -> ResumePoint:
    """The resume point the inputs are read from when two datasets resume: the earlier one
    (a fresh one if either side has nothing committed)."""
    if a.start is None or b.start is None:
        return ResumePoint()
    return a if tuple(a.start[:3]) <= tuple(b.start[:3]) else b


class Side:
    """One dataset's end of the pipeline: its documents -> its sample builder -> its shards.

    Args:
        builder: the dataset's sample builder.
        writer: its shard writer (committing to its journal).
        resume: its own resume point; documents before it are skipped (the other dataset
            is further behind and the inputs are read from there).
        count_supervised: a masked pack with a holdout: count this side's supervised
            tokens and carry the count in its documents' positions.
    """

    def __init__(
        self,
        builder: SampleBuilder,
        writer: ShardWriter,
        resume: ResumePoint,
        count_supervised: bool = False,
    ) -> None:
        self.builder, self.writer, self.resume = builder, writer, resume
        self.waiting = resume.start is not None  # its resume document not yet reached
        self.count_supervised = count_supervised
        self.supervised = resume.start.supervised if resume.start is not None else 0

    def add(self, flat: np.ndarray, lens: np.ndarray, positions: list[InputPosition]) -> None:
        """Pack these documents (in input order) into this side's shards."""
        if self.waiting:
            assert self.resume.start is not None
            key = tuple(self.resume.start[:3])
            skip = sum(1 for p in positions if tuple(p[:3]) < key)
            if skip:
                flat, lens = flat[int(np.sum(lens[:skip])) :], lens[skip:]
                positions = positions[skip:]
            if not positions:
                return
            if self.count_supervised:
                positions = self._counted(flat, lens, positions)
            flat, lens, positions = drop_packed(flat, lens, positions, self.resume, self.builder)
            self.waiting = False
        elif self.count_supervised:
            positions = self._counted(flat, lens, positions)
        for s in self.builder.add(flat, lens, positions):
            self.writer.add(s.tokens, s.doc_lens, s.cont, s.new_docs, s.end, s.starts, s.offset)

    def _counted(
        self, flat: np.ndarray, lens: np.ndarray, positions: list[InputPosition]
    ) -> list[InputPosition]:
        """``positions`` carrying this side's supervised tokens before each document."""
        out, start = [], 0
        for n, pos in zip(lens.tolist(), positions, strict=True):
            out.append(pos._replace(supervised=self.supervised))
            self.supervised += int(np.count_nonzero(carries_loss(flat[start : start + n])))
            start += n
        return out

    def finish(self) -> None:
        """Flush the builder and write the last shard; wait for every write.

        Raises:
            WdstreamError: a resumed side never met its resume document.
        """
        if self.waiting:
            raise WdstreamError(
                "the input changed since the interrupted pack; use --overwrite (overwrite=True in Python)"
            )
        for s in self.builder.flush():
            self.writer.add(s.tokens, s.doc_lens, s.cont, s.new_docs, s.end, s.starts, s.offset)
        self.writer.close()


def route(
    flat: np.ndarray,
    lens: np.ndarray,
    positions: list[InputPosition],
    fraction: float,
    sides: Sequence[Side],
) -> None:
    """Send each document to ``sides[0]`` (training) or ``sides[1]`` (held out), in order."""
    held = held_out(flat, lens, fraction)
    tokens_held = np.repeat(held, lens)
    for side, mask, tmask in ((sides[0], ~held, ~tokens_held), (sides[1], held, tokens_held)):
        if mask.any():
            side.add(
                flat[tmask], lens[mask], [p for p, m in zip(positions, mask, strict=True) if m]
            )


def held_out_datasets(
    train: Dataset,
    target: HoldoutTarget,
    rule_counts: dict[str, Any],
    held_supervised: int,
    parts: DocumentParts,
    inputs: str,
) -> list[Dataset]:
    """The two datasets a pack with a holdout commits: the training one (``train``) and the
    held-out one, each with ``stats.holdout`` saying which side it is. The held-out one's
    stats are the training one's input counts with its own documents, shard size and (masked
    packs) supervised tokens: ``empty_documents_skipped``, ``records_skipped``, the long-
    document and chat counts describe the whole input, before the split.

    Raises:
        InputError: no document was held out, or every one was.
    """
    store, journal, meta, stats = train
    entries = target.journal.entries
    if not entries:
        raise InputError(
            f"no document of {inputs} was held out (--holdout {target.fraction} of "
            f"{stats['documents']} documents): pass a larger fraction or more input, with "
            "--overwrite (overwrite=True in Python): the fraction is part of the command"
        )
    counts = dict(rule_counts)
    if "supervised_tokens" in counts:
        counts["supervised_tokens"] = held_supervised
    rule = {"fraction": target.fraction, "hash": "blake2b-64(uint32 ids) < fraction * 2**64"}
    held_stats = {
        **stats,
        "documents": sum(e.documents for e in entries),
        "shard_bytes": target.shard_bytes,
        **mask_stats(counts, entries, parts),
        "holdout": {**rule, "split": "holdout", "other": ".."},
    }
    train_stats = {**stats, "holdout": {**rule, "split": "train", "other": HOLDOUT_DIR}}
    return [(store, journal, meta, train_stats), (target.store, target.journal, meta, held_stats)]
