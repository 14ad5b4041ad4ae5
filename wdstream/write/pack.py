"""``pack``: input files (or records from Python, :mod:`wdstream.write.writer`) in, tar
shards of tokens plus ``index.json`` out -- resumable.

One orchestration for every engine (:mod:`wdstream.write.engine`)::

    validate -> lock the output -> engine starts -> tokenizer -> journal (ResumePoint)
        -> engine.run: inputs -> tokens -> sample builder -> shards, each committed
        -> commit_datasets: index.json, journal removed (and a held-out dataset's, at
           OUTPUT/holdout/, with ``holdout``: wdstream.write.holdout)

Resume: after every shard commit the journal ``.wdstream-pack.json`` records the command's
fingerprint, the committed shards and the input position after the shard's last sample
(:class:`~wdstream.inputs.InputPosition` of the document holding its last token, plus how
many of that document's tokens were packed). A rerun of the same command skips straight to
that record, re-tokenises only that one document, drops its packed tokens
(:mod:`wdstream.write.resume`), and continues; the shards it writes are byte-identical to an
uninterrupted run's because packing depends only on the token stream, never on batch or
worker boundaries. A write that fails (a full disk included: the error names the object) is
an interruption like any other.

One pack per output: the whole run holds the output's writer lock ``.wdstream-pack.lock``
(:mod:`wdstream.write.lock`), taken before anything there is read or removed.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from functools import partial
from typing import Any

from wdstream.errors import InputError, WdstreamError
from wdstream.format.index import INDEX_NAME
from wdstream.format.provenance import PROVENANCE_VERSION
from wdstream.format.sample import token_dtype_for_vocab
from wdstream.inputs.lines import DEFAULT_MAX_RECORD_BYTES, check_limit
from wdstream.storage import open_store
from wdstream.tokenizers import load_tokenizer
from wdstream.write.bestfit import DEFAULT_BUFFER
from wdstream.write.builders import MODES, check_mode, sample_builder, special_ids
from wdstream.write.commit import Dataset, DatasetMeta, commit_datasets
from wdstream.write.documents import PackDocuments, interrupted_chat_now, mask_stats
from wdstream.write.engine import PackEngine, PackJob
from wdstream.write.full_disk import NamingFullDisk, naming_full_disk
from wdstream.write.holdout import (
    check_fraction,
    held_out_datasets,
    holdout_target,
    open_holdout,
    remove_leftovers,
)
from wdstream.write.journal import JOURNAL_NAME, Journal
from wdstream.write.local import LocalEngine
from wdstream.write.lock import LOCK_NAME, acquire
from wdstream.write.output import clear_output, delete_shards_from
from wdstream.write.pack_result import (
    PackResult,
    describe,
    left_out,
    one_shard_warning,
    refuse_lost_turns,
)
from wdstream.write.progress import wanted
from wdstream.write.resume import resume_point
from wdstream.write.shards import parse_size
from wdstream.write.sizing import choose_shard_bytes
from wdstream.write.sources import PackInputs
from wdstream.write.tokenpool import prestart

__all__ = ["JOURNAL_NAME", "PackResult", "describe", "one_shard_warning", "pack"]


def _pack_cwd(inputs: list[str]) -> dict[str, str]:
    """``{"pack_cwd": ...}``, the working directory the relative ``inputs`` (and a relative
    tokenizer path) are relative to, so ``explain`` and ``inspect`` find them from anywhere;
    empty when every one is absolute (or not a path: ``<stdin>``, records, a tiktoken
    encoding's name), so such a pack's index does not depend on where it ran."""
    relative = any(not (n.startswith("<") or "://" in n or os.path.isabs(n)) for n in inputs)
    return {"pack_cwd": os.getcwd()} if relative else {}


def pack(
    inputs: list[str] | tuple[str, ...] | str | PackInputs,
    output: str,
    *,
    text_key: str = "text",
    tokenizer: str = "cl100k_base",
    backend: str = "auto",
    eos: bool = True,
    bos: bool = False,
    bos_id: int | None = None,
    seq_len: int = 2048,
    mode: str | None = None,
    bestfit_buffer: int = DEFAULT_BUFFER,
    shard_size: str | int | None = None,
    shard_samples: int | None = None,
    name: str = "data",
    lines: bool = False,
    on_error: str = "raise",
    errors: str = "strict",
    max_record_bytes: int | str = DEFAULT_MAX_RECORD_BYTES,
    workers: int | None = None,
    pool: str = "auto",
    overwrite: bool = False,
    force_unlock: bool = False,
    progress: bool | None = None,
    batch_bytes: int = 1 << 20,
    store_options: dict[str, Any] | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    pretokenized: bool = False,
    ids_key: str = "input_ids",
    mask_key: str | None = None,
    long_docs: str | None = None,
    allow_unsupervised: bool = False,
    chat: bool = False,
    messages_key: str = "messages",
    chat_template: str | None = None,
    train_on: str = "assistant",
    chat_now: datetime | str | None = None,
    special_tokens_in_content: str = "text",
    chat_template_kwargs: dict[str, Any] | None = None,
    allow_unlocated: bool = False,
    holdout: float | None = None,
) -> PackResult:
    """Tokenise text inputs and write a wdstream dataset (shards, sidecars, ``index.json``).

    Args:
        inputs: files (JSON Lines, text, Parquet, Arrow IPC), directories, globs, ``{a..b}``
            brace patterns, or ``-`` for stdin; records from Python go to
            :func:`wdstream.pack_records` or :class:`wdstream.Writer` (a ``PackInputs``).
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
            see ``docs/PACK.md``). Default ``concat``, ``bestfit`` with ``chat``.
        bestfit_buffer: ``bestfit``: documents per best-fit block (memory about one block).
        shard_size: maximum tar size (``"256MB"``, ``"1GiB"``, bytes); default: chosen
            from the input files' size, 1 MB to 256 MB, for about 64 shards (256 MB for
            stdin and records; :mod:`wdstream.write.sizing`, ``docs/PACK.md``).
        shard_samples: optional maximum samples per shard.
        name: shard name prefix (``{name}-000000.tar``).
        lines: ``.txt`` inputs hold one document per line.
        on_error: ``raise`` or ``skip`` malformed records (skips are counted in the stats).
        errors: ``strict`` or ``replace`` undecodable UTF-8.
        max_record_bytes: the longest record (a line with its line end, or a whole ``.txt``
            document; bytes or a size such as ``"256MiB"``). A longer one is a bad record
            (``on_error``), read past in chunks and never held, so a decompression bomb or
            a line that never ends cannot exhaust memory.
        workers: parallel tokenisers (default: all cores; 0 = in this thread).
        pool: ``auto``, ``threads`` or ``processes``.
        overwrite: replace a complete or interrupted dataset at ``output``.
        force_unlock: take over the output's lock (``.wdstream-pack.lock``) left by a pack
            whose death could not be checked: on an object store, or a local folder locked
            from another host (see :mod:`wdstream.write.lock`).
        progress: report progress: a bar on a terminal, else a line every
            ``WDSTREAM_PROGRESS_SECONDS`` (10) seconds (default: when stderr is a terminal
            or ``WDSTREAM_PROGRESS=1``).
        batch_bytes: characters of text per tokenisation batch.
        store_options: passed to :func:`~wdstream.storage.open_store`.
        engine: ``local`` (this machine) or ``ray``: tokenise and write shards on a Ray
            cluster's workers (``pip install 'wdstream[ray]'``; inputs and ``output`` must be
            reachable from every node); the output is byte-identical (``docs/RAY.md``).
        ray_address: ``engine="ray"``: ``"auto"`` (the running cluster), ``"ray://host:port"``,
            or None: the Ray instance this process started, else a new local one.
        pretokenized: inputs are JSON Lines records of token ids in ``tokenizer``'s
            vocabulary (``{"input_ids": [...]}``), not text (``docs/PACK.md``).
        ids_key: ``pretokenized``: the field holding the ids.
        mask_key: ``pretokenized``: the field holding each record's loss mask (0/1 or
            bools, one per id); given, the dataset stores it (``"loss_mask": "bit31"``,
            uint32 ids, ``docs/CHAT.md``) and every record needs one.
        long_docs: ``mode="bestfit"``: a document longer than a row is ``split`` across
            rows, ``drop``-ped or ``truncate``-d (counted in the stats); default ``drop``
            for masked packs, ``split`` otherwise.
        allow_unsupervised: masked packs: keep a document whose mask is all 0 (by default
            it is a bad record, per ``on_error``).
        chat: inputs are JSON Lines conversations (messages, ShareGPT or prompt/completion)
            rendered through a chat template, stored with a loss mask (``docs/CHAT.md``);
            ``mode`` ``bestfit`` (default) or ``docs``, never ``concat``.
        messages_key: ``chat``: the key of the messages form.
        chat_template: ``chat``: a Jinja template file or a JSON file holding
            ``chat_template``; default: the tokenizer folder's.
        train_on: ``chat``: ``assistant`` (every assistant turn), ``last`` (the last one)
            or ``all`` (every token).
        chat_now: ``chat``: the time a template's ``strftime_now`` formats (a datetime or
            ISO 8601 text); default: the clock when the pack starts, or the interrupted
            pack's when it resumes. Recorded only for templates that call it.
        special_tokens_in_content: ``chat``: ``text`` (default): special-token text a message
            spells out is tokenised as text, only the template's markup as special tokens;
            ``parse``: as the special tokens, as ``transformers`` does. Conversations that
            spell one out are counted either way (``docs/CHAT.md``).
        chat_template_kwargs: ``chat``: template variables every render gets, as
            ``transformers``' ``apply_chat_template(**kwargs)`` (``{"enable_thinking":
            False}``); a JSON object, recorded in ``stats.chat.template_kwargs`` and part of
            the resume fingerprint.
        allow_unlocated: ``chat``: write the dataset even if some assistant turn got no loss
            (its text not found in the rendered conversation; ``stats.chat.assistant_turns``
            counts them). By default such a pack fails before ``index.json`` with the count
            and the first ``file:line``; the same pack run again with it resumes and commits.
        holdout: a fraction in (0, 1): hold out that share of the documents, chosen by a
            hash of each document's stored ids (duplicates on the same side, the same choice
            on every re-pack), into a second dataset at ``OUTPUT/holdout/`` with its own
            ``index.json``; local engine only (:mod:`wdstream.write.holdout`,
            ``docs/PACK.md``).

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
    if mode is None:
        mode = "bestfit" if chat else "concat"
    if mode not in MODES:  # a bad mode is reported before a bad engine
        check_mode(mode, seq_len, eos)
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    fraction = check_fraction(holdout)
    if fraction is not None and engine != "local":
        raise ValueError("holdout needs engine='local' (the Ray engine writes one dataset)")
    check_mode(mode, seq_len, eos)
    documents = PackDocuments(pretokenized, ids_key, mask_key, long_docs, allow_unsupervised,
                              chat, messages_key, chat_template, train_on,
                              special_tokens_in_content, chat_template_kwargs,
                              allow_unlocated)  # fmt: skip
    documents.check(mode, engine)
    if not isinstance(output, (str, os.PathLike)) or not os.fspath(output):
        raise TypeError(  # as the Python writer's check (write/writer.py checked_options)
            "output must be a dataset root: a local path or a URL, as a non-empty str or "
            f"os.PathLike, got {output!r:.80}"
        )
    output = os.fspath(output)
    sources = inputs if isinstance(inputs, PackInputs) else PackInputs.from_paths(inputs)
    sources.check(engine)
    shard_bytes = choose_shard_bytes(shard_size, sources.input_bytes)
    record_limit = check_limit(parse_size(max_record_bytes))
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
    output_store = open_store(output, create=True, **(store_options or {}))
    with naming_full_disk(output_store.child_url(LOCK_NAME)):
        lock = acquire(output_store, force_unlock)
    runner: PackEngine | None = None
    try:
        # Started now, under the lock: Ray's workers warm up while the tokenizer loads here.
        runner = _open_engine(engine, workers, pool, ray_address, (tokenizer, backend))
        output_store.remove_partials()  # under the lock: leftovers of a killed run only
        store = NamingFullDisk(output_store)
        # index.json beside a journal: a pack stopped between publishing index.json and
        # removing its journal. The journal resumes it (the same command only, see
        # Journal.load), every shard committed, which writes the same index.json again.
        if store.exists(INDEX_NAME) and not overwrite and not store.exists(JOURNAL_NAME):
            remove_leftovers(output_store, store_options)  # of a pack stopped in its commit
            raise WdstreamError(
                f"{store.child_url(INDEX_NAME)} exists: {output} already holds a complete dataset; "
                "pack into a fresh output or pass --overwrite (overwrite=True in Python)"
            )
        held_store = open_holdout(output_store, store_options, fraction, overwrite, NamingFullDisk)

        peek = [] if pretokenized or chat else sources.peek(text_key, lines, record_limit)
        tok = load_tokenizer(tokenizer, backend, peek)
        eos_id, bos_id = special_ids(tok, eos, bos, bos_id)
        names = sources.names
        if chat and chat_now is None and not overwrite:
            chat_now = interrupted_chat_now(store)
        parts = documents.resolve(
            tok, (bos_id, eos_id, token_dtype_for_vocab(max(tok.n_vocab, (bos_id or 0) + 1))),
            (mode, seq_len), on_error, names, chat_now,
        )  # fmt: skip
        dtype = parts.dtype
        fingerprint = {
            "inputs": sources.fingerprint(),
            "text_key": text_key,
            "lines": lines,
            "on_error": on_error,
            "errors": errors,
            # The limit decides what is packed only when long records are skipped; under
            # "raise" a pack with another limit either writes the same shards or stops.
            **({"max_record_bytes": record_limit} if on_error == "skip" else {}),
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
            **documents.fingerprint(),
            **({"chat": parts.chat.fingerprint()} if parts.chat is not None else {}),
            **({"holdout": fraction} if fraction is not None else {}),
        }
        journal = Journal(store, fingerprint, name, [f.ctime_ns for f in sources.files])
        if overwrite:
            clear_output(store, name)
            if held_store is not None:
                clear_output(held_store, name)  # a holdout of the dataset being replaced
        resume = resume_point(journal)
        resumed_shards = len(journal.entries)
        target = None
        if fraction is not None:
            assert held_store is not None
            target = holdout_target(
                held_store, fingerprint, name, fraction, shard_size, sources.input_bytes
            )

        job = PackJob(
            files=sources.files, records=sources.records, text_key=text_key, lines=lines,
            on_error=on_error, errors=errors,
            tokenizer=tok, bos_id=bos_id, eos_id=eos_id, dtype=dtype,
            new_builder=partial(sample_builder, mode, seq_len, bestfit_buffer, bos_id, eos_id),
            pad_id=parts.pad_id, name=name, shard_bytes=shard_bytes, shard_samples=shard_samples,
            output=output, store_options=store_options or {}, provenance=names,
            progress=wanted(progress), batch_bytes=batch_bytes, max_record_bytes=record_limit,
            document=parts.document, encoder=parts.encoder, new_rules=parts.rules,
        )  # fmt: skip
        if target is None:
            totals = runner.run(job, store, journal, resume)
        else:
            assert isinstance(runner, LocalEngine)  # checked above: holdout is local only
            totals = runner.run(job, store, journal, resume, holdout=target)
        if not allow_unlocated:
            refuse_lost_turns(totals.rule_counts)

        entries = journal.entries
        if not entries and target is not None and target.journal.entries:
            raise InputError(f"every document of {sources.describe()} was held out "
                             f"(--holdout {fraction}): pass a smaller fraction with --overwrite "
                             "(overwrite=True in Python)")  # fmt: skip
        if not entries:
            raise InputError(f"no non-empty documents in {sources.describe()}"
                             + left_out(totals.rule_counts, seq_len))  # fmt: skip
        stats = {
            "documents": sum(e.documents for e in entries),
            "empty_documents_skipped": totals.empty,
            "records_skipped": totals.bad,
            "skipped_locations": list(totals.bad_locations),
            "input_bytes": totals.input_bytes,
            "input_files": len(sources.files),
            "shard_bytes": shard_bytes,  # given, or chosen from the input (write/sizing.py)
            **_pack_cwd([*sources.names, *([tokenizer] if os.path.exists(tokenizer) else [])]),
            **mask_stats(totals.rule_counts, entries, parts),
        }
        meta = DatasetMeta(tok.info(), eos_id, bos_id, dtype, mode, seq_len, parts.loss_mask)
        datasets: list[Dataset] = [(store, journal, meta, stats)]
        if target is not None:
            assert isinstance(runner, LocalEngine)
            datasets = held_out_datasets(
                datasets[0], target, totals.rule_counts, runner.held_supervised, parts,
                sources.describe(),
            )  # fmt: skip
        indexes = commit_datasets(lock, datasets)
        # A crashed run may have written shards past what this run produced (only if its
        # output was longer, e.g. after --overwrite with other options): remove them.
        for dataset_store, dataset_journal, *_ in datasets:
            delete_shards_from(dataset_store, name, len(dataset_journal.entries))
        seconds = time.perf_counter() - t0
        return PackResult(
            indexes[0], seconds, resumed_shards, totals.workers, totals.pool,
            indexes[1] if target is not None else None,
        )  # fmt: skip
    finally:
        if runner is not None:
            runner.close()
        lock.release()


def _open_engine(
    engine: str, workers: int, pool: str, address: str | None, tokenizer: tuple[str, str]
) -> PackEngine:
    """Start the engine named ``engine``; the Ray one is imported only when asked for."""
    if engine == "local":
        return LocalEngine(workers, pool)
    try:
        from wdstream.ray.engine import RayEngine  # Ray: only for this engine
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"engine='ray' needs Ray ({exc.name} is missing): pip install 'wdstream[ray]'"
        ) from exc
    return RayEngine(address, tokenizer)
