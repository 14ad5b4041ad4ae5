"""Resuming an interrupted pack: where to restart, and what of the first document to drop.

Every engine resumes the same way: :func:`resume_point` reads the journal's record of the
last committed shard (the input position of the document holding its last token, and how
much of it is packed); the engine reads the inputs from that document, and before its first
batch reaches the sample builder :func:`drop_packed` checks the document is still there and
lets the builder drop what committed shards hold (:meth:`SampleBuilder.resume`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wdstream.errors import WdstreamError
from wdstream.inputs import InputPosition
from wdstream.write.builders import SampleBuilder
from wdstream.write.journal import Journal

__all__ = ["ResumePoint", "drop_packed", "resume_point"]


@dataclass(frozen=True)
class ResumePoint:
    """Where a pack starts: ``start`` None for a fresh pack, else the record to restart
    from, ``emitted`` tokens (best-fit: rows) of it already packed, and the skipped-record
    locations seen before it."""

    start: InputPosition | None = None
    emitted: int = 0
    bad_locations: list[str] = field(default_factory=list)


def resume_point(journal: Journal) -> ResumePoint:
    """Load the journal (refusing one of another command, see :meth:`Journal.load`) and
    return where this pack starts."""
    if not journal.load():
        return ResumePoint()
    assert journal.position is not None
    return ResumePoint(
        InputPosition(*journal.position["position"]),
        journal.position["emitted"],
        list(journal.position["bad_locations"]),
    )


def drop_packed(
    flat: np.ndarray,
    lens: np.ndarray,
    positions: list[InputPosition],
    resume: ResumePoint,
    builder: SampleBuilder,
) -> tuple[np.ndarray, np.ndarray, list[InputPosition]]:
    """On resume, remove the first document's tokens that are already in committed shards.

    Raises:
        WdstreamError: the recorded document is not the first one read, or is shorter than
            what was packed of it: the input changed since the interrupted pack.
    """
    assert resume.start is not None
    if not positions or positions[0][:3] != resume.start[:3]:
        raise WdstreamError(
            "the input changed since the interrupted pack (no document at the recorded "
            f"position {tuple(resume.start[:3])}); use --overwrite (overwrite=True in Python)"
        )
    flat, lens, dropped = builder.resume(flat, lens, resume.emitted)
    return flat, lens, positions[dropped:]
