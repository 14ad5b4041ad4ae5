"""Look at a packed dataset: preview samples, count things, verify every byte.

Library side of ``wdstream inspect | stats | verify`` (the CLI only prints what these
return). All reads go through a :class:`~wdstream.storage.Store`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wdstream.errors import CorruptShardError, IncompleteDatasetError, IndexValidationError
from wdstream.format.checksum import running_checksum
from wdstream.format.index import DatasetIndex, ShardEntry
from wdstream.format.loss import NO_LOSS_BIT, split_ids
from wdstream.format.provenance import ShardProvenance
from wdstream.format.sample import SAMPLE_SUFFIXES, Sample
from wdstream.format.sidecar import ShardSidecar
from wdstream.format.tar import BLOCK, END_OF_ARCHIVE
from wdstream.inspect_stats import dataset_stats
from wdstream.read.sources.index_open import listed_problem
from wdstream.read.sources.shards import (
    decode_span,
    iter_samples,
    read_index,
    read_samples,
    read_sidecar,
    sidecar_from_tar,
    store_sha256,
)
from wdstream.read.sources.shards import documents as _stored_documents
from wdstream.storage import Store, open_store
from wdstream.storage.urls import is_shard_url, split_url
from wdstream.write.shards import doc_tokens_after

__all__ = [
    "SamplePreview",
    "dataset_stats",
    "documents",
    "preview_decoder",
    "preview_samples",
    "verify_dataset",
]


@dataclass(frozen=True)
class SamplePreview:
    """One sample as ``inspect`` shows it."""

    key: str  # "shard-name#k"
    tokens: int
    doc_lens: tuple[int, ...]
    cont: bool
    sample: Sample  # as stored (a masked dataset's ids carry bit 31)
    ids: np.ndarray  # the token ids, without the loss bit
    supervised: np.ndarray | None  # masked datasets: True where the token carries loss


def _ids(index: DatasetIndex | None, smp: Sample) -> tuple[np.ndarray, np.ndarray | None]:
    """A sample's ids without the loss bit, and its supervised mask (None: no mask).

    A single shard read without its index may carry the bit too: uint32 ids at or above
    2**31 are no vocabulary's, so they are read as the bit."""
    if (index is not None and index.loss_mask is None) or smp.tokens.dtype.itemsize < 4:
        return smp.tokens, None
    ids, no_loss = split_ids(smp.tokens)
    if index is None and not no_loss.any():
        return smp.tokens, None
    return ids, ~no_loss


def documents(root: str | Store, with_mask: bool = False) -> Iterator[Any]:
    """Every document's token ids in dataset order, as :func:`wdstream.read.sources.shards.
    documents` gives them but never with the loss bit: a masked dataset's ids are split
    (:func:`~wdstream.format.loss.split_ids`).

    Args:
        root: the dataset root or its store.
        with_mask: yield ``(ids, supervised)`` pairs (``supervised`` all True in a dataset
            without a loss mask) instead of ids.

    Raises:
        CorruptShardError: as :func:`wdstream.read.sources.shards.documents`.
    """
    for doc in _stored_documents(root):
        ids, no_loss = split_ids(doc)
        if not no_loss.any():
            ids = doc
        yield (ids, ~no_loss) if with_mask else ids


def _open_target(
    target: str, store_options: dict[str, Any]
) -> tuple[Store, DatasetIndex | None, str | None]:
    """A dataset root, or a single shard (``.tar``) given by path or URL."""
    if is_shard_url(target):
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
        ids, supervised = _ids(index, smp)
        out.append(
            SamplePreview(
                f"{name}#{k}", len(smp.tokens), smp.doc_lens, smp.cont, smp, ids, supervised
            )
        )
        if len(out) >= count:
            break
    return index, out


def preview_decoder(index: DatasetIndex | None, tokenizer: str | None) -> Callable[[Any], str]:
    """What turns a preview's ids into text: a dataset's own tokenizer (found from its
    ``stats.pack_cwd``, or ``tokenizer`` when given; refused unless its sha256 is the
    recorded one, :func:`~wdstream.tokenizers.load.index_tokenizer`); for a shard without
    an index, ``tokenizer`` (default ``cl100k_base``) as it is.

    Raises:
        TokenizerError: the tokenizer cannot be loaded, or is not the dataset's.
    """
    from wdstream.tokenizers import index_tokenizer, load_tokenizer

    if index is None:
        return load_tokenizer(tokenizer or "cl100k_base", "tiktoken").decode
    return index_tokenizer(index.tokenizer, index.stats.get("pack_cwd"), tokenizer).decode


@dataclass
class VerifyReport:
    """Outcome of :func:`verify_dataset`."""

    ok: bool
    shards: int = 0
    samples: int = 0
    tokens: int = 0
    documents: int = 0
    supervised: int = 0  # tokens without the loss bit (datasets with a loss mask)
    problems: list[str] = field(default_factory=list)
    # Tokens of the last document so far (for the provenance check of the next shard).
    _doc_tokens: int = field(default=0, repr=False, compare=False)


def verify_dataset(root: str | Store) -> VerifyReport:
    """Check every byte of a dataset against its ``index.json``.

    The index itself is validated when it is opened (:meth:`DatasetIndex.from_json`). Then,
    for every shard in order: its size and its sidecar's sha256; that its tar members are
    exactly the samples the sidecar lists, back to back, each named with its dataset-wide
    sample number (``000000000012.mp``, ``.msgpack`` in v1); that every sample decodes
    (checksum included) and fits the index (dtype, ids below the vocabulary, concat:
    ``sample_tokens`` tokens but in the dataset's last sample, docs: one whole document);
    the shard's sha256; its token and document counts; its provenance table, when the
    dataset has them (sha256, counts, and every sample's first document and offset against
    the documents rebuilt from the samples). A dataset with a loss mask: ids are checked
    without the bit, best-fit padding must carry it, and the supervised tokens must add up
    to ``stats.supervised_tokens``.

    Member names are part of the format, so a shard whose members are named otherwise
    fails even though readers (which go by the sidecars) read it: the names are the only
    record inside the shards of where each sample belongs (a shard moved to another
    position with its index entry is caught by nothing else), and they are the keys
    webdataset users get. Shards written by other tools are not wdstream datasets.

    Stops at the first problem; ``problems[0]`` names the index or the shard (and the
    sample and byte offset when a sample is at fault).
    """
    store = root if isinstance(root, Store) else open_store(root)
    report = VerifyReport(ok=True)
    try:
        index = read_index(store)
    except (IncompleteDatasetError, IndexValidationError) as exc:  # each names index.json
        return VerifyReport(ok=False, problems=[str(exc)])
    listed = listed_problem(store, index)
    if listed is not None:
        return VerifyReport(ok=False, problems=[listed])
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
    said = index.stats.get("supervised_tokens")
    if index.loss_mask is not None and said is not None and said != report.supervised:
        report.ok = False
        report.problems.append(
            f"{store.child_url('index.json')}: stats.supervised_tokens = {said}, the shards "
            f"hold {report.supervised} tokens without the no-loss bit"
        )
    return report


def _verify_shard(
    store: Store, index: DatasetIndex, shard: ShardEntry, report: VerifyReport
) -> str | None:
    """First problem of one shard, or None after adding its counts to ``report``."""
    where = store.child_url(shard.name)
    size = store.size(shard.name)
    if size != shard.bytes:
        return f"{where}: {size} bytes, index.json says {shard.bytes}"
    if store_sha256(store, shard.sidecar) != shard.sidecar_sha256:
        return f"{store.child_url(shard.sidecar)}: sha256 differs from index.json"
    sidecar = read_sidecar(store, shard, index.version)
    prov = _provenance(store, shard, report.documents)
    if isinstance(prov, str):
        return prov
    # One read of the shard serves the sample, hash and member checks.
    data = memoryview(store.read(shard.name))
    first = report.samples  # the dataset-wide number of this shard's first sample
    tokens = docs = 0
    last = index.total_samples - 1
    for k, smp in enumerate(decode_span(data, 0, sidecar, 0, len(sidecar), where)):
        problem = _sample_problem(index, smp, first + k, last)
        if problem:
            return f"{where}: sample {k} at byte {int(sidecar.offsets[k])}: {problem}"
        next_doc = report.documents + docs
        doc, off = (next_doc - 1, report._doc_tokens) if smp.cont else (next_doc, 0)
        if prov is not None and k < len(prov.sample_doc):
            if (int(prov.sample_doc[k]), int(prov.sample_offset[k])) != (doc, off):
                return (
                    f"{store.child_url(shard.provenance or '')}: sample {k} starts at document "
                    f"{int(prov.sample_doc[k])} token {int(prov.sample_offset[k])}, the samples "
                    f"say document {doc} token {off}"
                )
        pieces = index.document_pieces(smp.doc_lens)
        report._doc_tokens = doc_tokens_after(off, pieces, smp.cont) if pieces else 0
        tokens += len(smp.tokens)
        docs += len(pieces) - (1 if smp.cont else 0)
        if index.loss_mask is not None:
            report.supervised += int(np.count_nonzero(smp.tokens < NO_LOSS_BIT))
    if hashlib.sha256(data).hexdigest() != shard.sha256:
        return f"{where}: sha256 differs from index.json"
    # After the hash: a damaged header is reported as such; a shard that hashes right but
    # is misnamed was moved, renamed or written by another tool.
    problem = _members_problem(data, sidecar, first, SAMPLE_SUFFIXES[index.version])
    problem = problem or _running_problem(data, sidecar)
    if problem:
        return f"{where}: {problem}"
    if tokens != shard.tokens or docs != shard.documents:
        return (
            f"{where}: holds {tokens} tokens / {docs} documents, index.json says "
            f"{shard.tokens} / {shard.documents}"
        )
    report.samples += len(sidecar)
    report.tokens += tokens
    report.documents += docs
    return None


def _provenance(store: Store, shard: ShardEntry, first_doc: int) -> ShardProvenance | str | None:
    """The shard's provenance table (None if the dataset has none), or its first problem."""
    if shard.provenance is None:
        return None
    where = store.child_url(shard.provenance)
    data = store.read(shard.provenance)
    if hashlib.sha256(data).hexdigest() != shard.provenance_sha256:
        return f"{where}: sha256 differs from index.json"
    try:
        prov = ShardProvenance.from_bytes(data)
    except ValueError as exc:
        return f"{where}: {exc}"
    counts = (prov.first_doc, prov.documents, len(prov.sample_doc))
    if counts != (first_doc, shard.documents, shard.samples):
        return (
            f"{where}: (first document, documents, samples) = {counts}, index.json says "
            f"{(first_doc, shard.documents, shard.samples)}"
        )
    return prov


def _running_problem(data: memoryview, sidecar: ShardSidecar) -> str | None:
    """First sample whose running checksum in the sidecar is not the shard's, or None."""
    if sidecar.crc32c_run is None:
        return None
    ends, values = (x[1:].tolist() for x in sidecar.run_bounds)
    run = pos = 0
    for k, (end, want) in enumerate(zip(ends, values, strict=True)):
        run, pos = running_checksum(data[pos:end], run), end
        if run != want:
            return (
                f"sample {k}: the shard's running CRC32C to byte {end} is {run}, the sidecar "
                f"says {want}"
            )
    return None


def _members_problem(
    data: memoryview, sidecar: ShardSidecar, first: int, suffix: str
) -> str | None:
    """Whether the tar holds exactly the sidecar's samples, back to back, named in order.

    Reads the name and size fields of each header in place (a full header parse costs
    more than the rest of the verification of a sample).
    """
    offsets = sidecar.offsets.astype(np.int64)
    ends = offsets + (sidecar.sizes.astype(np.int64) + BLOCK - 1) // BLOCK * BLOCK
    follows = np.concatenate([[0], ends[:-1]])
    stray = np.flatnonzero(offsets - BLOCK != follows)
    if len(stray):
        k = int(stray[0])
        return (
            f"sample {k} at byte {int(offsets[k])}: other bytes between byte {int(follows[k])} "
            "and its header (a shard holds its samples and nothing else)"
        )
    if bytes(data[int(ends[-1]) :]) != END_OF_ARCHIVE:
        return f"bytes after sample {len(sidecar) - 1} other than the end-of-archive marker"
    for k, (offset, size) in enumerate(zip(offsets.tolist(), sidecar.sizes.tolist(), strict=True)):
        header = data[offset - BLOCK : offset]
        name = bytes(header[:100]).rstrip(b"\0").decode("utf-8", "replace")
        want = f"{first + k:012d}{suffix}"
        if name != want:
            return (
                f"sample {k} at byte {offset}: member {name!r}, expected {want!r} (its "
                "dataset-wide number: shards out of order or renamed, or not packed by wdstream)"
            )
        if bytes(header[124:136]) != b"%011o\0" % size:
            return f"sample {k} at byte {offset}: tar header size differs from the sidecar's {size}"
    return None


def _sample_problem(index: DatasetIndex, smp: Sample, number: int, last: int) -> str | None:
    """What in the dataset's sample ``number`` (of ``0..last``) disagrees with the index."""
    n = len(smp.tokens)
    if smp.tokens.dtype.name != index.dtype:
        return f"dtype {smp.tokens.dtype.name}, index says {index.dtype}"
    ids = split_ids(smp.tokens)[0] if index.loss_mask is not None else smp.tokens
    limit = max(index.tokenizer["n_vocab"], -1 if index.bos_id is None else index.bos_id + 1)
    if n and int(ids.max()) >= limit:
        return f"token id {int(ids.max())} outside the vocabulary (ids < {limit})"
    if number == 0 and smp.cont:
        return "continues a document, but it is the dataset's first sample"
    if index.mode == "docs" and (smp.cont or smp.doc_lens != (n,)):
        return (
            f"pieces {list(smp.doc_lens)}, cont {smp.cont}: mode 'docs' has one whole "
            "document per sample"
        )
    st = index.sample_tokens
    if index.mode == "concat" and st and not (0 < n <= st if number == last else n == st):
        return f"{n} tokens, sample_tokens is {st} (only the dataset's last sample may be shorter)"
    if index.mode == "bestfit":
        return _bestfit_problem(index, smp, ids)
    return None


def _bestfit_problem(index: DatasetIndex, smp: Sample, ids: np.ndarray) -> str | None:
    """A best-fit row: ``sample_tokens`` tokens, documents, then ``doc_lens[-1]`` of padding
    (``pad_id``) right after a document's EOS; in a masked dataset the padding carries no
    loss (bit 31). ``ids``: the sample's ids without the loss bit."""
    n, st = len(smp.tokens), index.sample_tokens
    if n != st or len(smp.doc_lens) < 2:
        return (
            f"{n} tokens in pieces {list(smp.doc_lens)}: a bestfit row has sample_tokens = "
            f"{st} tokens, at least one document piece, then its padding length"
        )
    pad = smp.doc_lens[-1]
    if pad and not (
        bool((ids[n - pad :] == index.pad_id).all()) and int(ids[n - pad - 1]) == index.eos_id
    ):
        return (
            f"its last {pad} tokens are not padding (pad_id {index.pad_id}) after a "
            f"document's EOS (eos_id {index.eos_id})"
        )
    if pad and index.loss_mask is not None and bool((smp.tokens[n - pad :] < NO_LOSS_BIT).any()):
        return f"its last {pad} tokens are padding that carries loss (no bit 31)"
    return None
