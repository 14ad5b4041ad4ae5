"""What runs on the cluster's workers: tokenise a piece, write a shard, check a kept shard.

Plain functions (the engine wraps them with ``ray.remote``). Each worker process loads the
tokenizer and opens the output store once and reuses them for every task it runs; for a
bpe-openai pack that is the binding alone (:func:`worker_recipe`), as the local engine's
worker processes load it, not tiktoken's ranks too; for a tiktoken pack the encoding built
from the ranks the driver loaded, put once into the object store (:func:`shipped_recipe`).

Shards are written by the local engine's :class:`~wdstream.write.shards.ShardWriter`, fed the
samples the local engine's sample builder makes of the shard's span of tokens (concat, docs:
:class:`SpanPlan`) or the samples the driver laid out one by one (best-fit:
:class:`ShardPlan`), so a shard's bytes are the local engine's by construction; the
store's atomic writes (a local ``.partial`` file renamed, an S3 multipart upload completed
only when whole) mean a task killed mid-write leaves nothing visible, and its retry writes
the same bytes again.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdstream.format.entry import ShardEntry
from wdstream.format.sample import DTYPES
from wdstream.inputs import InputFile
from wdstream.ray.pieces import InputPiece, PieceDocs, read_piece
from wdstream.storage import Store, open_store
from wdstream.tokenizers import Tokenizer, load_tokenizer
from wdstream.tokenizers.load import tokenizer_file_kind
from wdstream.tokenizers.tiktoken import BpeEncoder, TiktokenTokenizer
from wdstream.write.encoders import encode_flat
from wdstream.write.samples import ConcatSampleBuilder, DocsSampleBuilder
from wdstream.write.shards import ShardWriter, shard_names

__all__ = [
    "Encoder",
    "PieceJob",
    "ShardJob",
    "ShardPlan",
    "SpanPlan",
    "ShippedParts",
    "cached_tokenizer",
    "driver_encoder",
    "check_shard",
    "shipped_recipe",
    "tiktoken_from_driver",
    "tokenize_piece",
    "warm_up",
    "worker_recipe",
    "write_shard",
]

Encoder = Tokenizer | BpeEncoder  # what a worker encodes with (encode_flat takes either)
Recipe = tuple[Callable[..., Encoder], tuple[Any, ...]]  # how a worker rebuilds it

# One sample as ShardWriter.add takes it: tokens, doc_lens, cont, new_docs, starts, offset.
_Sample = tuple[np.ndarray, list[int], bool, int, Sequence[Any], "int | None"]

_tokenizers: dict[Any, Encoder] = {}  # per worker process, by recipe
_stores: dict[str, Store] = {}  # per worker process, by root URL and options


@dataclass(frozen=True)
class PieceJob:
    """What every tokenising task of one pack shares."""

    files: list[InputFile]
    text_key: str
    lines: bool
    on_error: str
    errors: str
    max_record_bytes: int
    tokenizer: Recipe  # :func:`worker_recipe`: rebuilt once per worker, not per task
    bos_id: int | None
    eos_id: int | None
    dtype: str


@dataclass(frozen=True)
class ShardJob:
    """What every shard-writing task of one pack shares."""

    url: str
    store_options: dict[str, Any]
    name: str
    shard_bytes: int
    shard_samples: int | None
    provenance: list[str] | None  # input names for the .prov tables; None: no tables
    dtype: str
    pad_id: int  # the token written where a sample's index array holds -1 (padding)


@dataclass(frozen=True)
class ShardPlan:
    """One shard as the driver laid it out: where its tokens are and its samples' metadata.

    ``runs`` are ``(first global token, count)`` rows over the run's token stream (the
    concatenation of every piece's tokens); a first token of -1 is padding. Samples take
    ``sample_tokens[k]`` consecutive tokens of the runs' concatenation.
    """

    index: int
    first_sample: int
    first_doc: int
    doc_offset: int
    runs: np.ndarray
    sample_tokens: list[int]
    doc_lens: list[list[int]]
    cont: list[bool]
    new_docs: list[int]
    starts: list[list[tuple[int, int]]]  # (file, record) of the documents starting per sample
    offsets: list[
        int | None
    ]  # per sample: its first piece's offset, where the sample builder knows it
    piece_offsets: list[int]  # first global token of each piece array passed to the task


@dataclass(frozen=True)
class SpanPlan:
    """One shard of a concat or docs pack as the driver laid it out: one span of global
    tokens (``runs``, a single row) and the documents overlapping it; the task builds the
    samples itself with the local engine's sample builder (:mod:`wdstream.ray.spans`).

    ``doc_lens`` are the documents' tokens inside the span, ``files`` and ``records`` their
    input positions (provenance), ``pre`` the first document's tokens before the span.
    ``samples`` and ``new_docs`` are what the driver counted, checked against the builder.
    """

    index: int
    first_sample: int
    first_doc: int
    doc_offset: int
    runs: np.ndarray
    piece_offsets: list[int]
    sample_tokens: int | None  # concat: tokens per sample; None: docs (one per document)
    samples: int
    new_docs: int
    pre: int
    doc_lens: np.ndarray
    files: np.ndarray
    records: np.ndarray


def worker_recipe(tok: Tokenizer) -> Recipe:
    """How a worker process rebuilds what it encodes ``tok``'s texts with: for a bpe-openai
    tiktoken encoding just the binding (:class:`BpeEncoder`, ~30 ms to load; the same ids,
    through the same ``encode_flat``), as the local engine's workers do, instead of also
    tiktoken's ranks (~0.1-0.3 s of CPU per worker, decoded line by line in Python); else
    the tokenizer's own ``__reduce__``."""
    if isinstance(driver_encoder(tok), BpeEncoder):
        assert isinstance(tok, TiktokenTokenizer)
        return (BpeEncoder, (tok.name,))
    build, args = tok.__reduce__()
    return (build, tuple(args))


class ShippedParts:
    """A tiktoken encoding's :meth:`~TiktokenTokenizer.parts` in the object store.

    Its ``repr`` (what a recipe's cache key is made of) is ``key``, the encoding's spec and
    ranks hash, not the object reference: a worker running one pack after another reuses
    the encoding it built instead of keeping one per pack."""

    def __init__(self, key: str, ref: Any) -> None:
        self.key, self.ref = key, ref

    def __repr__(self) -> str:
        return self.key


def shipped_recipe(tok: Tokenizer) -> Recipe:
    """:func:`worker_recipe`, except for a tiktoken encoding encoded by tiktoken: its parts
    (ranks, pattern, special tokens), put once into the object store, from which each worker
    builds the same encoding (:func:`tiktoken_from_driver`) instead of reading and
    base64-decoding the ranks file, and a worker on another machine needs no copy of it
    (nor tiktoken's download of it). Measured per worker, cl100k_base: ~0.08 s of CPU
    instead of ~0.14 s (docs/RAY.md); the driver pickles the ranks once (~0.01 s)."""
    if isinstance(tok, TiktokenTokenizer) and tok.bpe is None:
        import ray  # here, not at the top: the local engine imports this module (layouts)

        key = f"{tok.spec!r} {tok.ranks_sha256}"  # ranks_sha256: computed for index.json
        return (tiktoken_from_driver, (tok.spec, ShippedParts(key, ray.put(tok.parts()))))
    return worker_recipe(tok)


def tiktoken_from_driver(spec: str, parts: ShippedParts) -> TiktokenTokenizer:
    """The tiktoken encoding :func:`shipped_recipe` shipped, built in this worker."""
    import ray

    return TiktokenTokenizer.from_parts(spec, ray.get(parts.ref))


def driver_encoder(tok: Tokenizer) -> Encoder:
    """What encodes ``tok``'s texts: its bpe-openai binding when that is its backend."""
    return tok.bpe if isinstance(tok, TiktokenTokenizer) and tok.bpe is not None else tok


def warm_up(spec: str, backend: str) -> None:
    """Import this module and load what the pack's workers will encode with into this
    worker's cache, early: a pack runs it on every CPU while the driver loads the tokenizer
    itself, instead of each worker's first task paying it. For ``auto`` and ``bpe-openai``
    and an encoding name the binding knows, that is the binding alone (the recipe
    :func:`worker_recipe` gives unless the driver's checks fall back to tiktoken; a
    recipe not cached here is built by the first task). A tiktoken encoding is not loaded
    here: the first task builds it from the driver's ranks (:func:`shipped_recipe`). A
    tokenizer file is. The driver's load reports any error."""
    try:
        if backend != "tiktoken":
            try:
                _tokenizers.setdefault(_recipe_key((BpeEncoder, (spec,))), BpeEncoder(spec))
                return
            except (ImportError, ValueError, OSError):
                pass  # no binding, or not an encoding name: the full load below
        if tokenizer_file_kind(spec) is None:
            return  # a tiktoken encoding: the driver ships its ranks
        tok = load_tokenizer(spec, backend)
    except Exception:  # noqa: BLE001, S110 - the driver's load raises it, naming what was tried
        return
    _tokenizers.setdefault(_recipe_key(worker_recipe(tok)), driver_encoder(tok))


def cached_tokenizer(recipe: Recipe) -> Encoder:
    """What ``recipe`` rebuilds, built once per worker process."""
    key = _recipe_key(recipe)
    if key not in _tokenizers:
        build, args = recipe
        _tokenizers[key] = build(*args)
    return _tokenizers[key]


def _recipe_key(recipe: Recipe) -> tuple[str, str, str]:
    build, args = recipe
    return build.__module__, build.__qualname__, repr(args)


def _store(url: str, options: dict[str, Any]) -> Store:
    key = repr((url, sorted(options.items())))
    if key not in _stores:
        _stores[key] = open_store(url, **options)
    return _stores[key]


def tokenize_piece(
    job: PieceJob, piece: InputPiece, encoder: Encoder | None = None
) -> tuple[PieceDocs, np.ndarray]:
    """Read and tokenise one piece: its documents' metadata, and all their tokens in one array.

    ``encoder``: what to encode with (the driver's own tokenizer, when it takes a piece);
    None: what ``job``'s recipe rebuilds, once per worker process."""
    texts, docs = read_piece(
        job.files, piece, job.text_key, job.lines, job.on_error, job.errors, job.max_record_bytes
    )
    tok = cached_tokenizer(job.tokenizer) if encoder is None else encoder
    flat, lens = encode_flat(tok, texts, job.bos_id, job.eos_id, job.dtype)
    docs.lens = lens
    return docs, flat


def _gather(
    plan: ShardPlan | SpanPlan, pieces: Sequence[np.ndarray], dtype: np.dtype, pad: int
) -> np.ndarray:
    """The shard's tokens, in sample order, copied out of the piece arrays."""
    total = int(plan.runs[:, 1].sum()) if len(plan.runs) else 0
    out = np.empty(total, dtype=dtype)
    at = 0
    for first, n in plan.runs.tolist():
        if first < 0:
            out[at : at + n] = pad
            at += n
            continue
        while n:  # a run may cross from one piece into the next
            p = bisect.bisect_right(plan.piece_offsets, first) - 1
            local = first - plan.piece_offsets[p]
            take = min(n, len(pieces[p]) - local)
            out[at : at + take] = pieces[p][local : local + take]
            at, first, n = at + take, first + take, n - take
    return out


def _plan_samples(plan: ShardPlan, tokens: np.ndarray) -> Iterator[_Sample]:
    """The samples the driver laid out one by one, their tokens cut from the gathered ones."""
    at = 0
    for k, n in enumerate(plan.sample_tokens):
        yield (
            tokens[at : at + n], plan.doc_lens[k], plan.cont[k], plan.new_docs[k],
            plan.starts[k], plan.offsets[k],
        )  # fmt: skip
        at += n


def _span_samples(plan: SpanPlan, tokens: np.ndarray) -> list[_Sample]:
    """The span's samples, built by the local engine's sample builder, resumed ``pre`` tokens
    into the first document when the span starts inside it.

    Raises:
        RuntimeError: the builder made other samples than the driver counted (a driver bug).
    """
    dtype = tokens.dtype
    builder: ConcatSampleBuilder | DocsSampleBuilder
    if plan.sample_tokens is None:
        builder = DocsSampleBuilder(dtype)
    else:
        builder = ConcatSampleBuilder(plan.sample_tokens, dtype)
        builder.resume_inside_document(plan.pre)
    positions = list(zip(plan.files.tolist(), plan.records.tolist(), strict=True))
    made = [*builder.add(tokens, plan.doc_lens, positions), *builder.flush()]
    if len(made) != plan.samples or sum(s.new_docs for s in made) != plan.new_docs:
        raise RuntimeError(
            f"shard task {plan.index}: the builder made {len(made)} samples starting "
            f"{sum(s.new_docs for s in made)} documents, the driver laid out {plan.samples} "
            f"starting {plan.new_docs}"
        )
    return [(s.tokens, s.doc_lens, s.cont, s.new_docs, s.starts, s.offset) for s in made]


def write_shard(job: ShardJob, plan: ShardPlan | SpanPlan, *pieces: np.ndarray) -> dict[str, Any]:
    """Write one shard (provenance table, sidecar, tar) and return its index entry.

    Raises:
        RuntimeError: the samples did not make exactly the planned shard (a driver bug).
    """
    tokens = _gather(plan, pieces, DTYPES[job.dtype], job.pad_id)
    if isinstance(plan, SpanPlan):
        samples: Iterable[_Sample] = _span_samples(plan, tokens)
    else:
        samples = _plan_samples(plan, tokens)
    committed: list[ShardEntry] = []
    writer = ShardWriter(
        _store(job.url, job.store_options),
        job.name,
        job.shard_bytes,
        job.shard_samples,
        first_shard=plan.index,
        first_sample=plan.first_sample,
        on_commit=lambda entry, _: committed.append(entry),
        provenance=job.provenance,
        first_doc=plan.first_doc,
        doc_offset=plan.doc_offset,
    )
    try:
        for toks, doc_lens, cont, new_docs, starts, offset in samples:
            writer.add(toks, doc_lens, cont, new_docs, None, starts, offset)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    expected = shard_names(job.name, plan.index)[0]
    if [e.name for e in committed] != [expected]:
        raise RuntimeError(
            f"shard task {plan.index} wrote {[e.name for e in committed]}, expected [{expected!r}]"
        )
    return dict(committed[0].__dict__)


def check_shard(url: str, store_options: dict[str, Any], entry: dict[str, Any]) -> str | None:
    """Check a shard kept from an interrupted pack against its recorded sha256 values.

    Returns:
        None when the tar, sidecar and provenance table match, else what differs.
    """
    store = _store(url, store_options)
    wanted = [(entry["name"], entry["sha256"]), (entry["sidecar"], entry["sidecar_sha256"])]
    if entry.get("provenance"):
        wanted.append((entry["provenance"], entry["provenance_sha256"]))
    for name, sha in wanted:
        h = hashlib.sha256()
        try:
            for chunk in store.iter_chunks(name):
                h.update(chunk)
        except FileNotFoundError:
            return f"{store.child_url(name)} is missing"
        if h.hexdigest() != sha:
            return f"{store.child_url(name)} does not match its sha256 in the pack journal"
    return None
