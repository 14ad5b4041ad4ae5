"""``pack``: text files in, tar shards of tokens plus ``index.json`` out -- resumable.

Pipeline (one packing thread, tokenisation in a pool, writes in a background thread)::

    DocumentReader -> batches (~1 MB) -> TokenPool (ordered) -> ConcatSampleBuilder / DocsSampleBuilder
        -> ShardWriter -> Store  (provenance, sidecar, tar, then journal; index.json last)

Resume: after every shard commit the journal ``.wdstream-pack.json`` records the command's
fingerprint, the committed shards and the input position after the shard's last sample
(:class:`~wdstream.inputs.InputPosition` of the document holding its last token, plus how many of
that document's tokens were packed). A rerun of the same command skips straight to that
record, re-tokenises only that one document, drops its packed tokens, and continues; the
shards it writes are byte-identical to an uninterrupted run's because packing depends only
on the token stream, never on batch or worker boundaries. A write that fails (a full disk
included: the error names the object) is an interruption like any other.

One pack per output: the whole run holds the output's writer lock ``.wdstream-pack.lock``
(:mod:`wdstream.write.lock`), taken before anything there is read or removed.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO

import numpy as np

from wdstream.errors import InputError, WdstreamError
from wdstream.format.checksum import CHECKSUM_NAME
from wdstream.format.index import INDEX_NAME, DatasetIndex
from wdstream.format.provenance import PROVENANCE_VERSION, provenance_name
from wdstream.format.sample import DTYPES, token_dtype_for_vocab
from wdstream.inputs import DocumentReader, InputFile, InputPosition, expand_inputs
from wdstream.storage import Store, open_store
from wdstream.storage.base import ForwardingStore
from wdstream.tokenizers import Tokenizer, load_tokenizer
from wdstream.words import count
from wdstream.write.bestfit import DEFAULT_BUFFER, BestFitSampleBuilder
from wdstream.write.journal import JOURNAL_NAME, Journal
from wdstream.write.lock import LOCK_NAME, acquire
from wdstream.write.progress import Progress
from wdstream.write.samples import ConcatSampleBuilder, DocsSampleBuilder
from wdstream.write.shards import ShardWriter, parse_size, shard_names
from wdstream.write.tokenpool import TokenPool, prestart

__all__ = ["JOURNAL_NAME", "PackResult", "describe", "pack", "sample_builder", "special_ids"]

_CHECK_BYTES = 256 << 10  # input text bpe-openai must reproduce before it is trusted


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` did (timings are not part of the dataset)."""

    index: DatasetIndex
    seconds: float
    resumed_shards: int  # shards found committed by an interrupted run
    workers: int
    pool: str

    @property
    def input_mb_per_s(self) -> float:
        return self.index.stats.get("input_bytes", 0) / 1e6 / max(self.seconds, 1e-9)


def _peek_texts(files: list[InputFile], text_key: str, lines: bool) -> list[str]:
    """A few hundred KB of the first input's text, to check a second backend against."""
    if not files or files[0].path == "-":
        return []
    texts, size = [], 0
    reader = DocumentReader(files[:1], text_key, lines, on_error="skip", errors="replace")
    try:
        for text, _ in reader:
            texts.append(text[:_CHECK_BYTES])
            size += len(text)
            if size >= _CHECK_BYTES:
                break
    except InputError:
        pass  # the real read reports it, at its place in the input
    return texts


def _batches(
    reader: DocumentReader, batch_chars: int, max_docs: int = 8192
) -> Iterator[tuple[list[str], list[InputPosition]]]:
    texts: list[str] = []
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


def _delete_shards_from(store: Store, name: str, first: int) -> None:
    """Delete shards ``first, first+1, ...`` until one is missing.

    Shards are numbered without gaps, so this finds every leftover without listing the
    store (plain HTTP cannot list).
    """
    i = first
    while True:
        names = (*shard_names(name, i), provenance_name(shard_names(name, i)[0]))
        if not any(store.exists(n) for n in names):
            return
        for n in names:
            store.delete(n)
        i += 1


def _clear_output(store: Store, name: str) -> None:
    store.delete(INDEX_NAME)
    store.delete(JOURNAL_NAME)
    _delete_shards_from(store, name, 0)


_FULL_DISK = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


@contextmanager
def _naming_full_disk(url: str) -> Iterator[None]:
    """Turn a write's ``[Errno 28]`` (which names no file) into an error naming ``url``.

    A pack that ran out of space is resumable like any interrupted one: the journal names
    only complete shards and no object appears half-written, so the advice is to rerun.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno not in _FULL_DISK:
            raise
        raise WdstreamError(
            f"{_FULL_DISK[exc.errno]} while writing {url}: free space and rerun the same "
            "command: it resumes from the last complete shard"
        ) from exc


class _NamingFullDisk(ForwardingStore):
    """The output store, with writes that run out of space reported by object name.

    Every write of ``pack`` (shards and sidecars in the writer thread, the journal, the
    index) goes through this, so each names the object it was writing.
    """

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        with _naming_full_disk(self.inner.child_url(name)), self.inner.writer(name) as out:
            yield out

    def write_bytes(self, name: str, data: bytes) -> None:
        with _naming_full_disk(self.inner.child_url(name)):
            self.inner.write_bytes(name, data)


def pack(
    inputs: list[str] | tuple[str, ...] | str,
    output: str,
    *,
    text_key: str = "text",
    tokenizer: str = "cl100k_base",
    backend: str = "auto",
    eos: bool = True,
    bos: bool = False,
    bos_id: int | None = None,
    seq_len: int = 2048,
    mode: str = "concat",
    bestfit_buffer: int = DEFAULT_BUFFER,
    shard_size: str | int = "256MB",
    shard_samples: int | None = None,
    name: str = "data",
    lines: bool = False,
    on_error: str = "raise",
    errors: str = "strict",
    workers: int | None = None,
    pool: str = "auto",
    overwrite: bool = False,
    force_unlock: bool = False,
    progress: bool | None = None,
    batch_bytes: int = 1 << 20,
    store_options: dict[str, Any] | None = None,
    engine: str = "local",
    ray_address: str | None = None,
) -> PackResult:
    """Tokenise text inputs and write a wdstream dataset (shards, sidecars, ``index.json``).

    Args:
        inputs: files, directories, globs, ``{a..b}`` brace patterns, or ``-`` for stdin.
        output: dataset root (local folder or any URL :func:`wdstream.storage.open_store` takes).
        text_key: JSON field with the text, dotted for nested fields.
        tokenizer: encoding name, ``.tiktoken`` path, Hugging Face ``tokenizer.json`` or
            SentencePiece ``.model`` (see :func:`wdstream.tokenizers.load_tokenizer`).
        backend: ``auto``, ``tiktoken`` or ``bpe-openai``.
        eos: append the EOS id to every document.
        bos: prepend a BOS id (``bos_id``, else the tokenizer's own BOS, else its EOS); giving
            ``bos_id`` implies ``bos``.
        seq_len: training row length; concat samples hold ``seq_len + 1`` tokens.
        mode: ``concat`` (fixed-length samples), ``docs`` (one document per sample) or
            ``bestfit`` (rows of whole documents padded to ``seq_len + 1``; needs ``eos``;
            see ``docs/PACK.md``).
        bestfit_buffer: ``bestfit``: documents per best-fit block (memory about one block).
        shard_size: maximum tar size (``"256MB"``, ``"1GiB"``, bytes).
        shard_samples: optional maximum samples per shard.
        name: shard name prefix (``{name}-000000.tar``).
        lines: ``.txt`` inputs hold one document per line.
        on_error: ``raise`` or ``skip`` malformed records (skips are counted in the stats).
        errors: ``strict`` or ``replace`` undecodable UTF-8.
        workers: parallel tokenisers (default: all cores; 0 = in this thread).
        pool: ``auto``, ``threads`` or ``processes``.
        overwrite: replace a complete or interrupted dataset at ``output``.
        force_unlock: take over the output's lock (``.wdstream-pack.lock``) left by a pack
            whose death could not be checked: on an object store, or a local folder locked
            from another host (see :mod:`wdstream.write.lock`).
        progress: show a progress bar (default: when stderr is a terminal).
        batch_bytes: characters of text per tokenisation batch.
        store_options: passed to :func:`~wdstream.storage.open_store`.
        engine: ``local`` (this machine) or ``ray``: tokenise and write shards on a Ray
            cluster's workers (``pip install 'wdstream[ray]'``; inputs and ``output`` must be
            reachable from every node); the output is byte-identical (``docs/RAY.md``).
        ray_address: ``engine="ray"``: ``"auto"`` (the running cluster), ``"ray://host:port"``,
            or None: the Ray instance this process started, else a new local one.

    With ``workers > 0`` and the default pool, tokenisation runs in a forkserver process
    pool, so a script calling ``pack`` needs the usual ``if __name__ == "__main__":`` guard.

    Returns:
        PackResult with the written :class:`~wdstream.format.index.DatasetIndex`.

    Raises:
        InputError: bad input (names file and line or byte offset); no index is written.
        PackLockedError: another pack is writing to ``output`` (names it and since when).
        WdstreamError: output holds a dataset or a different interrupted pack, or its
            filesystem is full (names the object being written).
        TokenizerError: the tokenizer cannot be loaded.
    """
    t0 = time.perf_counter()
    if isinstance(inputs, str):
        inputs = [inputs]
    if mode not in ("concat", "docs", "bestfit"):
        raise ValueError(f"mode must be 'concat', 'docs' or 'bestfit', got {mode!r}")
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    if mode == "bestfit" and not eos:
        raise ValueError(
            "mode 'bestfit' needs eos=True: readers tell documents and padding apart by "
            "the EOS that ends every document"
        )
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    shard_bytes = parse_size(shard_size)
    if shard_samples is not None and shard_samples < 1:
        raise ValueError(f"shard_samples must be >= 1, got {shard_samples}")
    if workers is None:
        workers = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
    if engine == "local":
        prestart(workers, pool)  # the pool's fork server boots while the tokenizer loads
    files = expand_inputs(list(inputs))

    output_store = open_store(output, create=True, **(store_options or {}))
    with _naming_full_disk(output_store.child_url(LOCK_NAME)):
        lock = acquire(output_store, force_unlock)
    session = None
    try:
        if engine == "ray":
            session = _ray_session(ray_address, (tokenizer, backend))  # workers warm up now
        output_store.remove_partials()  # under the lock: leftovers of a killed run only
        store = _NamingFullDisk(output_store)
        # index.json beside a journal: a pack stopped between publishing index.json and
        # removing its journal. The journal resumes it (the same command only, see
        # Journal.load), every shard committed, which writes the same index.json again.
        if store.exists(INDEX_NAME) and not overwrite and not store.exists(JOURNAL_NAME):
            raise WdstreamError(
                f"{store.child_url(INDEX_NAME)} exists: {output} already holds a complete dataset; "
                "pack into a fresh output or pass --overwrite"
            )

        tok = load_tokenizer(tokenizer, backend, _peek_texts(files, text_key, lines))
        eos_id, bos_id = special_ids(tok, eos, bos, bos_id)
        dtype = token_dtype_for_vocab(max(tok.n_vocab, (bos_id or 0) + 1))
        sample_tokens = seq_len + 1 if mode in ("concat", "bestfit") else None
        fingerprint = {
            "inputs": [f.fingerprint() for f in files],
            "text_key": text_key,
            "lines": lines,
            "on_error": on_error,
            "errors": errors,
            "tokenizer": tok.info(),
            "eos_id": eos_id,
            "bos_id": bos_id,
            "mode": mode,
            "seq_len": seq_len,
            "shard_bytes": shard_bytes,
            "shard_samples": shard_samples,
            "name": name,
            "provenance": PROVENANCE_VERSION,
            **({"bestfit_buffer": bestfit_buffer} if mode == "bestfit" else {}),
        }
        journal = Journal(store, fingerprint, name)
        if overwrite:
            _clear_output(store, name)
        start, emitted, bad_locations = _resume_point(journal)
        resumed_shards = len(journal.entries)

        new_builder = partial(sample_builder, mode, seq_len, bestfit_buffer, bos_id, eos_id)
        provenance = ["<stdin>" if f.path == "-" else f.path for f in files]
        show = sys.stderr.isatty() if progress is None else progress
        if engine == "ray":
            from wdstream.ray.engine import RayPackJob, run

            job = RayPackJob(
                files=files, text_key=text_key, lines=lines, on_error=on_error, errors=errors,
                tokenizer=tok, bos_id=bos_id, eos_id=eos_id, dtype=dtype,
                new_builder=new_builder, pad_id=eos_id or 0, name=name, shard_bytes=shard_bytes,
                shard_samples=shard_samples, output=output, store_options=store_options or {},
                provenance=provenance, progress=show,
            )  # fmt: skip
            reader: Any = run(job, journal, start, emitted, bad_locations)
            workers, pool_kind = reader.cpus, "ray"
        else:
            reader = DocumentReader(files, text_key, lines, on_error, errors, start, bad_locations)
            builder = new_builder(DTYPES[dtype], eos_id or 0)
            writer = ShardWriter(
                store,
                name,
                shard_bytes,
                shard_samples,
                first_shard=len(journal.entries),
                first_sample=sum(e.samples for e in journal.entries),
                on_commit=lambda entry, end: journal.commit(entry, end, reader.bad_locations),
                provenance=provenance,
                first_doc=sum(e.documents for e in journal.entries),
                doc_offset=emitted,
            )
            tpool = TokenPool(tok, workers, pool, bos_id, eos_id, dtype)
            pool_kind = tpool.kind
            bar = Progress(show, total=reader.source_total)
            _write_shards(tpool, reader, builder, writer, bar, batch_bytes, start, emitted)

        entries = tuple(journal.entries)
        if not entries:
            raise InputError(f"no non-empty documents in {', '.join(f.path for f in files)}")
        stats = {
            "documents": sum(e.documents for e in entries),
            "empty_documents_skipped": reader.empty,
            "records_skipped": reader.bad,
            "skipped_locations": list(reader.bad_locations),
            "input_bytes": reader.input_bytes,
            "input_files": len(files),
        }
        index = DatasetIndex(
            tokenizer=tok.info(),
            eos_id=eos_id,
            bos_id=bos_id,
            dtype=dtype,
            mode=mode,
            seq_len=seq_len,
            sample_tokens=sample_tokens,
            shards=entries,
            stats=stats,
            checksum=CHECKSUM_NAME,
            pad_id=eos_id if mode == "bestfit" else None,
        )
        lock.verify()  # publish nothing if another pack has taken the output meanwhile
        store.write_bytes(INDEX_NAME, index.to_json().encode())
        store.delete(JOURNAL_NAME)
        # A crashed run may have written shards past what this run produced (only if its
        # output was longer, e.g. after --overwrite with other options): remove them.
        _delete_shards_from(store, name, len(entries))
        return PackResult(index, time.perf_counter() - t0, resumed_shards, workers, pool_kind)
    finally:
        if session is not None:
            session.close()
        lock.release()


def _ray_session(address: str | None, tokenizer: tuple[str, str]) -> Any:
    """Connect to (or start) Ray for a pack (:class:`wdstream.ray.engine.RaySession`)."""
    try:
        from wdstream.ray.engine import RaySession  # Ray: only for this engine
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"engine='ray' needs Ray ({exc.name} is missing): pip install 'wdstream[ray]'"
        ) from exc
    return RaySession(address, tokenizer)


def sample_builder(
    mode: str,
    seq_len: int,
    bestfit_buffer: int,
    bos_id: int | None,
    eos_id: int | None,
    dtype: np.dtype,
    pad: int,
) -> ConcatSampleBuilder | DocsSampleBuilder | BestFitSampleBuilder:
    """The sample builder of ``mode``: every engine builds samples with it (the Ray engine
    and sink over token indices in ``int64``, with -1 for padding)."""
    if mode == "concat":
        return ConcatSampleBuilder(seq_len + 1, dtype)
    if mode == "bestfit":
        # No row may end in a lone BOS that reads as padding (wdstream.read.rows).
        head = 2 if bos_id is not None and bos_id == eos_id else 1
        return BestFitSampleBuilder(seq_len + 1, dtype, bestfit_buffer, pad, head)
    return DocsSampleBuilder(dtype)


def special_ids(
    tok: Tokenizer, eos: bool, bos: bool, bos_id: int | None
) -> tuple[int | None, int | None]:
    """``(eos_id, bos_id)`` added to every document (None: not added); giving ``bos_id``
    implies ``bos``, whose default is the tokenizer's own BOS, else its EOS.

    Raises:
        ValueError: an id is asked for and the tokenizer has none.
    """
    eos_id = tok.eos_id if eos else None
    if eos and eos_id is None:
        raise ValueError(f"tokenizer {tok.name!r} has no EOS token; pass eos=False")
    if not (bos or bos_id is not None):
        return eos_id, None
    if bos_id is None:
        bos_id = tok.bos_id if tok.bos_id is not None else tok.eos_id
    if bos_id is None:
        raise ValueError(f"tokenizer {tok.name!r} has no BOS or EOS token; give bos_id")
    return eos_id, bos_id


def _resume_point(journal: Journal) -> tuple[InputPosition | None, int, list[str]]:
    """Load the journal; ``(record to restart from, its tokens already packed, skipped
    locations before it)``, or ``(None, 0, [])`` for a fresh pack."""
    if not journal.load():
        return None, 0, []
    assert journal.position is not None
    return (
        InputPosition(*journal.position["position"]),
        journal.position["emitted"],
        list(journal.position["bad_locations"]),
    )


def _write_shards(
    tpool: TokenPool,
    reader: DocumentReader,
    builder: ConcatSampleBuilder | DocsSampleBuilder | BestFitSampleBuilder,
    writer: ShardWriter,
    bar: Progress,
    batch_bytes: int,
    start: InputPosition | None,
    emitted: int,
) -> None:
    """Run the pipeline: read, tokenise, pack into samples, write shards; wait for the last.

    On resume (``start`` given) the first document's ``emitted`` tokens, already in committed
    shards, are dropped. On any error the shards already queued still finish and commit, the
    partial one is dropped.
    """
    try:
        first = True
        for positions, flat, lens in tpool.map(_batches(reader, batch_bytes)):
            if first and start is not None:
                flat, lens, positions = _drop_packed(flat, lens, positions, start, emitted, builder)
            first = False
            for s in builder.add(flat, lens, positions):
                writer.add(s.tokens, s.doc_lens, s.cont, s.new_docs, s.end, s.starts, s.offset)
            bar.update(reader.source_bytes, len(lens), len(flat))
        if first and start is not None:
            raise WdstreamError("the input changed since the interrupted pack; use --overwrite")
        for s in builder.flush():
            writer.add(s.tokens, s.doc_lens, s.cont, s.new_docs, s.end, s.starts, s.offset)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        tpool.close()
        bar.close()


def _drop_packed(
    flat: np.ndarray,
    lens: np.ndarray,
    positions: list[InputPosition],
    start: InputPosition,
    emitted: int,
    builder: ConcatSampleBuilder | DocsSampleBuilder | BestFitSampleBuilder,
) -> tuple[np.ndarray, np.ndarray, list[InputPosition]]:
    """On resume, remove the first document's tokens that are already in committed shards
    (best-fit: the recorded position starts a block, ``emitted`` of whose rows are committed)."""
    if not positions or positions[0][:3] != start[:3]:
        raise WdstreamError(
            "the input changed since the interrupted pack (no document at the recorded "
            f"position {tuple(start[:3])}); use --overwrite"
        )
    if isinstance(builder, BestFitSampleBuilder):
        builder.resume_rows(emitted)
        return flat, lens, positions
    first_len = int(lens[0])
    if emitted > first_len:
        raise WdstreamError("the input changed since the interrupted pack; use --overwrite")
    if emitted == first_len:
        return flat[first_len:], lens[1:], positions[1:]
    builder.resume_inside_document(emitted)
    lens = lens.copy()
    lens[0] -= emitted
    return flat[emitted:], lens, positions


def describe(result: PackResult) -> str:
    """One-line summary of a pack."""
    idx = result.index
    total_bytes = sum(s.bytes for s in idx.shards)
    skipped = idx.stats.get("records_skipped", 0)
    resumed = result.resumed_shards
    return (
        f"packed {count(idx.total_documents, 'document')}, {count(idx.total_tokens, 'token')} "
        f"into {count(len(idx.shards), 'shard')} ({total_bytes / 1e6:,.1f} MB) in "
        f"{result.seconds:.1f}s: {result.input_mb_per_s:.1f} MB/s input, "
        f"{idx.total_tokens / max(result.seconds, 1e-9):,.0f} tokens/s "
        f"[{idx.tokenizer['name']}/{idx.tokenizer['backend']}, "
        f"{count(result.workers, 'worker')}, {result.pool}]"
        + (f"; {count(skipped, 'bad record')} skipped" if skipped else "")
        + (f"; resumed after {count(resumed, 'shard')}" if resumed else "")
    )
