"""``pack(..., engine="ray")``: tokenise on a Ray cluster's workers, write shards from them.

The driver (the process that called :func:`wdstream.pack`) holds the writer lock, the
journal and ``index.json`` exactly as with the local engine: :class:`RayEngine` is a
:class:`~wdstream.write.engine.PackEngine`, and replaces only the pipeline between the
inputs and the journal::

    driver                                   workers
    split inputs into pieces  ───────────►   tokenize_piece: read + tokenise a piece
    (files, byte ranges)                      -> PieceDocs (small, to the driver)
                                              -> token array (stays in the object store)
    per piece, in input order: sample and
      shard cuts from document lengths
      (SpanLayout) -> shard plan  ──────────►   write_shard: gather the plan's tokens, the
                                              local sample builder, ShardWriter -> store
    commit shards to the journal in order ◄─   index entry (sha256 of what it wrote)

Until the first tokenising task returns (a job's workers are new processes), the driver
tokenises small pieces itself (:mod:`~wdstream.ray.start_help`), laid out in input order.

At most a few pieces per CPU are tokenised ahead of the driver and a few shards per CPU are
being written, so memory (the driver's and the object store's) stays flat in corpus size: a
piece's tokens are released once every shard holding them has been handed to its task.

Faults: a task whose worker (or node) dies is retried by Ray (its object lost with a node is
rebuilt from lineage); a shard task writes through the store's atomic writes, so a killed
one leaves no shard visible and its retry writes the same bytes. A killed driver leaves the
journal naming the shards committed in order, and the rerun resumes after them, first
checking each kept shard against its sha256 on the cluster. See ``docs/RAY.md``.
"""

from __future__ import annotations

import bisect
import signal
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from wdstream.errors import InputError, WdstreamError
from wdstream.format.index import ShardEntry
from wdstream.inputs import InputFile, InputPosition
from wdstream.ray.layout import CutShard, SampleLayout
from wdstream.ray.liveness import get_watched
from wdstream.ray.pieces import InputPiece, PieceDocs, split_pieces
from wdstream.ray.spans import SpanLayout, driver_layout, drop_resumed
from wdstream.ray.start_help import StartHelp
from wdstream.ray.tasks import (
    PieceJob,
    ShardJob,
    check_shard,
    driver_encoder,
    shipped_recipe,
    tokenize_piece,
    warm_up,
    write_shard,
)
from wdstream.storage import Store, open_store
from wdstream.write.encoders import TextEncoder
from wdstream.write.engine import InputTotals, PackJob
from wdstream.write.journal import Journal
from wdstream.write.progress import Progress
from wdstream.write.resume import ResumePoint, drop_packed

__all__ = ["RayEngine", "write_tokenized"]

_MAX_LOCATIONS = 10  # skipped-record locations kept, as DocumentReader keeps
_MIN_PIECE, _MAX_PIECE = 256 << 10, 64 << 20  # bytes of input per tokenising task
_PIECES_PER_CPU = 8  # pieces per CPU over the whole input (more: better balance, more tasks)
_AHEAD_PER_CPU = 2  # tasks of each kind in flight per CPU
_RETRIES = 5  # per task, on a worker or node dying (Ray's system failures)


@dataclass
class _Placed:
    """A tokenised piece's documents placed in the run: where their numbers start."""

    docs: PieceDocs
    file: int
    first_doc: int  # global number (in this run) of its first document
    record: int  # record number its relative ones count from
    empty: int  # counters before it
    bad: int
    input_bytes: int


class RayEngine:
    """:class:`~wdstream.write.engine.PackEngine` on a Ray cluster.

    Ray is connected (or started) when the pack begins, and each CPU's worker imports the
    task code (and loads a bpe-openai binding or tokenizer file) at once, while the driver
    loads its own tokenizer. Each worker's first task otherwise paid both (~0.45 s on the
    bench corpus's 2.4 s pack) while the driver waited. A tiktoken encoding's ranks the
    driver ships once (:func:`~wdstream.ray.tasks.shipped_recipe`).

    Args:
        address: ``None``: a Ray instance already initialised in this process, else
            ``ray.init()``'s own choice (``RAY_ADDRESS``, a cluster started on this machine
            with ``ray start``, else a new local one); ``"auto"``: the running cluster;
            ``"ray://host:port"``.
        tokenizer: the pack's tokenizer spec and backend, as :func:`load_tokenizer` takes them.
    """

    def __init__(self, address: str | None, tokenizer: tuple[str, str]) -> None:
        self.started = not ray.is_initialized()
        # ray.init replaces the process's SIGTERM handler with one raising SystemExit, and
        # ray.shutdown leaves it: a process forked later (a DataLoader or pool worker) would
        # then run Python on SIGTERM instead of ending (a pool's terminate() hung on it).
        self._sigterm = signal.getsignal(signal.SIGTERM)
        if self.started:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        warm = ray.remote(num_cpus=1, max_retries=0)(warm_up)
        for _ in range(cpus):
            warm.remote(*tokenizer)  # not awaited: it only fills the worker's caches

    def run(self, job: PackJob, store: Store, journal: Journal, resume: ResumePoint) -> InputTotals:
        """Pack ``job`` on the cluster, committing every shard to ``journal`` in order
        (shard tasks write to ``job.output`` themselves; ``store`` is the driver's view).

        Raises:
            InputError: as the local engine raises it, naming file and line.
            WdstreamError: the input changed since the interrupted pack, a kept shard no
                longer matches its sha256, or a part of Ray itself failed (a raylet or
                other system process killed, an object lost for good): the message says
                what, and that rerunning the same command resumes after the shards
                committed so far.
            ValueError: the job's documents are not text (pre-tokenized, masked, or with a
                long-document rule): the Ray tasks tokenise text only.
        """
        text = isinstance(job.document_encoder(), TextEncoder)  # pack's own text encoder
        if job.document is not None or not text or job.new_rules is not None:
            raise ValueError(
                "engine='ray' packs text only: pre-tokenized and masked documents and "
                "--long-docs need engine='local'"
            )
        try:
            return _Driver(job, journal, resume).run()
        except ray.exceptions.RayTaskError:
            raise  # a task's own error that is not an Exception: Ray's wrapper says it best
        except ray.exceptions.RayError as exc:
            raise WdstreamError(_cluster_failed(exc)) from exc

    def close(self) -> None:
        """Shut down a Ray instance this engine started (one it found is left running),
        and give the process back the SIGTERM handler it had."""
        if self.started:
            ray.shutdown()
            # None: a handler not set from Python, which cannot be put back from here.
            main = threading.current_thread() is threading.main_thread()
            if main and self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)


def write_tokenized(
    job: PackJob, journal: Journal, given: list[tuple[PieceDocs, Any]]
) -> InputTotals:
    """Lay out and write pieces tokenised elsewhere (the Ray Data sink's blocks), in order.

    ``given``: each piece's documents and the object reference of its token array; the
    documents' records count rows, and ``job.files`` names the one pseudo input.
    """
    pieces = [InputPiece(0, 0, None, False, None, 0) for _ in given]
    driver = _Driver(job, journal, ResumePoint(), pieces)
    return driver.run(iter((i, docs, ref) for i, (docs, ref) in enumerate(given)))


def _get(ref: Any) -> Any:
    """``ray.get`` with the driver's raylet watched (:mod:`~wdstream.ray.liveness`),
    raising a task's own error (a write that failed names its object) rather than Ray's
    wrapper around it."""
    try:
        return get_watched(ref)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, Exception):
            raise exc.cause from exc
        raise


def _system_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of Ray itself (a raylet or other system process gone,
    an object lost), not of a task.

    After one, the driver does not wait for the tasks still out: they may never end (their
    raylet is dead; Ray resubmits the lost objects' tasks), and a driver whose raylet died
    is ended by Ray itself soon after (status 1, nothing printed), so the one-line error
    must be raised before that. A rerun resumes after the shards committed so far."""
    return isinstance(exc, ray.exceptions.RayError) and not isinstance(
        exc, ray.exceptions.RayTaskError
    )


def _cluster_failed(exc: BaseException) -> str:
    """One line for a failure of Ray itself (not of a task): what failed, and what to do."""
    said = (str(exc).strip().splitlines() or [""])[0]
    return (
        f"the Ray cluster failed during the pack ({type(exc).__name__}: {said}); the shards "
        "committed so far are kept: rerun the same command (on a working cluster) to resume"
    )


def _piece_bytes(files: list[InputFile], cpus: int) -> int:
    total = sum(f.size or 0 for f in files)
    return int(min(_MAX_PIECE, max(_MIN_PIECE, total // (_PIECES_PER_CPU * cpus))))


class _Driver:
    """One Ray pack: submits tasks, lays out shards in input order, commits them in order."""

    def __init__(
        self, job: PackJob, journal: Journal, resume: ResumePoint,
        pieces: list[InputPiece] | None = None,
    ) -> None:  # fmt: skip
        self.job, self.journal, self.resume = job, journal, resume
        start = resume.start
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.ahead = _AHEAD_PER_CPU * cpus + 1
        if pieces is None:
            pieces = split_pieces(job.files, _piece_bytes(job.files, cpus), job.lines, start)
        self.pieces = pieces
        at = start or InputPosition(0, 0, 0, 0, 0, 0)
        self.totals = InputTotals(
            at.empty, at.bad, at.input_bytes, 0, list(resume.bad_locations), cpus, "ray"
        )
        entries = journal.entries
        first = (len(entries), sum(e.samples for e in entries), sum(e.documents for e in entries))
        self.layout = driver_layout(job, first, resume.emitted, self._position)
        self.piece_starts: list[int] = []  # global first token of each piece laid out
        self.doc_starts: list[int] = []  # global first document of each piece laid out
        self.placed: dict[int, _Placed] = {}
        self.token_refs: dict[int, Any] = {}
        self.left: dict[int, int] = {}  # tokens of a piece not yet in a submitted shard
        self.line_base: dict[int, int] = {}  # per file: record number of the next range
        self.pending: dict[int, tuple[Any, CutShard]] = {}  # shard number -> task, layout
        self.tokens = self.docs = 0
        self._tokenize = ray.remote(num_cpus=1, num_returns=2, max_retries=_RETRIES)(tokenize_piece)
        self._write = ray.remote(num_cpus=1, max_retries=_RETRIES)(write_shard)
        self._check = ray.remote(num_cpus=1, max_retries=_RETRIES)(check_shard)

    def run(self, given: Iterator[tuple[int, Any, Any]] | None = None) -> InputTotals:
        """Tokenise the pieces (unless ``given`` their results), lay out, write, commit."""
        job = self.job
        checks = [
            self._check.remote(job.output, job.store_options, dict(e.__dict__))
            for e in self.journal.entries
        ]
        pj = PieceJob(
            job.files, job.text_key, job.lines, job.on_error, job.errors, job.max_record_bytes,
            shipped_recipe(job.tokenizer), job.bos_id, job.eos_id, job.dtype,
        )  # fmt: skip
        piece_job = ray.put(pj)
        self.shard_job = ray.put(
            ShardJob(
                job.output, job.store_options, job.name, job.shard_bytes, job.shard_samples,
                job.provenance, job.dtype, job.pad_id,
            )
        )  # fmt: skip
        bar = Progress(
            job.progress,
            sum(p.source_bytes for p in self.pieces),
            lambda: len(self.journal.entries),
        )
        position = 0
        queue: deque[tuple[int, Any, Any]] = deque()
        ahead = self.ahead
        helper = StartHelp(pj, driver_encoder(job.tokenizer), ahead, ahead if given is None else 0)
        try:
            for i, piece in enumerate(self.pieces):
                if given is not None:
                    queue.append(next(given))
                elif helper.wanted(piece, queue):
                    queue.append(helper.tokenize(i, piece))
                else:
                    refs: Any = self._tokenize.remote(piece_job, piece)  # num_returns=2
                    queue.append((i, refs[0], refs[1]))
                nxt = self.pieces[i + 1] if i + 1 < len(self.pieces) else None
                # Lay out while the window of cluster tasks is full, unless the driver
                # takes the next piece itself (the workers are still starting).
                while helper.on_cluster(queue) >= ahead and not helper.wanted(nxt, queue):
                    position += self._lay_out(*queue.popleft(), bar, position)
            while queue:
                position += self._lay_out(*queue.popleft(), bar, position)
            for cut in self.layout.close(self.piece_starts):
                self._submit(cut)
            self._commit(wait_all=True)
        except Exception as exc:
            if not _system_failure(exc):
                self._finish_queued()
            raise
        finally:
            bar.close()
        problems = [p for p in _get(checks) if p is not None]
        if problems:
            raise WdstreamError(
                f"{problems[0]}: a shard kept from the interrupted pack changed since; "
                "pack again with --overwrite"
            )
        # Every task is done: what killed ones left (.partial files, S3 multipart uploads)
        # goes, under the pack's lock.
        open_store(job.output, **job.store_options).remove_partials()
        return self.totals

    def _finish_queued(self) -> None:
        """After an error: commit the shards already handed to tasks, as the local engine
        lets its queued writes finish, so a rerun resumes after them."""
        try:
            self._commit(wait_all=True)
        except Exception:  # the error being raised is the one to report
            self._settle_pending()

    def _settle_pending(self) -> None:
        """Wait until every shard task still out has ended, its result or error dropped.

        Not ``ray.cancel``: a cancel racing a task's reply aborts the driver process
        (Ray 2.60, ``task_manager.cc`` "Tried to complete task that was not pending",
        ray-project/ray#54846), and a shard task is short and writes atomically, so
        letting it end costs seconds and leaves nothing half-written."""
        refs = [ref for ref, _ in self.pending.values()]
        if refs:
            ray.wait(refs, num_returns=len(refs))

    def _lay_out(self, i: int, docs_ref: Any, tokens_ref: Any, bar: Progress, at: int) -> int:
        """Place piece ``i``'s documents and pack them; return its source bytes (progress)."""
        piece = self.pieces[i]
        docs: PieceDocs = docs_ref if isinstance(docs_ref, PieceDocs) else _get(docs_ref)
        path = self.job.files[piece.file].path
        if piece.whole:
            record = 0
        elif piece.file not in self.line_base:
            record = piece.resume.record if piece.resume is not None else 0
        else:
            record = self.line_base[piece.file]
        self.line_base[piece.file] = record + docs.lines
        t = self.totals
        placed = _Placed(docs, piece.file, self.docs, record, t.empty, t.bad, t.input_bytes)
        for line, why in docs.bad_lines:
            if len(t.bad_locations) < _MAX_LOCATIONS:
                t.bad_locations.append(f"{path}:{record + line}: {why}")
        n, ntok = len(docs.lens), int(docs.lens.sum())
        self.piece_starts.append(self.tokens)
        self.doc_starts.append(self.docs)
        if ntok:
            self.placed[i], self.token_refs[i], self.left[i] = placed, tokens_ref, ntok
        spans = isinstance(self.layout, SpanLayout)
        for cut in self._add_span(i, placed) if spans else self._add_samples(i, placed):
            self._submit(cut)
        self.tokens += ntok
        self.docs += n
        t.empty += docs.total_empty
        t.bad += docs.total_bad
        t.input_bytes += docs.total_input_bytes
        t.documents += n
        bar.update(at + piece.source_bytes, n, ntok)
        if docs.error_line is not None:
            raise InputError(f"{path}:{record + docs.error_line[0]}: {docs.error_line[1]}")
        if docs.error is not None:
            raise InputError(docs.error)
        self._commit(wait_all=False)
        return piece.source_bytes

    def _add_span(self, i: int, placed: _Placed) -> list[CutShard]:
        """Lay out piece ``i``'s documents from their lengths (:class:`SpanLayout`), on
        resume without what committed shards hold of the first one."""
        assert isinstance(self.layout, SpanLayout)
        lens, first, first_id, pre = placed.docs.lens, self.tokens, self.docs, 0
        records = placed.record + placed.docs.records
        if self.resume.start is not None and i == 0:
            positions = [self._position(first_id)] if len(lens) else []
            skip, whole = drop_resumed(lens, positions, self.resume, self.job.new_builder)
            first += skip
            if whole:
                lens, records, first_id = lens[1:], records[1:], first_id + 1
            else:
                pre, lens = skip, np.concatenate(([lens[0] - skip], lens[1:]))
        return self.layout.add(first, lens, first_id, placed.file, records, pre, self.piece_starts)

    def _add_samples(self, i: int, placed: _Placed) -> list[CutShard]:
        """Lay out piece ``i``'s documents sample by sample (:class:`SampleLayout`)."""
        assert isinstance(self.layout, SampleLayout)
        lens, n = placed.docs.lens, len(placed.docs.lens)
        idx = np.arange(self.tokens, self.tokens + int(lens.sum()), dtype=np.int64)
        ids = list(range(self.docs, self.docs + n))
        if self.resume.start is not None and i == 0:  # drop what committed shards hold
            positions = [self._position(d) for d in ids]
            idx, lens, kept = drop_packed(idx, lens, positions, self.resume, self.layout.builder)
            ids = ids[len(ids) - len(kept) :]
        return self.layout.add(idx, lens, ids, self.piece_starts)

    def _position(self, doc: int) -> InputPosition:
        """The input position of global document ``doc``, with the counters before it."""
        p = self.placed[bisect.bisect_right(self.doc_starts, doc) - 1]
        j = doc - p.first_doc
        d = p.docs
        pos = InputPosition(
            p.file, p.record + int(d.records[j]), int(d.offsets[j]), p.empty + int(d.empty[j]),
            p.bad + int(d.bad[j]), p.input_bytes + int(d.input_bytes[j]),
        )  # fmt: skip
        return pos

    def _submit(self, cut: CutShard) -> None:
        refs = [self.token_refs[p] for p in cut.pieces]
        ref = self._write.remote(self.shard_job, cut.plan, *refs)
        self.pending[cut.plan.index] = (ref, cut)
        for p, n in cut.tokens_per_piece.items():
            self.left[p] -= n
            if not self.left[p]:  # every shard holding its tokens has them: release it
                del self.left[p], self.token_refs[p], self.placed[p]
        while len(self.pending) >= self.ahead:
            self._commit(wait_all=False, block=True)

    def _commit(self, wait_all: bool, block: bool = False) -> None:
        """Commit finished shards to the journal, in shard order, as far as they go."""
        while self.pending:
            nxt = len(self.journal.entries)
            ref, cut = self.pending[nxt]
            if not (wait_all or block):
                ready, _ = ray.wait([ref], timeout=0)
                if not ready:
                    return
            entry = ShardEntry(**_get(ref))
            self.journal.commit(entry, cut.end, self.totals.bad_locations)
            del self.pending[nxt]
            if block and not wait_all:
                return
