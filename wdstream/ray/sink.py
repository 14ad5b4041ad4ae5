"""A Ray Data ``Datasink`` that packs a Dataset's text column into a wdstream dataset.

::

    ds = ray.data.read_json("s3://b/raw/").filter(lambda r: len(r["text"]) > 200)
    ds.write_datasink(wdstream.ray.Sink("s3://b/web/", tokenizer="cl100k_base", seq_len=2048))

Each write task tokenises its blocks on its worker and keeps the tokens in the object store
(only document lengths travel to the driver). When every task is done, the driver lays the
documents out in write-task order with the same sample builder and shard layout as ``pack``
(:mod:`wdstream.ray.engine`), shard tasks write the shards straight to the output, and the
driver commits ``index.json`` under the output's writer lock.

What differs from ``pack``: rows have no input file and line, so no provenance tables are
written; the documents' order is the Dataset's write order (set
``DataContext.get_current().execution_options.preserve_order = True`` for the same output on
every run); a failed write leaves the shards it wrote and its journal, and the sink refuses
an output that holds anything: pack into a fresh output. Rows whose text is null or empty
count as empty documents; a text that is not a string raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import ray
from ray.data.block import BlockAccessor
from ray.data.datasource.datasink import Datasink, WriteResult

from wdstream.errors import WdstreamError
from wdstream.format.index import INDEX_NAME, JOURNAL_NAME
from wdstream.format.sample import token_dtype_for_vocab
from wdstream.inputs import InputFile
from wdstream.ray.engine import write_tokenized
from wdstream.ray.pieces import PieceDocs
from wdstream.ray.tasks import cached_tokenizer, worker_recipe
from wdstream.storage import open_store
from wdstream.tokenizers import load_tokenizer
from wdstream.write.bestfit import DEFAULT_BUFFER
from wdstream.write.builders import check_mode, sample_builder, special_ids
from wdstream.write.commit import DatasetMeta, commit_dataset
from wdstream.write.engine import PackJob
from wdstream.write.journal import Journal
from wdstream.write.lock import acquire
from wdstream.write.shards import parse_size, shard_names
from wdstream.write.tokenpool import encode_flat

__all__ = ["Sink"]

_SOURCE = "<ray dataset>"  # the one pseudo input the rows belong to


class Sink(Datasink[tuple[int, PieceDocs, Any]]):
    """Pack the ``text_key`` column of a Ray Dataset into shards of tokens at ``url``.

    Args:
        url: dataset root (a folder every node shares, ``s3://``, ``http(s)://``).
        tokenizer, backend, seq_len, mode, eos, bos, bos_id, shard_size, shard_samples,
            name, bestfit_buffer: as for :func:`wdstream.pack`.
        text_key: the column holding each document's text.
        store_options: passed to :func:`~wdstream.storage.open_store` (driver and workers).
        progress: show the driver's progress bar while shards are written.

    Raises:
        WdstreamError: (when the write starts) ``url`` already holds a dataset or an
            interrupted pack.
    """

    def __init__(
        self,
        url: str,
        *,
        tokenizer: str = "cl100k_base",
        backend: str = "auto",
        seq_len: int = 2048,
        mode: str = "concat",
        text_key: str = "text",
        eos: bool = True,
        bos: bool = False,
        bos_id: int | None = None,
        shard_size: str | int = "256MB",
        shard_samples: int | None = None,
        name: str = "data",
        bestfit_buffer: int = DEFAULT_BUFFER,
        store_options: dict[str, Any] | None = None,
        progress: bool = False,
    ) -> None:
        check_mode(mode, seq_len, eos)
        self.url, self.text_key, self.mode, self.seq_len = url, text_key, mode, seq_len
        self.tok = load_tokenizer(tokenizer, backend)
        self.eos_id, self.bos_id = special_ids(self.tok, eos, bos, bos_id)
        self.dtype = token_dtype_for_vocab(max(self.tok.n_vocab, (self.bos_id or 0) + 1))
        self.shard_bytes, self.shard_samples = parse_size(shard_size), shard_samples
        self.name, self.bestfit_buffer = name, bestfit_buffer
        self.store_options = dict(store_options or {})
        self.progress = progress
        self._recipe = worker_recipe(self.tok)  # workers rebuild what encodes once

    def __getstate__(self) -> dict[str, Any]:
        # Write tasks rebuild the tokenizer from its recipe once per worker; shipping the
        # Tokenizer itself would reload it for every task.
        return {k: v for k, v in self.__dict__.items() if k != "tok"}

    def on_write_start(self, schema: Any = None) -> None:
        """Refuse an output that holds anything before any row is tokenised."""
        store = open_store(self.url, create=True, **self.store_options)
        for held in (INDEX_NAME, JOURNAL_NAME, shard_names(self.name, 0)[0]):
            if store.exists(held):
                raise WdstreamError(
                    f"{store.child_url(held)} exists: the Ray Data sink writes only into an "
                    "empty output; choose a fresh one or remove what is there"
                )

    def write(self, blocks: Iterable[Any], ctx: Any) -> tuple[int, PieceDocs, Any]:
        """Tokenise this task's rows; their tokens stay in the object store."""
        texts: list[str] = []
        records: list[int] = []
        empty_before: list[int] = []
        bytes_before: list[int] = []
        rows = empty = size = 0
        for block in blocks:
            for value in BlockAccessor.for_block(block).to_arrow()[self.text_key].to_pylist():
                if value is not None and not isinstance(value, str):
                    raise ValueError(
                        f"column {self.text_key!r} of write task {ctx.task_idx}, row {rows}: "
                        f"expected text, got {type(value).__name__}"
                    )
                if value:
                    texts.append(value)
                    records.append(rows)
                    empty_before.append(empty)
                    bytes_before.append(size)
                    size += len(value.encode("utf-8"))
                else:
                    empty += 1
                rows += 1
        flat, lens = encode_flat(
            cached_tokenizer(self._recipe), texts, self.bos_id, self.eos_id, self.dtype
        )
        n = len(texts)
        docs = PieceDocs(
            lens=lens,
            records=np.asarray(records, dtype=np.int64),
            offsets=np.zeros(n, dtype=np.int64),
            empty=np.asarray(empty_before, dtype=np.int64),
            bad=np.zeros(n, dtype=np.int64),
            input_bytes=np.asarray(bytes_before, dtype=np.int64),
            lines=rows,
            total_empty=empty,
            total_input_bytes=size,
        )
        return ctx.task_idx, docs, ray.put(flat)

    def on_write_complete(self, write_result: WriteResult[tuple[int, PieceDocs, Any]]) -> None:
        """Lay out, write and commit the shards, then ``index.json`` (under the lock)."""
        given = [(docs, ref) for _, docs, ref in sorted(write_result.write_returns, key=_first)]
        store = open_store(self.url, create=True, **self.store_options)
        lock = acquire(store, False)
        try:
            fingerprint = {"ray_data_sink": self.url, "tokenizer": self.tok.info()}
            journal = Journal(store, fingerprint, self.name)
            job = PackJob(
                files=[InputFile(_SOURCE)], text_key=self.text_key, lines=False,
                on_error="raise", errors="strict", tokenizer=self.tok, bos_id=self.bos_id,
                eos_id=self.eos_id, dtype=self.dtype,
                new_builder=lambda dt, pad: sample_builder(
                    self.mode, self.seq_len, self.bestfit_buffer, self.bos_id, self.eos_id, dt, pad
                ),
                pad_id=self.eos_id or 0, name=self.name, shard_bytes=self.shard_bytes,
                shard_samples=self.shard_samples, output=self.url,
                store_options=self.store_options, provenance=None, progress=self.progress,
            )  # fmt: skip
            totals = write_tokenized(job, journal, given)
            entries = tuple(journal.entries)
            if not entries:
                raise WdstreamError(f"no non-empty {self.text_key!r} values to pack")
            stats = {
                "documents": sum(e.documents for e in entries),
                "empty_documents_skipped": totals.empty,
                "records_skipped": 0,
                "skipped_locations": [],
                "input_bytes": totals.input_bytes,
                "input_files": 0,
            }
            meta = DatasetMeta(
                self.tok.info(), self.eos_id, self.bos_id, self.dtype, self.mode, self.seq_len
            )
            commit_dataset(store, lock, journal, meta, stats)
        finally:
            lock.release()


def _first(item: tuple[int, PieceDocs, Any]) -> int:
    return item[0]
