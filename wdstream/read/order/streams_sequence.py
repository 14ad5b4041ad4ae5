"""The per-rank streams order as a :class:`~wdstream.read.order.base.BatchSequence`.

A rank's data is ``streams`` independent streams (packed tokens,
:class:`~wdstream.read.order.streams.ReaderContext`, or raw text tokenised on the fly,
:class:`~wdstream.read.order.text_streams.TextContext`) served round-robin in chunks of
``K`` batches (chunks are aligned to multiples of ``K`` inside each epoch, the last chunk of
an epoch may be shorter)::

    streams=4, K=2, nb=3:   s0 b0 b1 | s1 b0 b1 | s2 .. | s3 .. | s0 b2 | s1 b2 | s2 b2 | s3 b2 | next epoch

With ``W`` torch workers (``W`` divides ``streams``), worker ``i`` serves the streams
``(next_stream + i + j * W) % streams`` in that order, one chunk per message, so torch's
in-order worker round-robin reproduces exactly the single-process order above.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from wdstream.errors import StateMismatchError
from wdstream.read.batches.rows import position_ids
from wdstream.read.order.base import ChunkBuffers, DocStarts, FilledChunk, Worker
from wdstream.read.order.state_fields import SEAL_KEY, accept_dataset, cursor_seal, mismatch
from wdstream.read.order.streams_context import ReaderConfig, StreamContext
from wdstream.read.order.streams_state import (
    STATE_VERSION,
    StreamsPosition,
    check_iter_stop,
    check_turns,
    parse_state,
)
from wdstream.read.sources.base import Source

__all__ = ["StreamsSequence"]


class StreamsSequence:
    """One rank's independent streams, served round-robin (see the module docstring).

    Args:
        ctx: the streams' source-specific half (packed tokens or raw text).
        cfg: the reader's geometry and seed.
        source: the dataset, named in every state by its content (``identity``).
        epochs: epochs per iteration (None: forever), checked against a state's stop.
        sealed: every saved cursor carries a ``check`` of its fields, and a state whose
            cursors do not match theirs is refused naming the field (raw text, whose
            positions no index can check; ``streams_state.cursor_seal``).
    """

    def __init__(
        self,
        ctx: StreamContext,
        cfg: ReaderConfig,
        source: Source,
        epochs: int | None,
        sealed: bool = False,
    ) -> None:
        self.ctx, self.cfg, self.source, self.epochs = ctx, cfg, source, epochs
        self.sealed = sealed

    # ---- counts ------------------------------------------------------------------------
    def start(self, epoch: int) -> StreamsPosition:
        return StreamsPosition([self.ctx.start_cursor(epoch) for _ in range(self.cfg.streams)])

    def epoch_of(self, position: StreamsPosition) -> int:
        return position.epoch

    def begin(self, position: StreamsPosition, epochs: int | None) -> int | None:
        return position.begin(epochs)

    def batches_per_epoch(self, epoch: int) -> int:
        return self.cfg.streams * self.ctx.batches_per_stream(epoch)

    def length(self, position: StreamsPosition) -> int:
        return self.batches_per_epoch(position.epoch)

    # ---- state -------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """What a state must match to be loaded here."""
        c = self.cfg
        return {
            "dataset": self.source.identity.state(), "seed": c.seed, "world_size": c.world_size,
            "rank": c.rank, "streams": c.streams, "seq_len": c.seq_len, "batch_size": c.batch_size,
            "shuffle": c.shuffle, "shuffle_window": c.shuffle_window,
            "shuffle_lanes": c.shuffle_lanes, "chunk_batches": c.chunk_batches,
            **self.ctx.config(),
        }  # fmt: skip

    def state_of(self, position: StreamsPosition) -> dict[str, Any]:
        worker = list(position.worker) if position.worker is not None else None
        config, keys = self.config(), self.ctx.cursor_keys
        streams: list[dict[str, Any]] = [dict(c) for c in position.cursors]
        if self.sealed:
            for t, c in enumerate(streams):
                c[SEAL_KEY] = cursor_seal(config, t, c, keys)
        return {
            "version": STATE_VERSION,
            "config": config,
            "streams": streams,
            "next_stream": position.next_stream,
            "chunk_left": self.ctx.chunk_size(position.cursors[position.next_stream]),
            "iter_stop": position.iter_stop,
            "worker": worker,
        }

    def position_of(self, state: Any) -> StreamsPosition:
        """Check ``state`` against this reader and its epoch plans; return its position.

        Everything a state holds is checked (:mod:`wdstream.read.order.streams_state`):
        shape and types, the config, every cursor against the plan (one sidecar read or so
        per stream for docs-mode shards), the round-robin turns, the iteration's stop and
        ``chunk_left``.

        Raises:
            StateMismatchError: naming the first bad field (``streams[1].offset``) and value.
        """
        config = accept_dataset(state, self.config(), self.source)
        position, chunk_left = parse_state(state, config, self.ctx.cursor_keys, self.sealed)
        for t, cursor in enumerate(position.cursors):
            self.ctx.check_cursor(t, cursor)
        if self.ctx.lockstep:
            check_turns(position, self.ctx.batches_per_stream, self.cfg.chunk_batches)
            check_iter_stop(position, self.epochs)
        want = self.ctx.chunk_size(position.cursors[position.next_stream])
        if chunk_left != want:
            raise mismatch(
                "chunk_left", chunk_left, f"streams[{position.next_stream}] has {want} left"
            )
        return position

    def position_from_dict(self, d: dict[str, Any]) -> StreamsPosition:
        return StreamsPosition.from_dict(d)

    # ---- batches -----------------------------------------------------------------------
    def fill_step(
        self, step: int, position: StreamsPosition, tokens: np.ndarray, doc: DocStarts
    ) -> None:
        raise TypeError("batch_at needs order='global' on a packed dataset")

    def skip_steps(self, position: StreamsPosition, n: int) -> StreamsPosition:
        raise TypeError(
            "skip_steps needs order='global' (or a mixture) on a packed dataset: per-rank "
            "streams have no global step to skip to"
        )

    def data_step(self, position: StreamsPosition, training_step: int) -> int:
        raise TypeError("data_step needs order='global' (or a mixture) on a packed dataset")

    def release(self) -> None:
        """Nothing is cached across iterations (each stream closes its own reads)."""

    def stop_reads_when(self, outside: Callable[[], bool] | None) -> None:
        """Not looked at: a stream's reads are whole shards, read where they are used."""

    def first_chunk(
        self, position: StreamsPosition, buffers: ChunkBuffers, epochs: int | None
    ) -> FilledChunk | None:
        raise TypeError("per-rank streams make their first chunks in their workers")

    def _schedule(
        self, position: StreamsPosition, worker: Worker, epochs: int | None
    ) -> tuple[list[int], int | None]:
        """This process's stream order and the epoch at which this ``iter()`` stops."""
        wid, nw = worker if worker is not None else (0, 1)
        S = self.cfg.streams
        if S % nw:
            raise ValueError(f"streams={S} must be a multiple of the number of workers {nw}")
        pos = position
        if pos.worker is not None and list(pos.worker) == [wid, nw]:
            first = pos.next_stream  # a worker's own saved state (StatefulDataLoader)
        elif pos.worker is not None and pos.worker[1] != 1:
            raise StateMismatchError(
                f"state was taken in worker {pos.worker[0]} of {pos.worker[1]}, "
                f"restored in worker {wid} of {nw}"
            )
        else:
            first = (pos.next_stream + wid) % S
        order = [(first + j * nw) % S for j in range(S // nw)]
        stop = pos.begin(epochs)
        pos.worker = worker
        pos.next_stream = first
        return order, stop

    def chunks(
        self, position: StreamsPosition, worker: Worker, buffers: ChunkBuffers, epochs: int | None
    ) -> Iterator[FilledChunk]:
        """This process's chunks in round-robin order, advancing ``position``."""
        order, stop = self._schedule(position, worker, epochs)
        if worker is not None and worker[0] == 0 and worker[1] > 1:
            self.ctx.lead(worker[1])  # its first chunk is the iteration's first batch
        pos, cfg = position, self.cfg
        streams = {s: self.ctx.stream(s, pos.cursors[s]) for s in order}
        try:
            for i in itertools.count():
                s = order[i % len(order)]
                if stop is not None and pos.cursors[s]["epoch"] >= stop:
                    if all(pos.cursors[t]["epoch"] >= stop for t in order):
                        pos.iter_stop = None  # finished: the next iter() continues after it
                        return
                    # Raw text: streams end their epochs at different batch counts. A
                    # finished stream still takes its turn, as an empty chunk, so the turn
                    # order (and a restored worker rotation) stays that of all streams.
                    pos.next_stream = order[(i + 1) % len(order)]
                    tokens, _ = buffers.take(i, 0)
                    yield s, i, tokens, None, []
                    continue
                n = self.ctx.chunk_size(pos.cursors[s])
                rows = n * cfg.batch_size
                tokens, positions = buffers.take(i, rows)
                doc = np.empty((rows, cfg.seq_len + 1), dtype=bool) if cfg.doc_boundaries else None
                cursors = streams[s].fill(tokens.numpy(), doc, n)
                if len(cursors) < n:  # raw text: the epoch ended early (a shorter chunk)
                    rows = len(cursors) * cfg.batch_size
                    tokens = tokens[:rows]
                    positions = positions[:rows] if positions is not None else None
                    doc = doc[:rows] if doc is not None else None
                if doc is not None and positions is not None:
                    positions.numpy()[:] = position_ids(doc)
                pos.cursors[s] = dict(cursors[-1])
                pos.next_stream = order[(i + 1) % len(order)]
                yield s, i, tokens, positions, cursors
        finally:
            for st in streams.values():
                st.close()
