"""The Python writer: records from Python code into a dataset, through ``pack``'s one pipeline.

::

    with wdstream.Writer("s3://b/ds/", seq_len=2048, tokenizer="cl100k_base",
                         mode="bestfit") as w:
        for doc in docs:
            w.write(doc)        # a str, a dict record, or token ids (pretokenized=True)
    w.result.index              # the PackResult pack() returns

    wdstream.pack_records(records, "out/", seq_len=2048)   # any iterable of records at once

What a record is, and how records are named (``<records>:N``), is
:mod:`wdstream.inputs.iterables`. Both take every keyword option of :func:`wdstream.pack`.

**Design: a background thread runs** :func:`pack_records` **over a bounded queue that**
:meth:`Writer.write` **fills.** The pack is the CLI's code, unchanged: the lock, the journal,
resume, the commit, progress, and the pipeline ``RecordReader -> batches -> TokenPool ->
sample builder -> ShardWriter``, so the same documents give byte-identical shards. The queue
holds at most ``queue_size`` records and ``write`` blocks while it is full, so memory is
bounded and a slow upload slows the caller (backpressure); the records a ``write`` made are
handed to the pack in chunks, at the latest by ``close``. Errors cross back: the pack's
set-up errors (an output that holds a dataset, a locked output, a bad option) are raised by
the constructor, which waits until the pack asks for its first record; a later error (a bad
record under ``on_error="raise"``, a failed write) by the next ``write`` or by ``close``.

The alternative, encoding and packing inside ``write`` itself, would need the local engine
rewritten as a push-driven state machine (the token pool maps an iterator of batches, best
fit buffers whole blocks): a second pipeline to keep byte-identical with the first. A thread
keeps one pipeline at the cost of a hand-off between threads, paid per chunk of up to 256
records rather than per record: 200,000 records through the queue took 5.7-7.6 us each one
at a time and 0.3-0.4 us each in chunks (a loaded 2-core host), where tokenising a 660-byte
document takes ~90 us of a core (tiktoken's ~7.4 MB/s, ``docs/PACK.md``).

**A writer that dies leaves an interrupted pack, never a half dataset**: an exception inside
the ``with`` block stops the pack (shards already finished are committed to the journal, the
one being built is dropped, no ``index.json``), and the exception propagates; a killed
process leaves what a killed ``wdstream pack`` leaves (``docs/PACK.md``, "Interrupted
packs"). Resume: open a Writer on the same output with the same options and write the same
records again from the first; the records the committed shards hold are consumed unread, and
the dataset ends byte-identical to an uninterrupted one.
"""

from __future__ import annotations

import numbers
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wdstream.inputs.iterables import RECORDS_NAME
from wdstream.write.pack import PackResult, pack
from wdstream.write.sources import PackInputs

__all__ = ["Writer", "pack_records"]

_END, _ABORT = object(), object()
# The longest training row a pack may be sized for: index.json holds seq_len and
# sample_tokens = seq_len + 1 below 2**31 (docs/FORMAT.md), and a reader refuses any other.
MAX_SEQ_LEN = 2**31 - 2
_KEYS = ("text_key", "ids_key", "messages_key")


def checked_options(output: Any, options: dict[str, Any], source: Any = RECORDS_NAME) -> str:
    """``output`` as a str, once it and the options a pack would only fail on later (or
    with a traceback) are checked: the output a path or URL, the records' ``source`` name
    and the record keys non-empty str, ``seq_len`` a row length a reader accepts.

    Raises:
        TypeError: ``output`` or a key of the wrong type, naming it.
        ValueError: an empty one, or ``seq_len`` out of range.
    """
    if isinstance(output, os.PathLike):
        output = os.fspath(output)
    if not isinstance(output, str) or not output:
        raise TypeError(
            "output must be a dataset root: a local path or a URL, as a non-empty str or "
            f"os.PathLike, got {output!r:.80}"
        )
    if not isinstance(source, str) or not source:
        raise TypeError(f"source must be a non-empty str (the records' name), got {source!r:.80}")
    for key in (*_KEYS, "mask_key"):
        value = options.get(key, None if key == "mask_key" else "text")
        if key == "mask_key" and value is None:
            continue
        if not isinstance(value, str) or not value:
            raise TypeError(f"{key} must be a non-empty str (a record's field), got {value!r:.80}")
    seq_len = options.get("seq_len", 2048)
    if isinstance(seq_len, bool) or not isinstance(seq_len, numbers.Integral):
        raise TypeError(f"seq_len must be an int, got {seq_len!r:.80}")
    if not 1 <= int(seq_len) <= MAX_SEQ_LEN:
        raise ValueError(
            f"seq_len must be in [1, {MAX_SEQ_LEN}] (samples of seq_len + 1 tokens, below "
            f"2**31 as index.json records them), got {seq_len}"
        )
    return output


def pack_records(
    records: Iterable[Any], output: str, *, source: str = RECORDS_NAME, **options: Any
) -> PackResult:
    """Pack an iterable of records (texts, dicts, token ids) into a dataset at ``output``.

    Args:
        records: any iterable of records (:mod:`wdstream.inputs.iterables`): a list, a
            generator, a ``datasets.Dataset`` or ``IterableDataset`` (rows are dicts).
        output: dataset root, as for :func:`wdstream.pack`.
        source: the records' name in errors and provenance (``<records>:12``).
        **options: every keyword option of :func:`wdstream.pack` (``seq_len``, ``mode``,
            ``tokenizer``, ``text_key``, ``pretokenized``, ``on_error``, ...).

    Returns:
        The :class:`~wdstream.write.pack.PackResult`, as :func:`wdstream.pack` returns it.

    Raises:
        TypeError: ``records`` is a str or not iterable; ``output`` or a record key is not
            a str (:func:`checked_options`).
        ValueError: ``seq_len`` out of range, and as :func:`wdstream.pack` raises it.
        InputError, WdstreamError, PackLockedError: as :func:`wdstream.pack` raises them,
            a bad record named ``SOURCE:N`` (its 1-based number), a record over
            ``max_record_bytes`` (its text's UTF-8 bytes) among them.
    """
    output = checked_options(output, options, source)
    return pack(PackInputs.from_records(records, source), output, **options)


class _Aborted(Exception):
    """The Writer's caller stopped: raised inside the pack to end it without a commit."""


class _Feed:
    """The iterable the pack reads: the records ``write`` hands over, in chunks of up to
    ``chunk`` records on a queue of at most ``size // chunk`` chunks (one queue hand-off per
    chunk: a hand-off between threads costs microseconds, a record's tokenising more)."""

    def __init__(self, size: int, asked: threading.Event, chunk: int = 256) -> None:
        self._chunk = max(1, min(chunk, size))
        self._queue: queue.Queue[Any] = queue.Queue(max(1, size // self._chunk))
        self._pending: list[Any] = []  # the writing thread's chunk being filled
        self._asked = asked

    def __iter__(self) -> Iterator[Any]:
        self._asked.set()  # the pack is set up and reads: the constructor may return
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if item is _ABORT:
                raise _Aborted("the Writer was stopped by an exception in its caller")
            yield from item

    def add(self, record: Any, alive: Callable[[], bool]) -> bool:
        """Add ``record``; hand the chunk over once full, blocking while the queue is full.
        False if the reader died."""
        self._pending.append(record)
        if len(self._pending) < self._chunk:
            return True
        chunk, self._pending = self._pending, []
        return self._put(chunk, alive)

    def finish(self, alive: Callable[[], bool]) -> None:
        """Hand over the last chunk and the end of the records."""
        if self._pending:
            chunk, self._pending = self._pending, []
            if not self._put(chunk, alive):
                return
        self._put(_END, alive)

    def _put(self, item: Any, alive: Callable[[], bool]) -> bool:
        while True:
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                if not alive():
                    return False

    def abort(self) -> None:
        """Make the reader raise :class:`_Aborted` at its next chunk (records not yet read
        are dropped). Only the writing thread puts, so once the queue is drained the put
        cannot block."""
        self._pending = []
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put_nowait(_ABORT)


class Writer:
    """Write records into a wdstream dataset from Python; see the module docstring.

    Args:
        output: dataset root (local folder, ``s3://``, ``http(s)://``).
        source: the records' name in errors and provenance (``<records>:N``).
        queue_size: records waiting for the pack at most (handed over in chunks of up to
            256); ``write`` blocks beyond it.
        **options: every keyword option of :func:`wdstream.pack`.

    The pack starts in the constructor (lock, tokenizer, resume point); use the Writer as a
    context manager, or call :meth:`close` (commits) or :meth:`abort` yourself. One thread
    writes. A record is read by the pack after ``write`` returns: do not change it after.

    A text longer than ``max_record_bytes`` (UTF-8 bytes; default 256 MiB) is a bad record,
    as a line that long is to ``wdstream pack``: raised naming ``<records>:N``, or skipped
    and counted with ``on_error="skip"``, never tokenised.

    Raises:
        PackLockedError, WdstreamError, ValueError, TypeError: the pack could not start
            (another pack writes there, the output holds a dataset, a bad option: an
            ``output`` that is no path, a record key that is no str, a ``seq_len`` no
            reader accepts).
    """

    def __init__(
        self, output: str, *, source: str = RECORDS_NAME, queue_size: int = 1024, **options: Any
    ) -> None:
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be an int >= 1, got {queue_size!r:.80}")
        output = checked_options(output, options, source)
        self._ready = threading.Event()
        self._feed = _Feed(queue_size, self._ready)
        self._result: PackResult | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, args=(output, source, options), name="wdstream-writer", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def _run(self, output: str, source: str, options: dict[str, Any]) -> None:
        try:
            self._result = pack_records(self._feed, output, source=source, **options)
        except BaseException as exc:  # handed to the caller's thread
            self._error = exc
        finally:
            self._ready.set()

    @property
    def result(self) -> PackResult | None:
        """What the pack did, once :meth:`close` returned (None before)."""
        return self._result

    def write(self, record: Any) -> None:
        """Add one record: a str (text), a dict (its ``text_key``, or its ids and mask with
        ``pretokenized=True``) or token ids (a list or 1-D numpy array, ``pretokenized=True``).

        Raises:
            ValueError: the writer is closed.
            InputError, WdstreamError, OSError: the pack failed (a bad record under
                ``on_error="raise"``, named ``SOURCE:N``; a failed write); it has stopped.
        """
        self._raise_failure()
        if self._closed:
            raise ValueError("write() on a closed Writer")
        if not self._feed.add(record, self._thread.is_alive):
            self._thread.join()
            self._raise_failure()

    def close(self) -> PackResult:
        """Finish: pack what was written, publish ``index.json``, release the lock.

        Raises:
            InputError, WdstreamError, OSError: the pack failed; no index.json is written.
        """
        if not self._closed:
            self._closed = True
            self._feed.finish(self._thread.is_alive)
        self._thread.join()
        self._raise_failure()
        assert self._result is not None
        return self._result

    def abort(self) -> None:
        """Stop without committing: finished shards stay for a resume, no ``index.json``."""
        self._closed = True
        if self._thread.is_alive():
            self._feed.abort()
            self._thread.join()

    def _raise_failure(self) -> None:
        if self._error is not None and not isinstance(self._error, _Aborted):
            raise self._error
        if self._error is not None:
            raise ValueError("the Writer was aborted")

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()  # the caller's exception propagates; the pack stops uncommitted
