"""The engine interface of ``pack``: what turns a job's inputs into committed shards.

:func:`wdstream.pack` does everything around the engine once for all engines (validate,
lock, load the tokenizer, read the journal, commit ``index.json``); an engine only runs the
pipeline between the inputs and the journal::

    pack()  ─ lock, tokenizer, ResumePoint ─►  engine.run(job, store, journal, resume)
                                                 local: processes on this machine
                                                 ray:   tasks on a Ray cluster
            ◄─ InputTotals (counters for index.json's stats) ─ shards committed in order
    commit_dataset: index.json, journal removed

Engines: :class:`wdstream.write.local.LocalEngine` and
:class:`wdstream.ray.engine.RayEngine` (imported only when asked for).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from wdstream.inputs import InputFile, InputPosition
from wdstream.inputs.lines import DEFAULT_MAX_RECORD_BYTES
from wdstream.inputs.records import RecordDocument
from wdstream.storage import Store
from wdstream.tokenizers import Tokenizer
from wdstream.write.builders import SampleBuilder
from wdstream.write.docrules import DocumentRules
from wdstream.write.encoders import DocumentEncoder, TextEncoder
from wdstream.write.journal import Journal
from wdstream.write.resume import ResumePoint

__all__ = ["InputTotals", "PackEngine", "PackJob"]


@dataclass(frozen=True)
class PackJob:
    """Everything an engine needs from :func:`wdstream.pack`, already resolved."""

    files: list[InputFile]
    text_key: str
    lines: bool
    on_error: str
    errors: str
    tokenizer: Tokenizer
    bos_id: int | None
    eos_id: int | None
    dtype: str
    new_builder: Callable[[np.dtype, int], SampleBuilder]  # the sample builder (dtype, pad id)
    pad_id: int  # token written into padding (best-fit)
    name: str
    shard_bytes: int
    shard_samples: int | None
    output: str
    store_options: dict[str, Any]
    provenance: list[str] | None  # input names for the .prov tables (None: none)
    progress: bool
    batch_bytes: int = 1 << 20  # local engine: characters of text per tokenisation batch
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES  # a longer record is a bad record
    # What a JSON record's document is (None: the text at text_key), what documents become
    # (stored tokens), and the rules between the two (None: none); masked packs: local only.
    document: RecordDocument | None = None
    encoder: DocumentEncoder | None = None  # None: TextEncoder(bos_id, eos_id, dtype)
    new_rules: Callable[[InputPosition | None], DocumentRules] | None = None
    # Records given from Python (pack_records, Writer), read in place of ``files`` (which
    # then names them); local engine only (wdstream.write.sources.open_reader).
    records: Iterable[Any] | None = None

    def document_encoder(self) -> DocumentEncoder:
        """The encoder of this job's documents."""
        return self.encoder or TextEncoder(self.bos_id, self.eos_id, self.dtype)


@dataclass
class InputTotals:
    """The input counters over the whole run (for ``index.json``'s stats), and what ran it."""

    empty: int = 0
    bad: int = 0
    input_bytes: int = 0
    documents: int = 0
    bad_locations: list[str] = field(default_factory=list)
    workers: int = 0  # local: tokenising workers; ray: the cluster's CPUs at the start
    pool: str = ""  # "threads", "processes", "serial" or "ray"
    rule_counts: dict[str, int] = field(default_factory=dict)  # DocumentRules.counts()


class PackEngine(Protocol):
    """Runs a pack's pipeline: tokenise, build samples, write shards, commit each to the
    journal in shard order. Created when the pack starts (so it can warm up while the
    tokenizer loads) and closed when the pack ends, however it ends."""

    def run(self, job: PackJob, store: Store, journal: Journal, resume: ResumePoint) -> InputTotals:
        """Write every shard from ``resume`` on, committing each to ``journal`` in order.

        Raises:
            InputError: bad input, naming file and line.
            WdstreamError: the input changed since the interrupted pack.
        """
        ...

    def close(self) -> None:
        """Release what the engine started (worker pools, a Ray instance it started)."""
        ...
