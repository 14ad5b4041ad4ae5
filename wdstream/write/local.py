"""The local engine of ``pack``: tokenise in this machine's processes, write in order.

Pipeline (one packing thread, tokenisation in a pool, writes in a background thread)::

    DocumentReader (files; a RecordReader for records) -> batches (~1 MB)
        -> TokenPool (ordered, the job's DocumentEncoder) -> DocumentRules
        -> sample builder -> ShardWriter -> Store (provenance, sidecar, tar, then journal)

Line files (JSON Lines, text lines) go as raw blocks of lines instead of documents: the pool's
workers parse them, and the reader numbers what they found in order (``reader.settle``), so
the packing process never parses JSON (:mod:`wdstream.inputs.blocks`).

Packing depends only on the token stream, never on batch or worker boundaries, so the
shards are byte-identical for any worker count and to the Ray engine's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from wdstream.errors import WdstreamError
from wdstream.format.sample import DTYPES
from wdstream.inputs import DocumentReader, InputPosition
from wdstream.inputs.blocks import LineBlock
from wdstream.storage import Store
from wdstream.write.builders import SampleBuilder
from wdstream.write.docrules import DocumentRules
from wdstream.write.engine import InputTotals, PackJob
from wdstream.write.journal import Journal
from wdstream.write.progress import Progress
from wdstream.write.resume import ResumePoint, drop_packed
from wdstream.write.shards import ShardWriter
from wdstream.write.sources import open_reader
from wdstream.write.tokenpool import TokenPool

__all__ = ["LocalEngine"]


class LocalEngine:
    """:class:`~wdstream.write.engine.PackEngine` on this machine.

    Args:
        workers: parallel tokenisers (0: in the packing thread).
        pool: ``auto``, ``threads`` or ``processes`` (:func:`wdstream.write.tokenpool.prestart`
            boots a process pool's fork server early; :func:`wdstream.pack` calls it first
            thing, before the output is even locked).
    """

    def __init__(self, workers: int, pool: str) -> None:
        self.workers, self.pool = workers, pool

    def run(self, job: PackJob, store: Store, journal: Journal, resume: ResumePoint) -> InputTotals:
        """Read, tokenise, build samples and write shards; see :class:`PackEngine`."""
        reader = open_reader(job, resume)
        entries = journal.entries
        writer = ShardWriter(
            store,
            job.name,
            job.shard_bytes,
            job.shard_samples,
            first_shard=len(entries),
            first_sample=sum(e.samples for e in entries),
            on_commit=lambda entry, end: journal.commit(entry, end, reader.bad_locations),
            provenance=job.provenance,
            first_doc=sum(e.documents for e in entries),
            doc_offset=resume.emitted,
        )
        parser = reader.block_parser()
        tpool = TokenPool(
            job.tokenizer, self.workers, self.pool, job.document_encoder(), parser=parser
        )
        rules = job.new_rules(resume.start) if job.new_rules is not None else None
        builder = job.new_builder(DTYPES[job.dtype], job.pad_id)
        bar = Progress(job.progress, reader.source_total, lambda: len(journal.entries))
        tasks = _blocks(reader, job.batch_bytes) if parser else _batches(reader, job.batch_bytes)
        _write_shards(tpool, tasks, reader, rules, builder, writer, bar, resume)
        return InputTotals(
            reader.empty, reader.bad, reader.input_bytes, reader.documents,
            list(reader.bad_locations), tpool.workers, tpool.kind,
            rules.counts() if rules is not None else {},
        )  # fmt: skip

    def close(self) -> None:
        """Nothing to release: the token pool closes when its run ends."""


def _batches(
    reader: DocumentReader, batch_chars: int, max_docs: int = 8192
) -> Iterator[tuple[list[Any], list[InputPosition]]]:
    texts: list[Any] = []
    positions: list[InputPosition] = []
    size = 0
    for text, pos in reader:
        texts.append(text)
        positions.append(pos)
        size += len(text)
        if size >= batch_chars or len(texts) >= max_docs:
            yield texts, positions
            texts, positions, size = [], [], 0
    if texts:
        yield texts, positions


def _blocks(
    reader: DocumentReader, block_bytes: int
) -> Iterator[tuple[LineBlock, tuple[int, int | None]]]:
    """The inputs as raw blocks of lines (parsed in the token pool), each with what
    :meth:`DocumentReader.settle` needs of it."""
    for block in reader.blocks(block_bytes):
        yield block, (block.file, block.record)


def _write_shards(
    tpool: TokenPool,
    tasks: Iterator[tuple[Any, Any]],
    reader: DocumentReader,
    rules: DocumentRules | None,
    builder: SampleBuilder,
    writer: ShardWriter,
    bar: Progress,
    resume: ResumePoint,
) -> None:
    """Run the pipeline: read, encode (``tasks``: batches of documents with their
    positions, or blocks of lines with their file, numbered here once parsed), apply the
    document rules, build samples, write shards; wait for the last.

    On resume the first document's tokens already in committed shards are dropped. On any
    error the shards already queued still finish and commit, the partial one is dropped.
    """
    try:
        first = True
        for meta, batch, parsed in tpool.map(tasks):
            positions = meta if parsed is None else reader.settle(meta, parsed)
            if not positions:
                continue  # a block of blank, empty or bad lines
            flat, lens = batch.flat, batch.lens
            if rules is not None:
                flat, lens, positions = rules.apply(batch, positions)
                if not len(lens):
                    continue
            if first and resume.start is not None:
                flat, lens, positions = drop_packed(flat, lens, positions, resume, builder)
            first = False
            for s in builder.add(flat, lens, positions):
                writer.add(s.tokens, s.doc_lens, s.cont, s.new_docs, s.end, s.starts, s.offset)
            bar.update(reader.source_bytes, len(lens), len(flat))
        reader.finished()
        if first and resume.start is not None:
            raise WdstreamError("the input changed since the interrupted pack; use --overwrite")
        for s in builder.flush():
            writer.add(s.tokens, s.doc_lens, s.cont, s.new_docs, s.end, s.starts, s.offset)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        tpool.close()
        bar.close()
