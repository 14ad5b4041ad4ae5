"""A ``Loader``'s torch workers: the ``DataLoader`` that runs them and the hand-off they share.

The ``DataLoader`` and the :class:`~wdstream.read.torch.handoff.WorkerHandoff` are made at
the first iteration that needs workers; each ``iter()`` publishes the position the workers
start from, and the chunks they send (ring-slot references) come back as tensor views.
"""

from __future__ import annotations

import numbers
import os
import signal
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from torch.utils.data import DataLoader
from torch.utils.data._utils.signal_handling import _remove_worker_pids

from wdstream.errors import WorkerTimeoutError, shm_refusal
from wdstream.read.order.base import SequencePosition
from wdstream.read.sources.fetches import join_dropped
from wdstream.read.torch.dataset import Chunk, TokenDataset
from wdstream.read.torch.handoff import WorkerHandoff, forked_workers, worker_start

__all__ = ["TorchWorkers"]


def _identity(x: Any) -> Any:
    return x


class TorchWorkers:
    """The torch workers of a ``Loader`` over ``dataset``.

    Args:
        dataset: the loader's dataset (its chunks are made in the workers).
        workers: torch workers (>= 1).
        options: the torch ``DataLoader`` options ``prefetch_factor``,
            ``persistent_workers``, ``multiprocessing_context`` (None: torch's default) and
            ``timeout`` (0: wait for a chunk forever).

    Raises:
        TypeError: a ``timeout`` that is no real number (a string, None, a bool).
        ValueError: a ``timeout`` below 0, NaN or past ~24 days (:data:`_MAX_TIMEOUT`).
    """

    def __init__(self, dataset: TokenDataset, workers: int, options: dict[str, Any]) -> None:
        options = {**options, "timeout": _checked_timeout(options.get("timeout", 0))}
        self.dataset, self.workers, self.options = dataset, workers, options
        self._dl: DataLoader | None = None
        self._handoff: WorkerHandoff | None = None
        self._running = False  # persistent workers started by an earlier iter()

    def _torch_loader(self) -> DataLoader:
        if self._dl is None:
            ds, c = self.dataset, self.dataset.cfg
            self._handoff = WorkerHandoff(
                self.workers, (self.options["prefetch_factor"] or 2) + 2,
                c.chunk_batches * c.batch_size, c.seq_len, c.doc_boundaries, c.streams,
                schedule=ds.mixture is not None,
                forked=forked_workers(self.options["multiprocessing_context"]),
            )  # fmt: skip
            ds.use(self._handoff)
            opts = {k: v for k, v in self.options.items() if v is not None}
            self._dl = DataLoader(
                ds, batch_size=None, num_workers=self.workers, collate_fn=_identity,
                worker_init_fn=worker_start, **opts,
            )  # fmt: skip
            if self.options["persistent_workers"]:
                # Ended with this object, not by the cyclic garbage collector: in a cycle (a
                # trainer's, a traceback's) it closed the iterator's index queues first, and
                # torch waited 5 s for each worker. The finalizer holds the DataLoader, so its
                # queues are not garbage before the workers are sent their end.
                weakref.finalize(self, _end_workers, self._dl).atexit = False
        return self._dl

    def chunks(self, position: SequencePosition) -> Iterator[Chunk]:
        """The chunks of an ``iter()`` of the loader from ``position`` on: the first made
        here where no worker runs yet (:meth:`_first_here`), the rest by the workers, which
        are started only when the chunk after it is asked for."""
        if self._running and self._dl is not None and not _all_alive(self._dl):
            self._end()  # persistent workers of which one died (killed) since they last ran
        if self._first_here():
            first = self.dataset.first_chunk(position)  # advances position past it
            if first is None:
                return
            yield first
        dl = self._torch_loader()
        assert self._handoff is not None
        self._handoff.publish(position)
        fresh = not self._running
        if fresh:  # the workers start now: no reader thread may be left to them
            self._end_reads()
        self._running = bool(self.options["persistent_workers"])
        try:
            running = iter(dl)  # persistent workers: torch's reset of the running ones
        except OSError as exc:  # no room for multiprocessing's semaphores
            self._fail(shm_refusal(exc, "the torch workers", "num_workers=0"), dl._iterator)
        except BaseException as exc:  # one of them died, or stopped, since the last iteration
            self._fail(exc, dl._iterator)
        yield from self._resolve(running, fresh, self._handoff.iteration())

    def _first_here(self) -> bool:
        """Whether this process makes the iteration's first chunk (one step) itself.

        Starting a worker costs the training process 10-25 ms of its own time (forking a
        process of torch's size, more with a model's imports), and torch starts them all
        before it asks any for a chunk: the first batch waited for every fork. Made here,
        it waits for its own rows only (as without workers), and the workers are started
        as the training step on it runs, going on from the position after it, as from a
        state taken there. Only in the global order (a step's rows have a place without
        reading what precedes them) and where the workers are not already running
        (persistent workers of an earlier ``iter()``)."""
        return self.dataset.random_access and not self._running

    def _end_reads(self) -> None:
        """Drop this process's windows and stop its reader threads before the workers are
        forked: what the caller read between the first batch and the second (``batch_at``
        reads windows ahead in threads) would leave a forked child waiting on a read-ahead
        thread it does not have (it hung); the GETs the release left in flight are waited
        for here (:func:`~wdstream.read.sources.fetches.join_dropped`)."""
        self.dataset.sequence.release()
        join_dropped()

    def _resolve(self, chunks: Iterator[Chunk], fresh: bool, number: int) -> Iterator[Chunk]:
        """Turn the workers' ring-slot references into tensor views of the slot.

        An error raised here (a worker's, re-raised by torch; a worker's death; a
        ``KeyboardInterrupt`` while waiting) ends the workers at once (:meth:`_end`): the
        caller's traceback holds this generator, so torch's iterator would otherwise be
        ended by the cyclic garbage collector, which closes its index queues before the
        iterator's own ``__del__`` sends each worker its end; the workers never get it, and
        every one is waited for 5 s, then killed (plain torch does the same). Persistent
        workers are ended too: torch's ``DataLoader`` would hand the same iterator, and a
        dead worker's, to the next ``iter()``. A ``break`` (the generator closed) keeps them.
        ``fresh``: the workers were started for this iteration (a timeout before their first
        chunk may be their start-up's); ``number``: the iteration's in the hand-off, which
        the workers' reads are told was left (:meth:`WorkerHandoff.leave`)."""
        assert self._handoff is not None
        try:
            for s, ref, _, cursors in chunks:
                fresh = False
                tokens, positions = self._handoff.resolve(ref)
                yield s, tokens, positions, cursors
        except GeneratorExit:  # a break: persistent workers are kept, unless one has died
            # First the workers' reads still waiting stop (no chunk more is taken): a worker
            # blocked in a stalled read then takes torch's end (or reset) at once.
            self._handoff.leave(number)
            if self._running and self._dl is not None and not _all_alive(self._dl):
                self._end()  # (torch's SIGCHLD handler raised its error in the caller's code)
            raise
        except BaseException as exc:
            self._handoff.leave(number)
            self._fail(exc, chunks, fresh)

    def _fail(self, exc: BaseException, it: Any, starting: bool = False) -> NoReturn:
        """End torch's iterator ``it`` after ``exc`` and raise it, or, for torch's timeout
        (while a chunk was waited for, or persistent workers' reset at ``iter()``, where one
        stopped between iterations), kill the workers and raise a WorkerTimeoutError;
        ``starting``: none had sent a chunk since they started, which the timeout covers."""
        # torch's own message (a worker's re-raised error starts "Caught ..."): a
        # worker's RuntimeError saying "timed out" is its own, not the loader's timeout.
        timed_out = (
            isinstance(exc, RuntimeError)
            and self.options["timeout"] > 0
            and str(exc).startswith(_TIMED_OUT)
        )
        states = _kill_workers(it) if timed_out else ""
        self._end_iterator(it)
        if timed_out:
            raise WorkerTimeoutError(
                f"torch workers sent no chunk for {self.options['timeout']:g} s "
                f"(workers {states}); they were killed, and the next iter() "
                "starts new workers after the last batch handed out"
                + (_STARTING if starting else "")
            ) from exc
        raise exc

    def _end_iterator(self, it: Any) -> None:
        """End torch's iterator ``it`` (if any) and, if persistent, this object's workers."""
        _shut_down(it)
        self._end()

    def _end(self) -> None:
        """End persistent workers after an error, so that the next ``iter()`` starts new
        ones from the loader's position (as a first iteration does: the same batches)."""
        if self._running and self._dl is not None:
            _end_workers(self._dl)
            self._running = False


# The longest wait torch's data queue takes: poll() counts int32 milliseconds (longer
# raised OverflowError at the first wait, after the first batch).
_MAX_TIMEOUT = 2**31 // 1000
_STARTING = ("; none had sent a chunk since they started: the timeout covers their start-up "
             "(spawned workers import torch: 3-5 s on a busy host)")  # fmt: skip
_TIMED_OUT = "DataLoader timed out after"  # torch's RuntimeError when no chunk came in time


def _checked_timeout(timeout: Any) -> float:
    """``timeout`` as seconds, refused before any worker starts: torch checked it only as
    the workers were started (after the first batch, made here, was handed out), as a
    ``TypeError`` comparing a string, an ``OverflowError`` for inf or 1e308 at its first
    wait, and NaN waited forever; a ``None`` was taken for 0 but broke the error path."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(
            f"worker_timeout must be a number of seconds (0: wait forever), got {timeout!r:.60}"
        )
    try:
        seconds = float(timeout)
    except OverflowError:  # an int past a float's range (10**400)
        seconds = float("inf")
    if not 0 <= seconds <= _MAX_TIMEOUT:  # (NaN fails both)
        raise ValueError(
            f"worker_timeout must be 0 (wait forever) or seconds up to {_MAX_TIMEOUT:,}, "
            f"got {timeout!r:.60}"
        )
    return seconds


def _all_alive(dl: DataLoader) -> bool:
    """Whether every worker of ``dl``'s persistent iterator is alive."""
    return all(w.is_alive() for w in getattr(dl._iterator, "_workers", ()))


def _end_workers(dl: DataLoader) -> None:
    """End the workers of ``dl``'s persistent iterator, if it has one, and drop it (torch
    makes a new one, with new workers, at the next ``iter()``)."""
    it, dl._iterator = dl._iterator, None
    _shut_down(it)


def _shut_down(it: Any) -> None:
    """torch's own end of its iterator ``it`` (None, or a single-process one: nothing)."""
    end = getattr(it, "_shutdown_workers", None)
    if end is not None:
        end()


def _kill_workers(it: Any) -> str:
    """SIGKILL the workers of torch's iterator ``it`` after a timeout and say what state
    each was in (``/proc``: T stopped, S sleeping, R running, D in uninterruptible I/O).

    A stopped worker never takes torch's end (SIGTERM stays pending until it is
    continued), and a hung one costs torch's 5 s join each: neither holds anything the next
    ``iter()`` needs (it starts from the batches handed out). Their pids are first taken off
    torch's SIGCHLD watch, which would otherwise raise "worker killed" in the caller."""
    if getattr(it, "_worker_pids_set", False):
        _remove_worker_pids(id(it))
        it._worker_pids_set = False
    states = []
    for w in getattr(it, "_workers", ()):
        if w.pid is None or not w.is_alive():
            continue
        try:
            state = Path(f"/proc/{w.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "?"
        states.append(f"{w.pid}: {_STATES.get(state, state)}")
        try:
            os.kill(w.pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        w.join(timeout=5)
    return ", ".join(states) or "none alive"


_STATES = {"T": "stopped", "t": "stopped by a tracer", "S": "sleeping", "R": "running",
           "D": "in uninterruptible I/O"}  # fmt: skip
