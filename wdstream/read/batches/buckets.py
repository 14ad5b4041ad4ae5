"""Length-bucketed token-budget batches over a ``--mode docs`` dataset, exactly resumable.

Each sample of a docs-mode dataset is one document; a batch is a few rows of similar length
padded to the longest, at most ``max_tokens`` input tokens including padding. A document of
``L`` tokens has ``L - 1`` inputs (``input_ids = doc[:-1]``, ``labels = doc[1:]``); one
longer than ``seq_len`` inputs is *split*, never cropped: piece ``k`` is the row
``doc[k*seq_len : (k+1)*seq_len + 1]``, so every input and every target of the document is
in exactly one row of the epoch, and ``position_ids`` continue across pieces (piece ``k``
starts at position ``k * seq_len``; a row whose first position is not 0 continues a
document). The epoch's batches are a pure function of the index's sample lengths and
``(seed, epoch)``:

1. the rows (pieces, in dataset order) in a permutation seeded by ``(seed, epoch)``;
2. cut into pools of ``pool`` rows; each pool sorted by row length (stable) and cut
   greedily into batches: the next row joins while ``rows x longest <= max_tokens``;
3. all batches of the epoch in a permutation seeded by ``(seed, epoch)``;
4. each global step takes the next ``world_size`` batches, rank ``r`` the ``r``-th; every
   rank yields ``len(batches) // world_size`` batches per epoch (the rest, fewer than
   ``world_size`` batches and a different few each epoch, is left out, counted in
   :meth:`BucketedBatches.epoch_stats` and logged), so no DDP rank waits on another.

With no document longer than ``seq_len + 1`` tokens the rows are the documents and the plan
is the one of version 1 of this state (which cropped), so such states still load.

Pools keep batches local in length without making them identical every epoch (infinibatch's
``BucketedReadaheadBatchIterator`` does the same with a read-ahead window). The cursor is
``(epoch, batch)``, ``batch`` the batches of the plan served so far: restoring recomputes
the epoch's plan from the index (no reads of data, no replay) and continues there. The plan
does not depend on the world size, so a state continues on another world size too: the
steps after it hold the same batches, spread over the new ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from wdstream.errors import StateMismatchError
from wdstream.format.loss import split_ids
from wdstream.read.batches.rows import IGNORE_INDEX
from wdstream.read.order.state_fields import accept_dataset
from wdstream.read.sources.packed import ShardSource

__all__ = ["BUCKETS_STATE_VERSION", "BucketedBatches", "bucket_plan", "split_rows"]

log = logging.getLogger("wdstream.read")

BUCKETS_STATE_VERSION = 2  # 1: documents cropped to seq_len (loads where none is longer)
_STREAM = 0xB0C7  # separates this module's random streams from every other's


def bucket_plan(
    rows: np.ndarray, max_tokens: int, seed: int, epoch: int, pool: int = 8192
) -> list[np.ndarray]:
    """One epoch's batches: arrays of row numbers, in the order they are served.

    Args:
        rows: input tokens of each row (at most ``seq_len``); rows of 0 are left out (a
            document of one token has no target).
        max_tokens: budget of one batch: ``len(batch) x max(rows in it) <= max_tokens``.
        seed, epoch: the permutations' seeds.
        pool: samples sorted together (larger: less padding, batches more alike each epoch).

    Raises:
        ValueError: a row longer than ``max_tokens`` (it fits no batch).
    """
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and int(rows.max()) > max_tokens:
        raise ValueError(
            f"max_tokens={max_tokens} is below the longest row ({int(rows.max())} tokens); "
            "raise it or read with a smaller seq_len"
        )
    rng = np.random.Generator(np.random.PCG64([seed, epoch, _STREAM]))
    order = rng.permutation(len(rows))
    order = order[rows[order] > 0]
    batches: list[np.ndarray] = []
    for a in range(0, len(order), pool):
        part = order[a : a + pool]
        part = part[np.argsort(rows[part], kind="stable")]
        start = 0
        for i, n in enumerate(rows[part].tolist()):
            if (i + 1 - start) * n > max_tokens:
                batches.append(part[start:i])
                start = i
        if start < len(part):
            batches.append(part[start:])
    return [batches[i] for i in rng.permutation(len(batches))]


def split_rows(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of documents of ``lengths`` tokens: ``(sample, start, inputs)`` per row.

    A document of ``L`` tokens gives ``max(1, ceil((L - 1) / seq_len))`` rows, in order;
    row ``k`` holds tokens ``[k * seq_len, k * seq_len + inputs + 1)`` of it (neighbouring
    rows share one token: the last target of one is the first input of the next), so
    every input and every target is in exactly one row. A document of at most one token
    keeps one row of 0 inputs (the plan leaves it out), so with no document longer than
    ``seq_len + 1`` the rows are exactly the samples.
    """
    inputs = np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0)
    n = np.maximum(1, -(-inputs // seq_len))
    sample = np.repeat(np.arange(len(inputs), dtype=np.int64), n)
    first = np.cumsum(n) - n
    start = (np.arange(len(sample), dtype=np.int64) - np.repeat(first, n)) * seq_len
    return sample, start, np.minimum(inputs[sample] - start, seq_len)


class BucketedBatches:
    """Token-budget batches of a docs-mode dataset for one rank, with ``state_dict``.

    Yields ``{"input_ids", "labels", "attention_mask", "position_ids"}``: int64
    ``[B, T_batch]``, padded with ``pad_id`` (the EOS id, else 0); ``labels`` -100 on
    padding; ``attention_mask`` 1 on real inputs (those whose target is a real token);
    ``position_ids`` each input's position in its document (continuing across the pieces
    of a split document), 0 on padding. ``B`` and ``T_batch`` vary from batch to batch.

    Args:
        source: the dataset (root or ``ShardSource``); it must be ``--mode docs``.
        seq_len: longest row; longer documents are split into rows of ``seq_len`` inputs
            (:func:`split_rows`), every token served once per epoch.
        max_tokens: input tokens per batch, padding included.
        seed, rank, world_size: as for :class:`wdstream.Loader`.
        epochs: epochs per ``iter()`` (None: forever).
        pool: samples sorted together (see :func:`bucket_plan`).

    Raises:
        ValueError: for a dataset of another mode, or a budget below ``seq_len``.
    """

    def __init__(
        self,
        source: str | ShardSource,
        seq_len: int,
        max_tokens: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        epochs: int | None = None,
        pool: int = 8192,
        **store_options: Any,
    ) -> None:
        self.source = (
            source if isinstance(source, ShardSource) else ShardSource(source, **store_options)
        )
        index = self.source.index
        if index is None or index.mode != "docs":
            mode = index.mode if index is not None else "unknown (no index.json)"
            raise ValueError(
                f"max_tokens batches need a dataset packed with --mode docs (one document "
                f"per sample), this one's mode is {mode}"
            )
        if max_tokens < seq_len:
            raise ValueError(f"max_tokens={max_tokens} must be >= seq_len={seq_len}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.seq_len, self.max_tokens, self.seed = seq_len, max_tokens, seed
        self.rank, self.world_size, self.epochs, self.pool = rank, world_size, epochs, pool
        self.pad_id = index.eos_id if index.eos_id is not None else 0
        self.loss_mask = index.loss_mask is not None  # ids carry bit 31 (format.loss)
        counts = [self.source.token_counts(s, 0, int(n)) for s, n in enumerate(self.source.samples)]
        lengths = np.concatenate(counts) if counts else np.zeros(0, np.int64)
        self.row_sample, self.row_start, self.rows = split_rows(lengths, seq_len)
        self.split_documents = int(np.count_nonzero(lengths > seq_len + 1))
        self.first = np.concatenate([[0], np.cumsum(self.source.samples)]).astype(np.int64)
        self.epoch, self.served = 0, 0  # batches of the epoch's plan served (all ranks)
        self._plan: tuple[int, list[np.ndarray]] | None = None

    # ---- plan and state -------------------------------------------------------------------
    def plan(self, epoch: int) -> list[np.ndarray]:
        """Every batch of ``epoch`` (all ranks), cached for the current epoch."""
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (
                epoch,
                bucket_plan(self.rows, self.max_tokens, self.seed, epoch, self.pool),
            )
        return self._plan[1]

    def batches_per_epoch(self, epoch: int | None = None) -> int:
        """Batches every rank yields in a whole ``epoch`` (default: the current one)."""
        return len(self.plan(self.epoch if epoch is None else epoch)) // self.world_size

    def __len__(self) -> int:
        return self.batches_per_epoch()

    def epoch_stats(self, epoch: int | None = None) -> dict[str, int]:
        """Where every row of ``epoch`` (default: the current one) goes, all ranks together.

        ``documents``: samples with at least one target; ``split_documents``: those longer
        than ``seq_len + 1`` tokens, served as ``rows - documents`` extra rows; ``rows``,
        ``tokens``: rows and input tokens of the epoch's plan; ``batches``: the plan's
        batches; ``served_*``: what the ranks yield (``batches_per_epoch x world_size``
        batches); ``left_out_*``: the rest, fewer than ``world_size`` batches.
        """
        plan = self.plan(self.epoch if epoch is None else epoch)
        served = len(plan) // self.world_size * self.world_size
        rows = [len(b) for b in plan]
        tokens = [int(self.rows[b].sum()) for b in plan]
        return {
            "documents": int(np.count_nonzero((self.row_start == 0) & (self.rows > 0))),
            "split_documents": self.split_documents,
            "rows": sum(rows), "tokens": sum(tokens), "batches": len(plan),
            "served_batches": served, "served_rows": sum(rows[:served]),
            "served_tokens": sum(tokens[:served]), "left_out_batches": len(plan) - served,
            "left_out_rows": sum(rows[served:]), "left_out_tokens": sum(tokens[served:]),
        }  # fmt: skip

    def _config(self) -> dict[str, Any]:
        return {
            "dataset": self.source.identity.state(), "seq_len": self.seq_len,
            "max_tokens": self.max_tokens, "seed": self.seed, "pool": self.pool,
        }  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Position after the last batch handed out: ``(epoch, batch)`` plus the config."""
        return {
            "version": BUCKETS_STATE_VERSION, "kind": "buckets", "epoch": self.epoch,
            "batch": self.served, "config": self._config(),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batch at which ``state`` was taken (O(1): no replay).

        Raises:
            StateMismatchError: a state of another dataset or configuration, or malformed.
        """
        if not isinstance(state, dict) or state.get("kind") != "buckets":
            raise StateMismatchError("not a max_tokens (bucketed batches) state")
        version = state.get("version")
        if type(version) is not int or version not in (1, BUCKETS_STATE_VERSION):
            raise StateMismatchError(f"version: {version!r}, expected {BUCKETS_STATE_VERSION}")
        if version == 1 and self.split_documents:
            raise StateMismatchError(
                f"version: 1, a state of a reader that cropped documents longer than "
                f"seq_len={self.seq_len}; this one splits them ({self.split_documents} such "
                "documents here), so its batches are not that run's: start an epoch afresh"
            )
        theirs, ours = state.get("config"), accept_dataset(state, self._config(), self.source)
        if theirs != ours:
            keys = sorted(
                k for k in ours if not isinstance(theirs, dict) or theirs.get(k) != ours[k]
            )
            raise StateMismatchError(
                f"state of another configuration (differs in: {', '.join(keys)})"
            )
        epoch, served = state.get("epoch"), state.get("batch")
        if not (type(epoch) is int and type(served) is int and epoch >= 0 and served >= 0):
            raise StateMismatchError(
                f"epoch/batch: expected integers >= 0, got {epoch!r}/{served!r}"
            )
        if served > len(self.plan(epoch)):
            raise StateMismatchError(f"batch: {served} past the epoch's {len(self.plan(epoch))}")
        self.epoch, self.served = epoch, served

    # ---- iteration --------------------------------------------------------------------------
    def _tokens(self, sample: int) -> np.ndarray:
        shard = int(np.searchsorted(self.first, sample, side="right")) - 1
        k = sample - int(self.first[shard])
        toks = self.source.read([(shard, k, k + 1)])[0].tokens.views()
        return toks[0]

    def batch(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        """The padded batch of ``rows`` (row numbers of :func:`split_rows`)."""
        T = int(self.rows[rows].max())
        tokens = np.full((len(rows), T + 1), self.pad_id, dtype=np.int64)
        real = np.zeros((len(rows), T + 1), dtype=bool)
        positions = np.zeros((len(rows), T), dtype=np.int64)
        for i, r in enumerate(rows.tolist()):
            n, a = int(self.rows[r]), int(self.row_start[r])
            tokens[i, : n + 1] = self._tokens(int(self.row_sample[r]))[a : a + n + 1]
            real[i, : n + 1] = True
            positions[i, :n] = np.arange(a, a + n)
        supervised = real[:, 1:]
        if self.loss_mask:
            tokens, no_loss = split_ids(tokens)
            supervised = supervised & ~no_loss[:, 1:]
        t = torch.from_numpy(tokens)
        inputs = torch.from_numpy(real[:, 1:])  # input t is real iff its target is
        return {
            "input_ids": t[:, :-1].contiguous(),
            "labels": t[:, 1:].masked_fill(~torch.from_numpy(supervised), IGNORE_INDEX),
            "attention_mask": inputs.to(torch.int64),
            "position_ids": torch.from_numpy(positions),
        }

    def _report(self, epoch: int) -> None:
        """Log the rows an epoch leaves out (fewer than ``world_size`` batches), if any."""
        stats = self.epoch_stats(epoch)
        if stats["left_out_batches"]:
            log.info(
                "max_tokens epoch %d: %d of %d batches (%d rows, %d of %d tokens) left out so "
                "that each of %d ranks yields %d", epoch, stats["left_out_batches"],
                stats["batches"], stats["left_out_rows"], stats["left_out_tokens"],
                stats["tokens"], self.world_size, stats["served_batches"] // self.world_size,
            )  # fmt: skip

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """``epochs`` epochs (forever when None) from the current position; a position at
        an epoch's end starts the next one."""
        W = self.world_size
        if self.served + W > len(self.plan(self.epoch)):
            self.epoch, self.served = self.epoch + 1, 0
        stop = None if self.epochs is None else self.epoch + self.epochs
        while True:
            plan = self.plan(self.epoch)
            if self.served == 0 and self.rank == 0:
                self._report(self.epoch)
            while self.served + W <= len(plan):
                b = self.batch(plan[self.served + self.rank])
                self.served += W
                yield b
            if stop is not None and self.epoch + 1 >= stop:
                return
            self.epoch, self.served = self.epoch + 1, 0
