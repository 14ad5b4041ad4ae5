"""Encode batches of documents in parallel, in order, with a bounded number in flight.

The packing process only reads, batches (~1 MB of text), and packs; workers run the pack's
:class:`~wdstream.write.encoders.DocumentEncoder` (text: tokenise) and return each batch as
one flat array of stored tokens (BOS/EOS already added) plus the document lengths (and an
encoder's audit tags and notes, :class:`~wdstream.write.encoders.EncodedBatch`), so no token
crosses the process boundary as a Python int. An encoder that is not ``parallel``
(pre-tokenized ids) runs inline whatever the pool.

Kinds of pool:

* ``threads``: tiktoken releases the GIL while encoding, so threads in this process work
  and avoid sending text to another process and the pool's start-up (~1-2 s), but on 2 cores processes measured faster (see
  ``docs/BENCHMARKS.md``).
* ``processes``: a ``forkserver`` pool (``spawn`` where forkserver is missing); needed for
  bpe-openai, which holds the GIL while it encodes. As with any spawn/forkserver pool, a
  script that calls ``pack`` must guard its entry point with ``if __name__ == "__main__":``.
* ``inline``: ``workers=0``, encode on the calling thread (tests, debugging).

Results come back in submission order whatever the pool, so output never depends on the
number of workers.

Start-up: ``pack`` calls :func:`prestart` first thing, so the fork server (a fresh
interpreter importing numpy and this package, ~1 s) boots while the packing process loads
the tokenizer; a bpe-openai worker then needs only the binding (~0.1 s), never tiktoken's
ranks, and a worker of an encoder that brings its own tokenizer (a bpe-openai chat pack's
tiktoken one) loads only that (:func:`_worker_tokenizer`). Until a worker is up the packing
thread encodes batches itself.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import multiprocessing.forkserver
import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # Windows has none: the pipes keep their size
    fcntl = None  # type: ignore[assignment]

import numpy as np

from wdstream.errors import WdstreamError, shm_refusal
from wdstream.inputs.blocks import BlockParser, LineBlock, ParsedBlock
from wdstream.tokenizers.base import Tokenizer
from wdstream.tokenizers.tiktoken import BpeEncoder
from wdstream.write.encoders import DocumentEncoder, EncodedBatch, encode_flat

__all__ = ["POOL_KINDS", "Starter", "TokenPool", "encode_flat", "prestart"]

POOL_KINDS = ("auto", "threads", "processes")
M = TypeVar("M")

_worker: tuple[Tokenizer | BpeEncoder, DocumentEncoder, BlockParser | None] | None = None


def _process_context() -> multiprocessing.context.BaseContext:
    """``forkserver`` (``spawn`` where it is missing), the server preloading this module."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        # Import once in the fork server, so each worker forks with the modules loaded
        # instead of importing the package (and whatever it imports) itself; with them what
        # a worker building shards runs (~0.07 s a worker otherwise, at its first shard).
        ctx.set_forkserver_preload(["wdstream.write.tokenpool", "wdstream.write.worker_shards"])
    return ctx


def prestart(workers: int, kind: str) -> None:
    """Start the fork server now, so its imports (~1 s of a fresh interpreter importing
    numpy and this package) overlap the caller's tokenizer load instead of following it.

    Call it first thing in a pack that will use a process pool; without it the server
    starts at the first batch. Safe to call again: a running server is reused.
    """
    if workers <= 0 or kind == "threads":
        return
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    _process_context()
    threading.Thread(
        target=multiprocessing.forkserver.ensure_running, name="wdstream-forkserver", daemon=True
    ).start()


def _exit_with_parent() -> None:
    """Exit this worker when the packing process dies, even by SIGKILL.

    A pool worker blocks on its task queue forever once its parent is gone (it holds the
    queue's write end itself), so without this a killed ``pack`` leaves its workers behind.
    """
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="wdstream-parent-watch", daemon=True).start()


def _init_worker(
    tok: Tokenizer | str, encoder: DocumentEncoder, parser: BlockParser | None
) -> None:
    """``tok``: the tokenizer (it crossed as its recipe and reloaded itself, a file checked
    against its hash), or for bpe-openai just the encoding's name."""
    global _worker
    _exit_with_parent()
    _worker = (BpeEncoder(tok) if isinstance(tok, str) else tok, encoder, parser)


def _worker_tokenizer(tok: Tokenizer, encoder: DocumentEncoder) -> Tokenizer | str:
    """What a process worker loads to encode with: the tokenizer an encoder brings of its own
    (a bpe-openai chat pack's tiktoken one, :func:`~wdstream.write.chatdocs.chat_tokenizer`),
    the very object the pickled encoder holds, so the worker loads it once and nothing else
    (it loaded the unused bpe-openai binding too); else the pool's, for bpe-openai just the
    encoding's name (the binding, not tiktoken's ranks: ~0.3 s a worker)."""
    own = getattr(encoder, "tokenizer", None)
    if isinstance(own, Tokenizer):
        return own
    return tok.name if tok.backend == "bpe-openai" else tok


def _run_task(
    tok: Tokenizer | BpeEncoder,
    encoder: DocumentEncoder,
    parser: BlockParser | None,
    task: list[Any] | LineBlock,
) -> tuple[EncodedBatch, ParsedBlock | None]:
    """Encode a batch of documents, or parse a block of lines and encode its documents
    (then return what the reader numbers them with, without the documents)."""
    if not isinstance(task, LineBlock):
        return encoder.encode(tok, task), None
    assert parser is not None, "a block of lines needs the pool's parser"
    parsed = parser.parse(task)
    if not parsed.docs:  # nothing to encode (every line blank, empty or bad)
        empty = np.zeros(0, dtype=encoder.dtype)
        return EncodedBatch(empty, np.zeros(0, dtype=np.int64)), parsed
    return encoder.encode(tok, parsed.docs), parsed.without_docs()


# Buffer of the pool's task and result pipes: a batch (~1 MB of text, its tokens) then
# crosses in one or two reads instead of sixteen of 64 KiB (Linux's default), each of which
# the packing process paid for in a fresh buffer and a copy: measured, receiving 100 MB of
# results took ~0.065 s of its CPU with 64 KiB pipes and ~0.03 s with 1 MiB ones (the
# default most a user may ask for, /proc/sys/fs/pipe-max-size).
_PIPE_BYTES = 1 << 20


def _widen_pipes(executor: ProcessPoolExecutor) -> None:
    """Set the pipes ``executor`` sends tasks and receives results through to
    :data:`_PIPE_BYTES` (``F_SETPIPE_SZ``, Linux). Only a speed-up: where the call is missing
    or refused (a per-user limit on pipe buffers), the pipes keep their size."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if setsize is None:
        return
    # ProcessPoolExecutor's own queues (CPython 3.9-3.13 name them so); absent: nothing.
    ends: list[Any] = [
        getattr(getattr(executor, "_call_queue", None), "_writer", None),
        getattr(getattr(executor, "_result_queue", None), "_reader", None),
    ]
    for end in ends:
        try:
            fcntl.fcntl(end.fileno(), setsize, _PIPE_BYTES)
        except (AttributeError, OSError, ValueError):  # AttributeError: no such pipe
            continue


def _ready() -> None:
    """Runs once a process worker is initialised (start-up probe)."""


# A worker process that dies (killed, out of memory, or a script without a main guard whose
# re-import in the worker runs the pack again) breaks the whole pool: say what to check.
def process_pool(
    workers: int, tok: Tokenizer, encoder: DocumentEncoder, parser: BlockParser | None
) -> ProcessPoolExecutor:
    """The token pool's process pool, its pipes widened. A full ``/dev/shm`` (where
    ``multiprocessing`` keeps the pool's semaphores) is a :class:`WdstreamError` saying so,
    not ``multiprocessing``'s bare ``OSError`` and traceback."""
    initargs = (_worker_tokenizer(tok, encoder), encoder, parser)
    try:
        executor = ProcessPoolExecutor(
            workers, mp_context=_process_context(), initializer=_init_worker, initargs=initargs
        )
    except OSError as exc:
        said = shm_refusal(exc, "the tokenizer process pool", "workers=0 or pool='threads'")
        if said is exc:
            raise
        raise said from exc
    _widen_pipes(executor)
    return executor


_BROKEN_POOL = (
    "a tokenizer worker process died (killed, out of memory, or it failed to start); if "
    "this is a script calling pack() or Writer at its top level, put the call under "
    "`if __name__ == '__main__':` (each worker process imports the script again), or pass "
    "workers=0; rerunning the same pack resumes after the shards already written"
)


# An EncodedBatch as it crosses back: its arrays as bytes, its notes as they are, and a
# parsed block's numbering.
_Wire = tuple[bytes, bytes, bytes | None, list[Any] | None, ParsedBlock | None]


def _encode_in_worker(task: list[Any] | LineBlock) -> _Wire:
    assert _worker is not None, "worker not initialised"
    out, parsed = _run_task(*_worker, task)
    tags = None if out.tags is None else out.tags.tobytes()
    return out.flat.tobytes(), out.lens.tobytes(), tags, out.notes, parsed


class Starter:
    """Starts every process worker of ``executor`` from a background thread.

    ``ProcessPoolExecutor.submit`` blocks while it starts a worker, and the first start waits
    for the fork server's imports; meanwhile the packing thread keeps encoding inline.
    """

    def __init__(self, executor: Executor, workers: int) -> None:
        self._executor, self._workers = executor, workers
        self._probes: list[Future[None]] = []
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="wdstream-pool-start", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._probes = [self._executor.submit(_ready) for _ in range(self._workers)]
        except BaseException as exc:  # re-raised by join(), in the packing thread
            self._error = exc

    def ready(self) -> bool:
        """Whether the pool can take work (a worker is up, or starting it failed)."""
        if self.thread.is_alive():
            return False
        return self._error is not None or any(f.done() for f in self._probes)

    def join(self) -> None:
        self.thread.join()
        if self._error is not None:
            raise self._error


# What the pool maps: a batch of documents, or a block of raw lines (with a parser).
Task = list[Any] | LineBlock
Encoded = tuple[M, EncodedBatch, ParsedBlock | None]


class TokenPool:
    """Ordered, bounded parallel map from tasks (document batches, or blocks of raw lines
    parsed in the workers) to ``(meta, EncodedBatch, ParsedBlock or None)``.

    While process workers start, batches are encoded on the calling thread
    (``inline_while_starting``; tests turn it off to exercise the pool on tiny inputs).

    Args:
        tok: the tokenizer (pickled to process workers; it reloads itself there).
        workers: parallel encoders; 0 encodes inline.
        kind: ``auto`` (processes), ``threads`` or ``processes``.
        encoder: what a batch of documents becomes (its ``dtype`` is the stored one).
        max_in_flight: batches submitted but not yet consumed (default ``2 * workers + 1``).
        parser: what parses blocks of lines (:meth:`DocumentReader.block_parser`); None
            when the tasks are batches of documents only.
    """

    inline_while_starting = True

    def __init__(
        self,
        tok: Tokenizer,
        workers: int,
        kind: str,
        encoder: DocumentEncoder,
        max_in_flight: int | None = None,
        parser: BlockParser | None = None,
    ) -> None:
        if kind not in POOL_KINDS:
            raise ValueError(f"pool kind must be one of {POOL_KINDS}, got {kind!r}")
        if kind == "auto":
            # Measured on 2 cores (docs/BENCHMARKS.md): processes beat threads for tiktoken
            # too; with threads, the packing thread and the GIL-held parts of each encode
            # call contend for the interpreter.
            kind = "processes"
        if not encoder.parallel:
            workers = 0
        self.kind = kind if workers > 0 else "inline"
        self.workers = workers
        self._tok, self._encoder, self._dtype = tok, encoder, encoder.dtype
        self._parser = parser
        self._max = max_in_flight or 2 * workers + 1
        self._executor: Executor | None = None
        self._starter: Starter | None = None
        if self.kind == "processes":
            self._executor = process_pool(workers, tok, encoder, parser)
        elif self.kind == "threads":
            self._executor = ThreadPoolExecutor(workers, thread_name_prefix="wdstream-encode")

    def _here(self, task: Task) -> tuple[EncodedBatch, ParsedBlock | None]:
        return _run_task(self._tok, self._encoder, self._parser, task)

    def _submit(self, task: Task) -> Future[Any]:
        assert self._executor is not None
        if self.kind == "processes":
            try:
                return self._executor.submit(_encode_in_worker, task)
            except BrokenProcessPool as exc:
                raise WdstreamError(_BROKEN_POOL) from exc
        return self._executor.submit(self._here, task)

    def map(self, tasks: Iterable[tuple[Task, M]]) -> Iterator[Encoded[M]]:
        """Yield ``(meta, encoded, parsed)`` for every ``(task, meta)``, in input order.

        When reading the tasks fails, the results of the tasks before are yielded first,
        so an error they hold (a bad record found by a worker) comes before a later one.
        """
        dtype = self._dtype
        if self._executor is None:
            for task, meta in tasks:
                yield meta, *self._here(task)
            return
        pending: deque[tuple[M, Future[Any]]] = deque()
        starter = None
        if self.kind == "processes":
            assert self._executor is not None
            starter = self._starter = Starter(self._executor, self.workers)
        it = iter(tasks)
        while True:
            try:
                task, meta = next(it)
            except StopIteration:
                break
            except Exception:
                while pending:  # the tasks before the failed read come first
                    yield self._result(*pending.popleft(), dtype)
                raise
            if (
                starter is not None
                and self.inline_while_starting
                and not pending
                and not starter.ready()
            ):
                # Workers are still starting (fork server imports, vocabulary: 1-2 s, and
                # submitting blocks meanwhile, hence the thread): encode here meanwhile.
                # Only while nothing is pending, so the order of results is unchanged.
                yield meta, *self._here(task)
                continue
            if starter is not None:
                starter.join()
                starter = None
            pending.append((meta, self._submit(task)))
            if len(pending) >= self._max:
                yield self._result(*pending.popleft(), dtype)
        while pending:
            yield self._result(*pending.popleft(), dtype)

    @staticmethod
    def _result(meta: M, fut: Future[Any], dtype: str) -> Encoded[M]:
        try:
            out = fut.result()
        except BrokenProcessPool as exc:
            raise WdstreamError(_BROKEN_POOL) from exc
        if isinstance(out[0], EncodedBatch):  # threads: the encoder's own result
            return meta, *out
        flat, lens, tags, notes, parsed = out
        encoded = EncodedBatch(
            np.frombuffer(flat, dtype=dtype),
            np.frombuffer(lens, dtype=np.int64),
            None if tags is None else np.frombuffer(tags, dtype=np.uint8),
            notes,
        )
        return meta, encoded, parsed

    def close(self) -> None:
        """Stop the workers (pending batches are dropped)."""
        if self._starter is not None:
            self._starter.thread.join()  # never shut the pool down under a submitting thread
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> TokenPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
