"""Look at a packed dataset: preview samples, count things, verify every byte.

Library side of ``wdstream inspect | stats | verify`` (the CLI only prints what these
return). All reads go through a :class:`~wdstream.storage.Store`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wdstream.errors import CorruptShardError
from wdstream.format.index import INDEX_NAME, DatasetIndex
from wdstream.format.sample import Sample
from wdstream.read.shards import (
    decode_span,
    iter_samples,
    read_index,
    read_samples,
    read_sidecar,
    sidecar_from_tar,
    store_sha256,
)
from wdstream.storage import Store, open_store, split_url

__all__ = ["SamplePreview", "dataset_stats", "preview_samples", "verify_dataset"]


@dataclass(frozen=True)
class SamplePreview:
    """One sample as ``inspect`` shows it."""

    key: str  # "shard-name#k"
    tokens: int
    doc_lens: tuple[int, ...]
    cont: bool
    sample: Sample


def _open_target(
    target: str, store_options: dict[str, Any]
) -> tuple[Store, DatasetIndex | None, str | None]:
    """A dataset root, or a single shard (``.tar``) given by path or URL."""
    if target.endswith(".tar"):
        root, name = split_url(target)
        return open_store(root, **store_options), None, name
    store = open_store(target, **store_options)
    return store, read_index(store), None


def preview_samples(
    target: str, count: int = 3, store_options: dict[str, Any] | None = None
) -> tuple[DatasetIndex | None, list[SamplePreview]]:
    """The first ``count`` samples of a dataset root or of one shard.

    A shard with a sidecar next to it is read through the sidecar; one without is scanned
    with :func:`~wdstream.format.sidecar.scan_tar`.

    Raises:
        CorruptShardError: if a sample does not decode.
        FileNotFoundError: if there is no index.json / shard.
    """
    store, index, shard = _open_target(target, store_options or {})
    out: list[SamplePreview] = []
    if index is not None:
        it: Iterator[tuple[str, int, Sample]] = (
            (s.name, k, smp) for s, k, smp in iter_samples(store, index, chunk=count)
        )
    else:
        assert shard is not None
        idx_name = shard[: -len(".tar")] + ".idx"
        if store.exists(idx_name):
            from wdstream.format.sidecar import ShardSidecar

            try:
                sidecar = ShardSidecar.from_bytes(store.read(idx_name))
            except ValueError as exc:
                raise CorruptShardError(f"{store.child_url(idx_name)}: {exc}") from exc
        else:
            sidecar = sidecar_from_tar(store.read(shard), store.child_url(shard))
        n = min(count, len(sidecar))
        it = ((shard, k, smp) for k, smp in enumerate(read_samples(store, shard, sidecar, 0, n)))
    for name, k, smp in it:
        out.append(SamplePreview(f"{name}#{k}", len(smp.tokens), smp.doc_lens, smp.cont, smp))
        if len(out) >= count:
            break
    return index, out


def dataset_stats(root: str | Store) -> dict[str, Any]:
    """Counts from the index plus a log2 histogram of document lengths (reads every sample).

    Returns:
        dict with shards, samples, documents, tokens, bytes, and ``doc_len_histogram``:
        ``{"2^k..2^(k+1)-1": count}`` by token length (EOS included).
    """
    store = root if isinstance(root, Store) else open_store(root)
    index = read_index(store)
    hist: dict[int, int] = {}
    current = 0
    lengths: list[int] = []
    for _, _, smp in iter_samples(store, index):
        for j, n in enumerate(smp.doc_lens):
            if j == 0 and smp.cont:
                current += n
                continue
            if current:
                lengths.append(current)
            current = n
    if current:
        lengths.append(current)
    if lengths:
        buckets = np.floor(np.log2(np.asarray(lengths, dtype=np.float64))).astype(int)
        for b, c in zip(*np.unique(buckets, return_counts=True), strict=True):
            hist[int(b)] = int(c)
    return {
        "shards": len(index.shards),
        "samples": index.total_samples,
        "documents": index.total_documents,
        "tokens": index.total_tokens,
        "bytes": sum(s.bytes for s in index.shards),
        "mode": index.mode,
        "seq_len": index.seq_len,
        "tokenizer": index.tokenizer,
        "doc_len_histogram": {f"{2**b}..{2 ** (b + 1) - 1}": hist[b] for b in sorted(hist)},
        "doc_len_mean": float(np.mean(lengths)) if lengths else math.nan,
        "input_stats": index.stats,
    }


@dataclass
class VerifyReport:
    """Outcome of :func:`verify_dataset`."""

    ok: bool
    shards: int = 0
    samples: int = 0
    tokens: int = 0
    documents: int = 0
    problems: list[str] = field(default_factory=list)


def verify_dataset(root: str | Store) -> VerifyReport:
    """Check every shard's and sidecar's sha256, that every sample decodes, and the counts.

    Stops at the first bad shard; ``problems[0]`` names it (and the sample and byte offset
    when a sample is at fault).
    """
    store = root if isinstance(root, Store) else open_store(root)
    report = VerifyReport(ok=True)
    try:
        index = read_index(store)
    except (FileNotFoundError, ValueError) as exc:
        return VerifyReport(ok=False, problems=[f"{store.child_url(INDEX_NAME)}: {exc}"])
    for shard in index.shards:
        where = store.child_url(shard.name)
        try:
            problem = _verify_shard(store, index, shard, report)
        except FileNotFoundError as exc:
            problem = f"{where}: missing ({exc})"
        except CorruptShardError as exc:
            problem = str(exc)
        if problem:
            report.ok = False
            report.problems.append(problem)
            return report
        report.shards += 1
    return report


def _verify_shard(
    store: Store, index: DatasetIndex, shard: Any, report: VerifyReport
) -> str | None:
    where = store.child_url(shard.name)
    size = store.size(shard.name)
    if size != shard.bytes:
        return f"{where}: {size} bytes, index.json says {shard.bytes}"
    if store_sha256(store, shard.sidecar) != shard.sidecar_sha256:
        return f"{store.child_url(shard.sidecar)}: sha256 differs from index.json"
    sidecar = read_sidecar(store, shard)
    # One read of the shard serves both the sample checks and the hash.
    data = memoryview(store.read(shard.name))
    tokens = docs = 0
    for k, smp in enumerate(decode_span(data, 0, sidecar, 0, len(sidecar), where)):
        if index.dtype and smp.tokens.dtype.name != index.dtype:
            return f"{where}: sample {k} at byte {int(sidecar.offsets[k])}: dtype {smp.tokens.dtype.name}, index says {index.dtype}"
        tokens += len(smp.tokens)
        docs += len(smp.doc_lens) - (1 if smp.cont else 0)
    if hashlib.sha256(data).hexdigest() != shard.sha256:
        return f"{where}: sha256 differs from index.json"
    if tokens != shard.tokens or docs != shard.documents:
        return f"{where}: holds {tokens} tokens / {docs} documents, index.json says {shard.tokens} / {shard.documents}"
    report.samples += len(sidecar)
    report.tokens += tokens
    report.documents += docs
    return None
