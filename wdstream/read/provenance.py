"""Where tokens came from: the document pieces of a packed sample, and ``explain`` for a step.

Pack writes a provenance table per shard (:mod:`wdstream.format.provenance`): the input file
and line of every document that starts in the shard, and per sample the document and token
offset its first piece begins at. :class:`Provenance` turns ``(shard, sample)`` into pieces::

    Provenance("data/").pieces(3, 17)
    -> [DocumentPiece(shard=3, sample=17, document=1041, file='in.jsonl', line=1042,
                      sample_start=0, sample_end=12, doc_start=2036, doc_end=2048), ...]

:func:`explain` locates the rows of a global step (:class:`~wdstream.read.order.global_order.GlobalOrder`,
exactly as ``Loader(..., order="global")`` reads them) and lists, for every row, the rank it
goes to and each piece: shard, sample, ``file:line``, its token span in the row and in its
document, and optionally its decoded text.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdstream.errors import CorruptShardError, StateMismatchError, WdstreamError
from wdstream.format.loss import split_ids
from wdstream.format.provenance import ShardProvenance
from wdstream.read.order.global_order import GlobalOrder, OrderConfig, Origin
from wdstream.read.order.step_check import check_step
from wdstream.read.sources.packed import ShardSource
from wdstream.storage import Store, open_store
from wdstream.words import count

__all__ = [
    "DocumentPiece",
    "Explanation",
    "ExplainedRow",
    "Provenance",
    "RowPiece",
    "StepQuery",
    "explain",
    "explanation_lines",
    "row_pieces",
    "state_order_config",
    "with_text",
]

_TABLE_CACHE = 16  # shards' provenance tables kept in memory (a few KB each)
TEXT_CHARS = 200  # decoded text shown per piece; longer text ends in an ellipsis


@dataclass(frozen=True)
class DocumentPiece:
    """One document piece of a packed sample: spans are ``[start, end)`` token offsets."""

    shard: int  # position in index.json's shards
    sample: int  # sample number inside the shard
    document: int  # dataset-wide document number (pack order)
    file: str  # input file, as given to pack
    line: int  # 1-based line (record) of the document in ``file``
    sample_start: int
    sample_end: int
    doc_start: int  # token offsets inside the document (BOS/EOS included, as packed)
    doc_end: int


class Provenance:
    """Look up where the documents of a packed dataset came from.

    Args:
        dataset: dataset root (with ``index.json``) or an open :class:`ShardSource` of one.
        store_options: passed to :func:`wdstream.storage.open_store`.

    Raises:
        WdstreamError: the dataset was packed without provenance tables.
        ValueError: ``dataset`` is a list of shard URLs (no index to number documents).
    """

    def __init__(self, dataset: str | ShardSource, **store_options: Any) -> None:
        self.source = (
            dataset if isinstance(dataset, ShardSource) else ShardSource(dataset, **store_options)
        )
        if self.source.index is None:
            raise ValueError("provenance needs a dataset root with index.json, not shard URLs")
        self.index = self.source.index
        if any(s.provenance is None for s in self.index.shards):
            raise WdstreamError(
                f"{self.source.urls[0][0]}: packed without provenance tables (by a wdstream "
                "older than provenance); repack it to look up where documents came from"
            )
        docs = [s.documents for s in self.index.shards]
        self.doc_starts = np.concatenate([[0], np.cumsum(docs)]).astype(np.int64)
        self._options = store_options
        self._stores: dict[str, Store] = {}
        self._tables: OrderedDict[int, ShardProvenance] = OrderedDict()
        self._lock = threading.Lock()

    def table(self, shard: int) -> ShardProvenance:
        """Shard ``shard``'s provenance table, checked against its sha256 and counts.

        Raises:
            CorruptShardError: naming the table, if it does not match ``index.json``.
        """
        with self._lock:
            hit = self._tables.get(shard)
            if hit is not None:
                self._tables.move_to_end(shard)
                return hit
        entry = self.index.shards[shard]
        root = self.source.urls[shard][0]
        store = self._stores.get(root) or self._stores.setdefault(
            root, open_store(root, **self._options)
        )
        assert entry.provenance is not None
        where = store.child_url(entry.provenance)
        data = store.read(entry.provenance)
        if hashlib.sha256(data).hexdigest() != entry.provenance_sha256:
            raise CorruptShardError(f"{where}: sha256 differs from index.json's")
        try:
            table = ShardProvenance.from_bytes(data)
        except ValueError as exc:
            raise CorruptShardError(f"{where}: {exc}") from exc
        counts = (table.first_doc, table.documents, len(table.sample_doc))
        expected = (int(self.doc_starts[shard]), entry.documents, entry.samples)
        if counts != expected:
            raise CorruptShardError(
                f"{where}: (first document, documents, samples) = {counts}, index.json says "
                f"{expected}"
            )
        with self._lock:
            self._tables[shard] = table
            while len(self._tables) > _TABLE_CACHE:
                self._tables.popitem(last=False)
        return table

    def document(self, doc: int) -> tuple[str, int]:
        """``(input file, line)`` of dataset-wide document ``doc``.

        Raises:
            IndexError: for a number outside the dataset's documents.
        """
        if not 0 <= doc < int(self.doc_starts[-1]):
            raise IndexError(f"document {doc} outside the dataset's {int(self.doc_starts[-1])}")
        shard = int(np.searchsorted(self.doc_starts, doc, side="right")) - 1
        return self.table(shard).source(doc)

    def pieces(self, shard: int, sample: int) -> list[DocumentPiece]:
        """The document pieces of sample ``sample`` of shard ``shard``, in sample order.

        Reads the sample (one ranged read) for its piece lengths, and the table of every
        shard a piece's document starts in.

        Raises:
            IndexError: for a shard or sample that does not exist.
        """
        if not 0 <= shard < len(self.index.shards):
            raise IndexError(f"shard {shard} outside the dataset's {len(self.index.shards)}")
        table = self.table(shard)
        if not 0 <= sample < len(table.sample_doc):
            raise IndexError(f"sample {sample} outside shard {shard}'s {len(table.sample_doc)}")
        lens = self.source.read([(shard, sample, sample + 1)], docs=True)[0].doc_lens
        doc, offset = int(table.sample_doc[sample]), int(table.sample_offset[sample])
        out, start = [], 0
        for i, n in enumerate(self.index.document_pieces(lens[0])):
            d, o = doc + i, offset if i == 0 else 0
            file, line = self.document(d)
            out.append(DocumentPiece(shard, sample, d, file, line, start, start + n, o, o + n))
            start += n
        return out


@dataclass(frozen=True)
class RowPiece:
    """One document piece of a training row (``[start, end)`` token spans)."""

    shard: int
    shard_name: str
    sample: int  # inside the shard
    document: int
    file: str
    line: int
    row_start: int  # in the row of seq_len + 1 tokens (input_ids = row[:-1])
    row_end: int
    doc_start: int  # in the document
    doc_end: int
    text: str | None = None  # decoded tokens (with ``text=True``), cut to TEXT_CHARS


@dataclass(frozen=True)
class ExplainedRow:
    """Row ``row`` of a global step: rank ``rank`` gets it as row ``rank_row`` of its batch."""

    row: int
    rank: int
    rank_row: int
    epoch_row: int  # the row's number in its epoch's sequence
    pieces: tuple[RowPiece, ...]


@dataclass(frozen=True)
class Explanation:
    """Every row of global step ``step`` and where its tokens came from."""

    step: int
    epoch: int
    seq_len: int
    seed: int
    world_size: int
    batch_size: int
    origin: Origin
    rows: tuple[ExplainedRow, ...]


def state_order_config(state: Any) -> OrderConfig:
    """The order parameters a saved global-order (or mixture) Loader state was taken with."""
    try:
        c = state["config"]
        return OrderConfig(
            seq_len=int(c["seq_len"]), global_batch=int(c["global_batch"]),
            shuffle=bool(c["shuffle"]), seed=int(c["seed"]),
            shuffle_window=int(c["shuffle_window"]), shuffle_lanes=int(c["shuffle_lanes"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise StateMismatchError(f"not a global-order Loader state (config: {exc!r})") from exc


def _order_and_origin(
    source: ShardSource, state: Any, cfg: OrderConfig
) -> tuple[GlobalOrder, Origin]:
    """The order of ``cfg``; with a saved state, the origin that run counts steps from."""
    if state is None:
        return GlobalOrder(source, cfg), Origin()
    from wdstream.read.order.global_sequence import GlobalReader  # torch: only for a state

    reader = GlobalReader(source, cfg, 0, cfg.global_batch, 1, False)
    return reader.order, reader.position_of(state).origin  # checks dataset, seed, ...


@dataclass(frozen=True)
class StepQuery:
    """Which global step's rows :func:`explain` (and ``explain_mixture``) is asked about:
    the Loader options that ordered them, or a saved state to take them from (see
    :func:`explain` for each field)."""

    batch_size: int | None = None
    world_size: int = 1
    seq_len: int | None = None
    seed: int | None = None
    shuffle: bool = True
    shuffle_window: int = 1024
    shuffle_lanes: int = 8
    state: dict[str, Any] | None = None
    text: bool = False

    @classmethod
    def of(cls, options: dict[str, Any]) -> tuple[StepQuery, dict[str, Any]]:
        """The query among keyword ``options``, and the rest (store options)."""
        names = set(cls.__dataclass_fields__)
        mine = {k: v for k, v in options.items() if k in names}
        return cls(**mine), {k: v for k, v in options.items() if k not in names}

    def order_config(self, packed_seq_len: int | None) -> tuple[OrderConfig, int]:
        """The order's parameters and the rows per rank (B), from the state or the options
        (``seq_len`` defaults to ``packed_seq_len``).

        Raises:
            ValueError: options that disagree with the state, inconsistent sizes, or no
                ``seq_len`` or ``batch_size`` to go by.
            StateMismatchError: a state that is not a global-order or mixture state.
        """
        world_size, batch_size = self.world_size, self.batch_size
        if self.state is not None:
            cfg = state_order_config(self.state)
            given = {"seq_len": self.seq_len, "seed": self.seed}
            clash = [f"{k} {v} (state: {getattr(cfg, k)})" for k, v in given.items()
                     if v is not None and v != getattr(cfg, k)]  # fmt: skip
            if clash:
                raise ValueError(f"options disagree with the state: {', '.join(clash)}")
            if batch_size is None:
                batch_size = cfg.global_batch // world_size
            if world_size * batch_size != cfg.global_batch:
                raise ValueError(
                    f"world_size x batch_size = {world_size} x {batch_size} is not the state's "
                    f"global batch {cfg.global_batch}"
                )
        else:
            seq_len = self.seq_len if self.seq_len is not None else packed_seq_len
            if seq_len is None:
                raise ValueError(
                    "seq_len is needed: no one packed length to default to (a docs-mode "
                    "dataset, or sources packed at different lengths)"
                )
            if batch_size is None:
                raise ValueError("batch_size is needed (or a state to take the global batch from)")
            cfg = OrderConfig(seq_len, world_size * batch_size, self.shuffle, self.seed or 0,
                              self.shuffle_window, self.shuffle_lanes)  # fmt: skip
        if world_size < 1 or batch_size < 1:
            raise ValueError(
                f"world_size and batch_size must be >= 1, got {world_size}, {batch_size}"
            )
        return cfg, batch_size


def explain(
    dataset: str,
    step: int,
    *,
    batch_size: int | None = None,
    world_size: int = 1,
    seq_len: int | None = None,
    seed: int | None = None,
    shuffle: bool = True,
    shuffle_window: int = 1024,
    shuffle_lanes: int = 8,
    state: dict[str, Any] | None = None,
    text: bool = False,
    **store_options: Any,
) -> Explanation:
    """Every row of global step ``step`` of ``Loader(dataset, order="global", ...)``: its rank
    and where each of its document pieces came from.

    Args:
        dataset: packed dataset root (packed with provenance).
        step: the global step, counted as the run counts it (from ``state``'s origin).
        batch_size: rows per rank (B); with ``state``, defaults to its global batch / W.
        world_size: ranks (W); row ``r`` of the step goes to rank ``r // B``.
        seq_len, seed, shuffle, shuffle_window, shuffle_lanes: the Loader's; ``seq_len``
            defaults to the packed one.
        state: a saved ``Loader.state_dict()`` (global order): seed, ``seq_len``, the
            shuffle options, global batch and origin are taken from it (``seq_len`` and
            ``seed``, if also given, must match it; the shuffle arguments are ignored).
        text: decode each piece's tokens (with the index's tokenizer).
        store_options: passed to :func:`wdstream.storage.open_store`.

    Returns:
        The step's rows, in order (rank 0's first).

    Raises:
        ValueError: inconsistent sizes, or a step the run never reaches (before the
            state's origin, or past the rows a run can number: :func:`check_step`).
        TypeError: a step that is not an integer.
        StateMismatchError: a state of another dataset or configuration.
        WdstreamError: a dataset packed without provenance.
    """
    query = StepQuery(batch_size, world_size, seq_len, seed, shuffle, shuffle_window,
                      shuffle_lanes, state, text)  # fmt: skip
    prov = Provenance(dataset, **store_options)
    index = prov.index
    cfg, batch_size = query.order_config(index.seq_len)
    order, origin = _order_and_origin(prov.source, state, cfg)
    step = check_step(step, origin.step, origin.row, cfg.global_batch)
    epoch, first = order.locate(step, origin)
    tok = None
    if text:
        from wdstream.tokenizers import index_tokenizer

        tok = index_tokenizer(index.tokenizer)
    rows = []
    for r in range(cfg.global_batch):
        pieces = row_pieces(prov, order, epoch, first + r)
        if tok is not None:
            tokens = np.zeros((1, order.row_tokens), dtype=np.int64)
            order.fill(epoch, first + r, tokens, None)
            tokens = split_ids(tokens)[0]  # a masked dataset's ids without the loss bit
            pieces = [with_text(p, tok.decode(tokens[0, p.row_start : p.row_end])) for p in pieces]
        rows.append(ExplainedRow(r, r // batch_size, r % batch_size, first + r, tuple(pieces)))
    return Explanation(
        step, epoch, cfg.seq_len, cfg.seed, world_size, batch_size, origin, tuple(rows)
    )


def row_pieces(prov: Provenance, order: GlobalOrder, epoch: int, row: int) -> list[RowPiece]:
    """The document pieces of row ``row`` of ``epoch`` of ``order`` (over ``prov``'s dataset)."""
    plan, out, at = order.plan(epoch), [], 0
    for position, off, take in order.row_segments(epoch, row):
        [(shard, sample, _)] = plan.pieces(position, position + 1)
        name = prov.index.shards[shard].name
        for p in prov.pieces(shard, sample):
            lo, hi = max(p.sample_start, off), min(p.sample_end, off + take)
            if lo < hi:
                d = p.doc_start - p.sample_start
                out.append(
                    RowPiece(shard, name, sample, p.document, p.file, p.line,
                             at + lo - off, at + hi - off, d + lo, d + hi)
                )  # fmt: skip
        at += take
    return out


def with_text(piece: RowPiece, text: str) -> RowPiece:
    """``piece`` with its decoded ``text`` (cut to ``TEXT_CHARS``)."""
    if len(text) > TEXT_CHARS:
        text = text[:TEXT_CHARS] + "\u2026"
    return RowPiece(**{**piece.__dict__, "text": text})


def explanation_lines(exp: Explanation) -> list[str]:
    """``wdstream explain``'s output: a header, then per row its rank and one line per piece
    (``[start, end)`` token spans; text, when decoded, as a JSON string on the next line)."""
    o, a, b = exp.origin, exp.rows[0].epoch_row, exp.rows[-1].epoch_row
    lines = [
        f"step {exp.step}: epoch {exp.epoch}, {f'rows {a}-{b}' if b > a else f'row {a}'} of the "
        f"epoch; global batch {len(exp.rows)} = {count(exp.world_size, 'rank')} x "
        f"{exp.batch_size}; seq_len {exp.seq_len}, seed {exp.seed}"
        + (f"; steps counted from step {o.step} = epoch {o.epoch} row {o.row}" if o.step else "")
    ]
    for row in exp.rows:
        lines.append(f"row {row.row}: rank {row.rank} row {row.rank_row}")
        for p in row.pieces:
            lines.append(
                f"  row [{p.row_start}, {p.row_end}) {p.shard_name} sample {p.sample} "
                f"{p.file}:{p.line} doc [{p.doc_start}, {p.doc_end})"
            )
            if p.text is not None:
                lines.append("    " + json.dumps(p.text, ensure_ascii=False))
    return lines
