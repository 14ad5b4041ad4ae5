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

from wdstream.format.sample import DTYPES
from wdstream.inputs import DocumentReader, InputPosition
from wdstream.inputs.blocks import LineBlock
from wdstream.storage import Store
from wdstream.write.docrules import DocumentRules
from wdstream.write.engine import InputTotals, PackJob
from wdstream.write.holdout import HoldoutTarget, Side, earliest, route
from wdstream.write.journal import Journal
from wdstream.write.progress import Progress
from wdstream.write.resume import ResumePoint
from wdstream.write.shards import ShardWriter
from wdstream.write.sources import open_reader
from wdstream.write.tokenpool import TokenPool
from wdstream.write.worker_shards import run_in_workers, workers_can_write

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
        self.held_supervised = 0  # a masked pack's held-out supervised tokens (see run)

    def run(
        self,
        job: PackJob,
        store: Store,
        journal: Journal,
        resume: ResumePoint,
        holdout: HoldoutTarget | None = None,
    ) -> InputTotals:
        """Read, tokenise, build samples and write shards; see :class:`PackEngine`.

        ``holdout``: send that fraction of the documents to a second dataset
        (:mod:`wdstream.write.holdout`); the inputs are then read from the earlier of the
        two datasets' resume points. :attr:`held_supervised` is then the held-out
        dataset's count of supervised tokens (masked packs), and the totals' own count
        the training dataset's.
        """
        start = earliest(resume, holdout.resume) if holdout is not None else resume
        reader = open_reader(job, start)
        blocks = reader.block_parser() is not None
        if holdout is None and workers_can_write(
            job, resume, journal, self.workers, self.pool, blocks
        ):
            bar = Progress(job.progress, reader.source_total, lambda: len(journal.entries))
            try:
                return run_in_workers(job, store, journal, reader, self.workers, bar)
            finally:
                bar.close()
        builder = job.new_builder(DTYPES[job.dtype], job.pad_id)
        encoder = job.document_encoder()
        masked = holdout is not None and encoder.masked
        sides = [Side(builder, _shard_writer(job, store, journal, resume, reader), resume, masked)]
        if holdout is not None:
            writer = _shard_writer(
                job, holdout.store, holdout.journal, holdout.resume, reader, holdout.shard_bytes
            )
            held_builder = job.new_builder(DTYPES[job.dtype], job.pad_id)
            sides.append(Side(held_builder, writer, holdout.resume, masked))
        parser = reader.block_parser()
        tpool = TokenPool(job.tokenizer, self.workers, self.pool, encoder, parser=parser)
        rules = job.new_rules(start.start) if job.new_rules is not None else None
        bar = Progress(job.progress, reader.source_total, lambda: len(journal.entries))
        tasks = _blocks(reader, job.batch_bytes) if parser else _batches(reader, job.batch_bytes)
        fraction = holdout.fraction if holdout is not None else None
        _write_shards(tpool, tasks, reader, rules, sides, fraction, bar)
        counts = rules.counts() if rules is not None else {}
        if masked and "supervised_tokens" in counts:
            counts["supervised_tokens"] = sides[0].supervised
            self.held_supervised = sides[1].supervised
        return InputTotals(
            reader.empty, reader.bad, reader.input_bytes, reader.documents,
            list(reader.bad_locations), tpool.workers, tpool.kind, counts,
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


def _shard_writer(
    job: PackJob,
    store: Store,
    journal: Journal,
    resume: ResumePoint,
    reader: DocumentReader,
    shard_bytes: int | None = None,
) -> ShardWriter:
    """The shard writer of one dataset, continuing what its journal committed."""
    entries = journal.entries
    return ShardWriter(
        store,
        job.name,
        shard_bytes or job.shard_bytes,
        job.shard_samples,
        first_shard=len(entries),
        first_sample=sum(e.samples for e in entries),
        on_commit=lambda entry, end: journal.commit(entry, end, reader.bad_locations),
        provenance=job.provenance,
        first_doc=sum(e.documents for e in entries),
        doc_offset=resume.emitted,
    )


def _write_shards(
    tpool: TokenPool,
    tasks: Iterator[tuple[Any, Any]],
    reader: DocumentReader,
    rules: DocumentRules | None,
    sides: list[Side],
    fraction: float | None,
    bar: Progress,
) -> None:
    """Run the pipeline: read, encode (``tasks``: batches of documents with their
    positions, or blocks of lines with their file, numbered here once parsed), apply the
    document rules, send each document to its dataset's side (``sides[1]``: the held-out
    documents, with ``fraction``), build samples, write shards; wait for the last.

    On resume each side drops what its committed shards hold (:class:`Side`). On any error
    the shards already queued still finish and commit, the partial ones are dropped.
    """
    try:
        for meta, batch, parsed in tpool.map(tasks):
            positions = meta if parsed is None else reader.settle(meta, parsed)
            if not positions:
                continue  # a block of blank, empty or bad lines
            flat, lens = batch.flat, batch.lens
            if rules is not None:
                flat, lens, positions = rules.apply(batch, positions)
                if not len(lens):
                    continue
            if fraction is None:
                sides[0].add(flat, lens, positions)
            else:
                route(flat, lens, positions, fraction, sides)
            bar.update(reader.source_bytes, len(lens), len(flat))
        reader.finished()
        for side in sides:
            side.finish()
    except BaseException:
        for side in sides:
            side.writer.abort()
        raise
    finally:
        tpool.close()
        bar.close()
