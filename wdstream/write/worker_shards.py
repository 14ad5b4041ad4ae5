"""Shards built in the token pool's workers: the packing process lays out and commits only.

The local engine's usual pipeline brings every token back to the packing process, which
cuts samples, encodes tar members, hashes and writes the shards: ~0.8 s of its CPU per
100 MB of text, serial however many workers tokenise (``docs/PACK.md``, "Shards built in
the workers"). For a fresh pack whose layout follows from document lengths alone (concat
and docs packs of plain text with an EOS or BOS), this pipeline instead keeps each batch's
tokens in a shared-memory segment the worker that encoded it fills, and hands the packing
process only the documents' lengths::

    packing process: read blocks -> settle positions -> SpanLayout (lengths) -> commit in order
    workers:         parse + tokenise a block -> tokens into shared memory, lengths back
                     write a shard: gather its span, sample builder, ShardWriter (tar, sha256)

The shard tasks are the Ray engine's own (:func:`wdstream.ray.tasks.write_shard` over a
:class:`~wdstream.ray.spans.SpanLayout` plan), which run the local engine's sample builder
and :class:`~wdstream.write.shards.ShardWriter`, so the bytes are the usual pipeline's
(``tests/test_worker_shards.py`` compares them). Commits stay in shard order in this process;
on an error the shards already handed to workers finish and commit first, as the shard
writer's queue does. A segment is unlinked once every shard reading it is written; a
killed pack's segments are unlinked by its resource tracker. Everything else (resume,
rules, a held-out split, masks, best-fit rows, records from Python, threads, an object
store as the output) takes the usual pipeline.
"""

from __future__ import annotations

import bisect
import os
import sys
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import count
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from wdstream.errors import WdstreamError
from wdstream.format.index import ShardEntry
from wdstream.format.sample import DTYPES
from wdstream.inputs import DocumentReader, InputPosition
from wdstream.inputs.blocks import LineBlock
from wdstream.ray.layout import CutShard
from wdstream.ray.spans import SpanLayout, driver_layout
from wdstream.ray.tasks import ShardJob, write_shard
from wdstream.storage import Store
from wdstream.write import tokenpool
from wdstream.write.encoders import TextEncoder
from wdstream.write.engine import InputTotals, PackJob
from wdstream.write.full_disk import naming_full_disk
from wdstream.write.journal import Journal
from wdstream.write.progress import Progress
from wdstream.write.resume import ResumePoint
from wdstream.write.shards import shard_names
from wdstream.write.tokenpool import Starter, TokenPool

__all__ = ["run_in_workers", "workers_can_write"]

_SHM = "/dev/shm"  # noqa: S108 - where Linux's shared memory lives, to check its room
_names = count()


def workers_can_write(
    job: PackJob, resume: ResumePoint, journal: Journal, workers: int, pool: str, blocks: bool
) -> bool:
    """Whether this pack takes the workers' shards: a fresh pack (no journal entry) of line
    files (``blocks``) into plain text documents, no document rules, a process pool, a
    layout from lengths, and room in shared memory for the tokens in flight."""
    if not blocks or workers <= 0 or pool == "threads" or sys.platform != "linux":
        return False
    if resume.start is not None or journal.entries or job.new_rules is not None:
        return False
    if type(job.document_encoder()) is not TextEncoder or _local_path(job.output) is None:
        return False
    if not isinstance(driver_layout(job, (0, 0, 0), 0, lambda d: None), SpanLayout):
        return False
    try:
        room = os.statvfs(_SHM)
    except OSError:
        return False
    # In flight at most: the batches being encoded and the pieces of the shards out.
    return room.f_bavail * room.f_frsize >= 4 * job.shard_bytes + (256 << 20)


def _local_path(output: str) -> str | None:
    """``output``'s absolute path when it is a local folder, else None. Object stores keep
    the usual pipeline: the workers fork from a server started with the environment of the
    pack's start (or of an earlier pack), so credentials set since would not reach them."""
    scheme = output.split("://", 1)[0].lower() if "://" in output else ""
    if scheme not in ("", "file"):
        return None
    return os.path.abspath(output[len("file://") :] if scheme == "file" else output)


def _segment(name: str, flat: np.ndarray) -> None:
    """Create segment ``name`` holding ``flat`` (its pages reserved first: a full
    ``/dev/shm`` is an ``OSError`` here, not a ``SIGBUS`` while copying)."""
    shm = shared_memory.SharedMemory(name, create=True, size=max(1, flat.nbytes))
    try:
        os.posix_fallocate(shm._fd, 0, max(1, flat.nbytes))  # type: ignore[attr-defined]
        np.frombuffer(_buffer(shm), dtype=flat.dtype, count=len(flat))[:] = flat
    except OSError as exc:
        shm.close()
        shm.unlink()
        raise WdstreamError(
            f"no room in {_SHM} for a batch's tokens ({flat.nbytes} bytes): {exc}"
        ) from exc
    shm.close()


def _encode_block(block: LineBlock, name: str) -> tuple[bytes, Any]:
    """In a worker: parse and tokenise ``block``, its tokens into segment ``name``; return
    the documents' lengths and the block's numbering."""
    assert tokenpool._worker is not None, "worker not initialised"
    out, parsed = tokenpool._run_task(*tokenpool._worker, block)
    _segment(name, out.flat)
    return out.lens.tobytes(), parsed


def _write_shard(
    job: ShardJob, plan: Any, names: list[str], sizes: list[int], shown: str
) -> dict[str, Any]:
    """In a worker: write one laid-out shard from the segments holding its tokens (a full
    disk named ``shown``, the tar's URL as the packing process shows it)."""
    shms = [shared_memory.SharedMemory(n) for n in names]
    arrays = [
        np.frombuffer(_buffer(s), dtype=DTYPES[job.dtype], count=k)
        for s, k in zip(shms, sizes, strict=True)
    ]
    try:
        with naming_full_disk(shown):
            return write_shard(job, plan, *arrays)
    finally:
        arrays.clear()
        for s in shms:
            try:
                s.close()
            except BufferError:  # a view held by an error's traceback: unmapped when freed
                pass


def _buffer(shm: shared_memory.SharedMemory) -> memoryview:
    assert shm.buf is not None, "an open segment has its buffer"
    return shm.buf


def _unlink(name: str) -> None:
    try:
        shared_memory.SharedMemory(name).unlink()
    except FileNotFoundError:
        pass


def run_in_workers(
    job: PackJob,
    store: Store,
    journal: Journal,
    reader: DocumentReader,
    workers: int,
    bar: Progress,
) -> InputTotals:
    """Pack ``reader``'s blocks with shards built in ``workers`` processes (see the module);
    ``store`` is the output as this process opened it (only its URLs are used here)."""
    encoder = job.document_encoder()
    parser = reader.block_parser()
    executor = tokenpool.process_pool(workers, job.tokenizer, encoder, parser)
    run = _Run(job, store, journal, reader, executor, workers, bar)
    try:
        run.pack()
    finally:
        run.starter.thread.join()  # never shut the pool down under a submitting thread
        executor.shutdown(wait=True, cancel_futures=True)
        for name in run.segments.values():
            _unlink(name)
    return InputTotals(
        reader.empty, reader.bad, reader.input_bytes, reader.documents,
        list(reader.bad_locations), workers, "processes", {},
    )  # fmt: skip


class _Run:
    """One pack's state: batches out, pieces laid out, shards out, segments alive."""

    def __init__(
        self,
        job: PackJob,
        store: Store,
        journal: Journal,
        reader: DocumentReader,
        executor: ProcessPoolExecutor,
        workers: int,
        bar: Progress,
    ) -> None:
        self.job, self.journal, self.reader, self.executor, self.bar = (
            job, journal, reader, executor, bar,
        )  # fmt: skip
        self.ahead = 2 * workers + 1
        self.starter = Starter(executor, workers)
        self.store = store
        path = _local_path(job.output)
        assert path is not None, "workers_can_write checked the output"
        self.shard_job = ShardJob(
            path, job.store_options, job.name, job.shard_bytes, job.shard_samples,
            job.provenance, job.dtype, job.pad_id,
        )  # fmt: skip
        layout = driver_layout(job, (0, 0, 0), 0, self._position)
        assert isinstance(layout, SpanLayout), "workers_can_write checked the layout"
        self.layout: SpanLayout = layout
        self.segments: dict[int, str] = {}  # piece -> its segment's name, while alive
        self.sizes: dict[int, int] = {}  # piece -> its tokens
        self.left: dict[int, int] = {}  # piece -> tokens not yet in a handed-out shard
        self.last_shard: dict[int, int] = {}  # piece -> the last shard reading it
        self.positions: dict[int, list[InputPosition]] = {}  # piece -> its documents'
        self.piece_starts: list[int] = []  # first global token of each piece
        self.doc_starts: list[int] = []  # first run document of each piece
        self.shards: dict[int, tuple[Future[dict[str, Any]], CutShard]] = {}
        self.tokens = self.docs = 0

    def pack(self) -> None:
        """Encode the blocks, lay out and hand out shards, commit them; while the workers
        start, blocks are encoded here (as :class:`TokenPool` does, unless its
        ``inline_while_starting`` is off), their tokens into segments of this process."""
        batches: deque[tuple[int, tuple[int, int | None], Future[tuple[bytes, Any]]]] = deque()
        starter: Starter | None = self.starter
        inline = TokenPool.inline_while_starting
        try:
            for i, block in enumerate(self.reader.blocks(self.job.batch_bytes)):
                name = f"wds{os.getpid()}_{next(_names)}"
                self.segments[i] = name
                meta = (block.file, block.record)
                if starter is not None and inline and not batches and not starter.ready():
                    self._lay_out(i, meta, self._encode_here(block, name))
                    continue
                if starter is not None:
                    starter.join()
                    starter = None
                batches.append((i, meta, self._submit(_encode_block, block, name)))
                if len(batches) >= self.ahead:
                    j, m, fut = batches.popleft()
                    self._lay_out(j, m, _result(fut))
            while batches:
                j, m, fut = batches.popleft()
                self._lay_out(j, m, _result(fut))
            self.reader.finished()
            for cut in self.layout.close(self.piece_starts):
                self._hand_out(cut)
            self._commit(wait=True)
        except BaseException:
            self._finish_handed_out()
            raise

    def _encode_here(self, block: LineBlock, name: str) -> tuple[bytes, Any]:
        """:func:`_encode_block` in this process, with the pack's own tokenizer."""
        job = self.job
        out, parsed = tokenpool._run_task(
            job.tokenizer, job.document_encoder(), self.reader.block_parser(), block
        )
        _segment(name, out.flat)
        return out.lens.tobytes(), parsed

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        try:
            return self.executor.submit(fn, *args)
        except BrokenProcessPool as exc:
            raise WdstreamError(tokenpool._BROKEN_POOL) from exc

    def _lay_out(self, i: int, meta: tuple[int, int | None], encoded: tuple[bytes, Any]) -> None:
        """Number batch ``i``'s documents (``encoded``: their lengths and the block's
        numbering), lay them out, hand out the shards they close."""
        lens_bytes, parsed = encoded
        positions = self.reader.settle(meta, parsed)
        lens = np.frombuffer(lens_bytes, dtype=np.int64)
        ntok = int(lens.sum())
        self.piece_starts.append(self.tokens)
        self.doc_starts.append(self.docs)
        self.sizes[i] = self.left[i] = ntok
        if not ntok:
            _unlink(self.segments.pop(i))
        else:
            self.positions[i] = positions
            records = np.fromiter((p[1] for p in positions), np.int64, len(positions))
            cuts = self.layout.add(
                self.tokens, lens, self.docs, positions[0][0], records, 0, self.piece_starts
            )
            for cut in cuts:
                self._hand_out(cut)
        self.tokens += ntok
        self.docs += len(lens)
        self.bar.update(self.reader.source_bytes, len(lens), ntok)
        self._commit(wait=False)

    def _position(self, doc: int) -> InputPosition:
        piece = bisect.bisect_right(self.doc_starts, doc) - 1
        return self.positions[piece][doc - self.doc_starts[piece]]

    def _hand_out(self, cut: CutShard) -> None:
        """Submit a laid-out shard to a worker; a piece's positions go once all its tokens
        are in handed-out shards."""
        for p, n in cut.tokens_per_piece.items():
            self.left[p] -= n
            self.last_shard[p] = cut.plan.index
            if not self.left[p]:
                self.positions.pop(p, None)
        names = [self.segments[p] for p in cut.pieces]
        sizes = [self.sizes[p] for p in cut.pieces]
        shown = self.store.child_url(shard_names(self.job.name, cut.plan.index)[0])
        fut = self._submit(_write_shard, self.shard_job, cut.plan, names, sizes, shown)
        self.shards[cut.plan.index] = (fut, cut)
        while len(self.shards) >= self.ahead:
            self._commit(wait=True, one=True)

    def _commit(self, wait: bool, one: bool = False) -> None:
        """Commit written shards to the journal in shard order, as far as they go (all of
        them with ``wait``, or just the next with ``one``); unlink the segments no shard
        still needs."""
        while self.shards:
            nxt = len(self.journal.entries)
            fut, cut = self.shards[nxt]
            if not wait and not fut.done():
                return
            entry = ShardEntry(**_result(fut))
            self.journal.commit(entry, cut.end, self.reader.bad_locations)
            del self.shards[nxt]
            done = [p for p, s in self.last_shard.items() if s <= nxt and not self.left[p]]
            for p in done:
                del self.last_shard[p]
                _unlink(self.segments.pop(p))
            if one:
                return

    def _finish_handed_out(self) -> None:
        """After an error: commit the shards already handed out, in order, as far as they
        were written (a rerun resumes after them); their own errors give way to the one
        being raised."""
        try:
            self._commit(wait=True)
        except BaseException:  # noqa: BLE001, S110 - the first error is the one to report
            for fut, _ in self.shards.values():
                fut.exception()


def _result(fut: Future[Any]) -> Any:
    try:
        return fut.result()
    except BrokenProcessPool as exc:
        raise WdstreamError(tokenpool._BROKEN_POOL) from exc
