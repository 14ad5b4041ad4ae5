"""Token streams over raw text, tokenized on the fly, with the indexed reader's cursor semantics.

Without an index there are no counts to plan with, so the split is by *files*
(webdataset's shard-level split): epoch ``e``'s file order is a permutation seeded by
``(seed, e)`` and file ``i`` of it goes to global stream ``i % (world_size * streams)``::

    files (epoch order)  f3 f0 f5 f1 f4 f2          2 ranks x 1 stream
    rank 0               f3 f5 f4
    rank 1               f0 f1 f2

A stream reads its files in order, ``W`` documents per window, emitted in a permutation
seeded by ``(seed, e, rank, stream, window)``; the window is tokenized in pieces along that
order, each one batched call (GIL released), the next piece in the background while the last
is cut into rows (:mod:`~wdstream.read.order.text_pieces`). The cursor is::

    {"epoch": e, "window": w, "file": f, "byte": b, "record": r,
     "emitted": k, "offset": o, "batches": d}

"window ``w`` of epoch ``e`` starts at byte ``b`` (record ``r``) of the stream's ``f``-th
file; the next token is token ``o`` of its ``k``-th document in shuffled order; ``d`` batches
of this epoch are done". Restoring re-reads that one window's text (a seek for plain files;
for ``.gz``/``.zst`` a decompression from the file's start) and tokenizes it from document
``k`` on, never replays the epoch.

A stream's epoch ends when its files cannot fill another batch (the rest is left out), or
after ``batches_per_epoch / streams`` batches when that cap is given; the cap is the only way
to make every rank yield the same number of batches, since file sizes are unknown up front.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from wdstream.errors import InputError, StateMismatchError
from wdstream.read.order.state_fields import mismatch
from wdstream.read.order.streams_context import ReaderConfig, copy_window
from wdstream.read.order.text_pieces import DocReader, TextPiece, TextWindow, pieces
from wdstream.read.sources.text import TextSource

__all__ = ["TEXT_CURSOR_KEYS", "TextContext", "TextStream"]

TEXT_CURSOR_KEYS = ("epoch", "window", "file", "byte", "record", "emitted", "offset", "batches")


class TextContext:
    """Per-process shared pieces of a raw-text reader: source, file split, tokenizer threads.

    Args:
        source: the text files and tokenizer.
        cfg: batch geometry, shuffle and split (``shuffle_window`` counts documents).
        batches_per_epoch: per-rank cap (a multiple of ``cfg.streams``), or None.
        tokenize_threads: threads of one batched tokenizer call (default: CPU count).
    """

    cursor_keys = TEXT_CURSOR_KEYS

    def __init__(
        self,
        source: TextSource,
        cfg: ReaderConfig,
        batches_per_epoch: int | None = None,
        tokenize_threads: int | None = None,
    ) -> None:
        n_streams = cfg.world_size * cfg.streams
        if len(source) < n_streams:
            # Every rank computes the same, so every rank fails here instead of one rank
            # yielding nothing and the others hanging in their first collective.
            raise ValueError(
                f"{len(source)} text files cannot feed {cfg.world_size} ranks x {cfg.streams} "
                f"streams: the split is by file, so give at least {n_streams} files or fewer "
                "streams / workers"
            )
        if batches_per_epoch is not None and (
            batches_per_epoch < cfg.streams or batches_per_epoch % cfg.streams
        ):
            raise ValueError(
                f"batches_per_epoch must be a positive multiple of streams={cfg.streams}, "
                f"got {batches_per_epoch!r}"
            )
        self.source = source
        self.cfg = cfg
        self.cap = batches_per_epoch
        self.threads = tokenize_threads or os.cpu_count() or 1
        self._lead: int | None = None  # threads of this process's next tokenizer call (lead)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "cfg": self.cfg, "cap": self.cap, "threads": self.threads}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["source"], state["cfg"], state["cap"], state["threads"])  # type: ignore[misc]

    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="wdstream-textahead")
            return self._pool

    def config(self) -> dict[str, Any]:
        """What a state must match besides the shared reader config."""
        return {
            "tokenizer": self.source.tokenizer_id(),
            "text_key": self.source.text_key,
            "batches_per_epoch": self.cap,
        }

    @staticmethod
    def start_cursor(epoch: int = 0) -> dict[str, int]:
        return dict.fromkeys(TEXT_CURSOR_KEYS, 0) | {"epoch": epoch}

    def stream(self, stream: int, cursor: dict[str, int]) -> TextStream:
        return TextStream(self, stream, cursor)

    def batches_per_stream(self, epoch: int) -> int:
        """Batches every stream yields per epoch: only known with ``batches_per_epoch``.

        Raises:
            TypeError: without the cap (raw text has no length before it is read).
        """
        if self.cap is None:
            raise TypeError(
                "a raw-text source has no batch count per epoch; pass batches_per_epoch= to "
                "fix one (needed for equal counts across DDP ranks)"
            )
        return self.cap // self.cfg.streams

    def chunk_size(self, cursor: dict[str, int]) -> int:
        """Most batches the next chunk of a stream at ``cursor`` holds."""
        k, d = self.cfg.chunk_batches, cursor["batches"]
        n = k - d % k
        return n if self.cap is None else min(n, self.cap // self.cfg.streams - d)

    @property
    def lockstep(self) -> bool:
        """Whether streams served in turn move in step: only with the per-epoch cap (without
        it each stream's epoch ends when its own files run out)."""
        return self.cap is not None

    def check_cursor(self, stream: int, cursor: dict[str, int]) -> None:
        """Refuse a cursor past the epoch's cap or the stream's files.

        Where a window starts inside its file (``byte``), and the document and token in it,
        are checked when the window is re-read (:meth:`TextStream.fill`); ``window`` and
        ``record`` only seed the shuffle and name positions in messages, so nothing checks
        them beyond their range.

        Raises:
            StateMismatchError: naming the field (``streams[1].file``) and its value.
        """
        e, d = cursor["epoch"], cursor["batches"]
        if self.cap is not None and d >= self.cap // self.cfg.streams:
            nb = self.cap // self.cfg.streams
            raise mismatch(
                f"streams[{stream}].batches", d, f"batches_per_epoch gives {nb} per stream"
            )
        n = len(self.files(e, stream))
        if cursor["file"] >= n:
            raise mismatch(
                f"streams[{stream}].file", cursor["file"], f"epoch {e} gives it {n} files"
            )

    def files(self, epoch: int, stream: int) -> list[int]:
        """The stream's files in epoch ``epoch``, in reading order."""
        cfg = self.cfg
        n = len(self.source)
        order = (
            np.random.default_rng([cfg.seed, epoch]).permutation(n) if cfg.shuffle else np.arange(n)
        )
        g = cfg.rank * cfg.streams + stream
        return [int(i) for i in order[g :: cfg.world_size * cfg.streams]]

    def window_order(self, epoch: int, stream: int, window: int, n: int) -> np.ndarray:
        """The order a window's ``n`` documents are emitted in (its seeded permutation)."""
        cfg = self.cfg
        if not cfg.shuffle:
            return np.arange(n)
        return np.random.default_rng([cfg.seed, epoch, cfg.rank, stream, window]).permutation(n)

    def lead(self, workers: int) -> None:
        """The next tokenizer call (worker 0's first piece: the first chunk, which the first
        batch waits for) uses the threads of all ``workers`` (``tokenize_threads`` is per
        worker). On 2 cores at 2 workers that piece took 0.44-0.55 s on one thread while
        worker 1 tokenized its own first piece; the other workers' first chunks come 16
        batches later (docs/READER.md, raw text)."""
        self._lead = self.threads * workers

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Tokenize documents in one batched call and flatten them in the order given:
        ``(int32 tokens, int64 starts[n + 1], doc starts or None)``, EOS after each."""
        threads, self._lead = self._lead or self.threads, None
        # tiktoken's and tokenizers' batch encoders run their own threads (GIL released).
        ids = self.source.tokenizer.encode_ordinary_batch(texts, num_threads=threads)
        n = len(ids)
        eos = self.source.eos_id
        lens = np.fromiter((len(x) for x in ids), dtype=np.int64, count=n)
        lens += eos is not None
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=starts[1:])
        flat = np.empty(int(starts[-1]), dtype=np.int32)
        for j, x in enumerate(ids):
            a, b = int(starts[j]), int(starts[j + 1])
            if eos is not None:
                flat[a : b - 1] = x
                flat[b - 1] = eos
            else:
                flat[a:b] = x
        doc_start = None
        if self.cfg.doc_boundaries:
            doc_start = np.zeros(len(flat), dtype=bool)
            doc_start[starts[:-1][lens > 0]] = True
        return flat, starts, doc_start


class TextStream:
    """Rows of ``seq_len + 1`` tokens from one stream's text files, resumable from a cursor."""

    def __init__(self, ctx: TextContext, stream: int, cursor: dict[str, int]) -> None:
        self.ctx = ctx
        self.stream = stream
        self._cursor = dict(cursor)
        self._wins: list[TextPiece] = []  # the current piece first, then read-ahead ones
        self._pos = 0
        self._reader: DocReader | None = None
        self._pieces: Iterator[TextPiece] | None = None
        self._ahead: Future[TextPiece | None] | None = None
        self._files: list[int] = []
        self._done = False  # the reader has no more documents in this epoch

    def cursor(self) -> dict[str, int]:
        """The position after the last batch produced (JSON-serialisable)."""
        return dict(self._cursor)

    def close(self) -> None:
        self._drop()

    def _drop(self) -> None:
        ahead, reader, gen = self._ahead, self._reader, self._pieces
        self._ahead = self._reader = self._pieces = None
        self._wins = []
        self._done = False
        if reader is not None:

            def close(_: object = None) -> None:
                if gen is not None:
                    gen.close()  # type: ignore[attr-defined]
                reader.close()

            if ahead is None or ahead.cancel() or ahead.done():
                close()
            else:  # still tokenizing: close once it is done
                ahead.add_done_callback(close)

    def _next_piece(self) -> TextPiece | None:
        """The piece after the last one loaded, then start tokenizing the one after it."""
        gen = self._pieces
        if self._done or gen is None:
            return None
        ahead = self._ahead
        piece = ahead.result() if ahead is not None else next(gen, None)
        self._ahead = None
        if piece is None:
            self._done = True
        else:
            # Tokenize the next piece while this one is cut into rows.
            self._ahead = self.ctx.pool.submit(next, gen, None)
        return piece

    def _ensure(self) -> None:
        """Open the reader and load the cursor's window and first piece if nothing is loaded.

        Raises:
            StateMismatchError: for ``emitted`` past the window's documents or ``offset``
                past that document's tokens.
        """
        if self._wins or self._done:
            return
        c, ctx = self._cursor, self.ctx
        self._files = ctx.files(c["epoch"], self.stream)
        if c["file"] >= len(self._files):
            self._done = True
            return
        reader = self._reader = self._open(c)
        order = functools.partial(ctx.window_order, c["epoch"], self.stream)
        read = functools.partial(TextWindow.read, size=ctx.cfg.shuffle_window, order=order)
        win = read(reader, c["window"])
        if win is None:
            self._done = True
            return
        s, k, n = self.stream, c["emitted"], len(win.texts)
        if k >= n:
            raise mismatch(f"streams[{s}].emitted", k, f"its window holds {n} documents")
        cfg = ctx.cfg
        first_tokens = ctx.chunk_size(c) * cfg.batch_size * (cfg.seq_len + 1) + c["offset"]
        self._pieces = pieces(reader, win, k, ctx.tokenize, read, first_tokens)
        piece = self._next_piece()
        assert piece is not None and piece.first == k
        size = int(piece.starts[1])
        if c["offset"] >= size:
            raise mismatch(f"streams[{s}].offset", c["offset"], f"that document has {size} tokens")
        self._wins = [piece]
        self._pos = c["offset"]

    def _open(self, c: dict[str, int]) -> DocReader:
        """A reader from the cursor's window start, which must be where a document starts.

        A cursor inside an epoch names where its window's first document was read, so
        reading from there must meet that document at once; anything else (a byte inside a
        record, past the file's end) is a broken state, not bad data.

        Raises:
            StateMismatchError: naming ``byte`` (and the file) when no document starts there.
        """
        f, byte = c["file"], c["byte"]
        try:
            reader = DocReader(self.ctx.source, self._files, f, byte, c["record"])
        except InputError as exc:
            if c["batches"] == 0:
                raise  # an epoch's start: the data itself is bad
            raise self._not_a_start(c, f"reading there fails: {exc}") from exc
        at = reader.position()
        if c["batches"] and (at is None or at[:2] != (f, byte)):
            reader.close()
            raise self._not_a_start(c, "no document starts there")
        return reader

    def _not_a_start(self, c: dict[str, int], why: str) -> StateMismatchError:
        name = self.ctx.source.where(self._files[c["file"]])
        return mismatch(f"streams[{self.stream}].byte", c["byte"], f"{name}: {why}")

    def _available(self, need: int) -> bool:
        """Whether ``need`` more tokens exist in this epoch (reading windows ahead as needed)."""
        self._ensure()
        have = sum(len(w.tokens) for w in self._wins) - self._pos
        while have < need:
            piece = self._next_piece()
            if piece is None:
                return False
            self._wins.append(piece)
            have += len(piece.tokens)
        return True

    def _end_epoch(self) -> None:
        self._drop()
        self._cursor = self.ctx.start_cursor(self._cursor["epoch"] + 1)

    def fill(
        self, tokens: np.ndarray, doc_start: np.ndarray | None, n: int
    ) -> list[dict[str, int]]:
        """Write up to ``n`` batches into ``tokens`` (``[n * B, seq_len + 1]``).

        Fewer than ``n`` only when the epoch ends; the cursor is then at the next epoch.

        Returns:
            The cursor after each batch written.

        Raises:
            ValueError: if a stream has no full batch in an epoch, or runs out before
                ``batches_per_epoch``.
        """
        cfg = self.ctx.cfg
        per_batch = cfg.batch_size * (cfg.seq_len + 1)
        flat = tokens.reshape(-1)
        flat_ds = doc_start.reshape(-1) if doc_start is not None else None
        if not self._available(per_batch):
            c = self._cursor
            raise ValueError(
                f"rank {cfg.rank} stream {self.stream}: its files "
                f"({[self.ctx.source.where(i) for i in self._files]}) hold less than one batch "
                f"of {cfg.batch_size} x {cfg.seq_len + 1} tokens in epoch {c['epoch']} "
                f"(at batch {c['batches']}); use more or larger files, or fewer streams"
            )
        cursors: list[dict[str, int]] = []
        for j in range(n):
            o = j * per_batch
            stop = o + per_batch
            while o < stop:
                win = self._wins[0]
                take = copy_window(win.tokens, win.doc_start, self._pos, flat, flat_ds, o, stop)
                if take == 0:
                    self._wins.pop(0)
                    self._pos = 0
                    continue
                o += take
                self._pos += take
            cursors.append(self._after_batch(per_batch))
            if cursors[-1]["batches"] == 0:
                break  # the epoch is over
        return cursors

    def _after_batch(self, per_batch: int) -> dict[str, int]:
        c = self._cursor
        d = c["batches"] + 1
        cap = None if self.ctx.cap is None else self.ctx.cap // self.ctx.cfg.streams
        if d == cap:
            self._end_epoch()
            return self.cursor()
        if not self._available(per_batch):
            if cap is not None:
                cfg = self.ctx.cfg
                raise ValueError(
                    f"rank {cfg.rank} stream {self.stream} ran out of text after {d} of {cap} "
                    f"batches in epoch {c['epoch']}: batches_per_epoch={self.ctx.cap} is more "
                    "than these files hold; lower it"
                )
            self._end_epoch()
            return self.cursor()
        while self._pos >= len(self._wins[0].tokens):  # (pieces of empty documents too)
            self._wins.pop(0)
            self._pos = 0
        piece = self._wins[0]
        k, offset = piece.doc_at(self._pos)
        win = piece.window
        self._cursor = {
            "epoch": c["epoch"], "window": win.window, "file": win.file, "byte": win.byte,
            "record": win.record, "emitted": k, "offset": offset, "batches": d,
        }  # fmt: skip
        return self.cursor()
