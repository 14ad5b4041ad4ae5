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
document, and optionally its decoded text; in a chat dataset, the turns of the conversation
each piece holds (:mod:`wdstream.read.chat_turns`). :func:`explain_steps` does so for a
range of steps with the dataset opened once; :func:`explanation_records` gives a step's rows
as JSON records (``wdstream explain --steps A:B --format jsonl``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from wdstream.errors import CorruptShardError, WdstreamError
from wdstream.format.loss import split_ids
from wdstream.format.provenance import ShardProvenance
from wdstream.read.chat_turns import ChatTurns, Turns
from wdstream.read.explain_lines import (
    explanation_lines,
    explanation_records,
    piece_line,
    piece_record,
)
from wdstream.read.order.global_order import GlobalOrder, Origin
from wdstream.read.sources.packed import ShardSource
from wdstream.read.step_query import (
    StepQuery,
    checked_steps,
    order_and_position,
    state_order_config,
)
from wdstream.storage import Store, open_store

__all__ = [
    "DocumentPiece",
    "Explanation",
    "ExplainedRow",
    "Provenance",
    "RowPiece",
    "StepQuery",
    "explain",
    "explain_steps",
    "explanation_lines",
    "explanation_records",
    "piece_line",
    "piece_record",
    "row_pieces",
    "state_order_config",
    "pieces_with_text",
    "with_turns",
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
        if not self.index.has_provenance():
            raise WdstreamError(
                f"{self.source.urls[0][0]}: packed without provenance tables (by a wdstream "
                "older than provenance); repack it to look up where documents came from"
            )
        self.pack_cwd: str | None = self.index.stats.get("pack_cwd")  # checked by the index
        docs = np.asarray(self.index.column("documents"), dtype=np.int64)
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

    def path(self, file: str) -> str | None:
        """Where input ``file`` (as given to pack) lies: joined to the pack's working directory
        (``stats.pack_cwd``) when relative, as given when absolute or a URL; None for no file
        (``<stdin>``, ``<records>``) or a relative one in a dataset packed before ``pack_cwd``."""
        if file.startswith("<"):
            return None
        if "://" in file or os.path.isabs(file):
            return file
        return os.path.join(self.pack_cwd, file) if self.pack_cwd else None

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
    turns: Turns | None = None  # chat datasets: the conversation's turns the piece holds
    path: str | None = None  # where ``file`` lies (:meth:`Provenance.path`)


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

    step: int  # the training step asked about (batches handed out, from the origin)
    data_step: int  # the step whose rows it reads: ``step`` unless the state records skips
    epoch: int
    seq_len: int
    seed: int
    world_size: int
    batch_size: int
    origin: Origin
    rows: tuple[ExplainedRow, ...]


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
    tokenizer: str | None = None,
    **store_options: Any,
) -> Explanation:
    """Every row of global step ``step`` of ``Loader(dataset, order="global", ...)``: its rank
    and where each of its document pieces came from.

    Args:
        dataset: packed dataset root (packed with provenance).
        step: the global training step, counted as the run counts it (from ``state``'s
            origin; with skips recorded in ``state``, the data step it maps to is read).
        batch_size: rows per rank (B); with ``state``, defaults to its global batch / W.
        world_size: ranks (W); row ``r`` of the step goes to rank ``r // B``.
        seq_len, seed, shuffle, shuffle_window, shuffle_lanes: the Loader's; ``seq_len``
            defaults to the packed one.
        state: a saved ``Loader.state_dict()`` (global order): seed, ``seq_len``, the
            shuffle options, global batch, origin and skips are taken from it (``seq_len``
            and ``seed``, if also given, must match it; the shuffle arguments are ignored).
        text: decode each piece's tokens (with the index's tokenizer).
        tokenizer: the dataset's tokenizer (a name or path), when the one ``index.json``
            records is not found from here (it is refused unless its sha256 is the recorded
            one, :func:`~wdstream.tokenizers.load.index_tokenizer`); a chat dataset's turns
            and ``text`` need it.
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
                      shuffle_lanes, state, text, tokenizer)  # fmt: skip
    return next(_explained(dataset, [step], query, store_options))


def explain_steps(dataset: str, steps: Iterable[int], **options: Any) -> Iterator[Explanation]:
    """:func:`explain` of each of ``steps`` (e.g. ``range(41200, 41300)``), opening the
    dataset once: the provenance tables, the epoch's plan and its windows are shared by
    the steps. Keyword options as :func:`explain`; the rest are store options.

    Every step is checked before this returns, so a bad range fails before any output; the
    explanations are made as they are iterated.

    Raises:
        as :func:`explain`.
    """
    query, store_options = StepQuery.of(options)
    return _explained(dataset, steps, query, store_options)


def _explained(
    dataset: str, steps: Iterable[int], query: StepQuery, store_options: dict[str, Any]
) -> Iterator[Explanation]:
    """Open and check everything for ``steps`` now; return the explanations' generator."""
    prov = Provenance(dataset, **store_options)
    cfg, batch_size = query.order_config(prov.index.seq_len)
    order, origin, data_step = order_and_position(prov.source, query.state, cfg)
    pairs = checked_steps(steps, origin, cfg.global_batch, data_step)
    tok = None
    if query.text:
        from wdstream.tokenizers import index_tokenizer

        tok = index_tokenizer(prov.index.tokenizer, prov.pack_cwd, query.tokenizer)
    chat = ChatTurns.of(prov.index, query.tokenizer)

    def explanations() -> Iterator[Explanation]:
        for step, data in pairs:
            epoch, first = order.locate(data, origin)
            rows, stored = [], []
            for r in range(cfg.global_batch):
                pieces = row_pieces(prov, order, epoch, first + r)
                if chat is not None:  # what each piece holds, for its turns to be checked on
                    ids = row_ids(order, epoch, first + r)
                    stored += [ids[p.row_start : p.row_end] for p in pieces]
                if tok is not None:
                    pieces = pieces_with_text(pieces, order, epoch, first + r, tok)
                rows.append(ExplainedRow(r, r // batch_size, r % batch_size, first + r,
                                         tuple(pieces)))  # fmt: skip
            if chat is not None:
                rows = with_turns(rows, chat, stored)
            yield Explanation(step, data, epoch, cfg.seq_len, cfg.seed, query.world_size,
                              batch_size, origin, tuple(rows))  # fmt: skip

    return explanations()


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
                             at + lo - off, at + hi - off, d + lo, d + hi, path=prov.path(p.file))
                )  # fmt: skip
        at += take
    return out


def pieces_with_text(
    pieces: list[RowPiece], order: GlobalOrder, epoch: int, row: int, tok: Any
) -> list[RowPiece]:
    """``pieces`` of row ``row`` with their decoded text (ids without the loss bit; cut to
    ``TEXT_CHARS``, then an ellipsis)."""
    ids, out = row_ids(order, epoch, row), []
    for p in pieces:
        text = tok.decode(ids[p.row_start : p.row_end])
        text = text[:TEXT_CHARS] + "\u2026" if len(text) > TEXT_CHARS else text
        out.append(replace(p, text=text))
    return out


def row_ids(order: GlobalOrder, epoch: int, row: int) -> np.ndarray:
    """The ids of row ``row`` of ``epoch`` (``seq_len + 1`` tokens, without the loss bit)."""
    tokens = np.zeros((1, order.row_tokens), dtype=np.int64)
    order.fill(epoch, row, tokens, None)
    return split_ids(tokens)[0][0]


def with_turns(
    rows: list[ExplainedRow], chat: ChatTurns, stored: list[np.ndarray] | None = None
) -> list[ExplainedRow]:
    """``rows`` with every piece's conversation turns (a chat dataset), each input file read
    once for all of them; ``stored``: every piece's ids, in order (:meth:`ChatTurns.turns`)."""
    turns = iter(chat.turns([p for row in rows for p in row.pieces], stored))
    return [
        replace(row, pieces=tuple(replace(p, turns=next(turns)) for p in row.pieces))
        for row in rows
    ]
