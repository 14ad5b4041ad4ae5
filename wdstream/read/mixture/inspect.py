"""Inspect a mixture from its spec file: per-source stats and the schedule (``wdstream stats
mix.toml``), and the rows of a global step with the source, source epoch and input
``file:line`` of every row (``wdstream explain mix.toml --step 41210``), read exactly as
``Loader("mix.toml", ...)`` reads them::

    step 12: global batch 8 = 1 rank x 8; seq_len 16, seed 0; weights web 3/5 code 2/5
    row 0: rank 0 row 0  web epoch 0 row 17
      row [0, 17) data-000003.tar sample 4 in.jsonl:52 doc [40, 57)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wdstream.errors import WdstreamError
from wdstream.read.mixture.reader import MixtureReader
from wdstream.read.mixture.schedule import parse_weights
from wdstream.read.mixture.sources import open_sources
from wdstream.read.mixture.spec import MixtureSpec, read_spec
from wdstream.read.order.global_order import Origin
from wdstream.read.order.step_check import check_step
from wdstream.read.provenance import Provenance, RowPiece, StepQuery, row_pieces, with_text
from wdstream.words import count

__all__ = [
    "MixtureExplanation",
    "MixtureRow",
    "explain_mixture",
    "mixture_explanation_lines",
    "mixture_stats",
    "mixture_stats_lines",
]


@dataclass(frozen=True)
class MixtureRow:
    """Row ``row`` of a step: rank ``rank``'s row ``rank_row``, from ``source``'s row
    ``source_row`` of its epoch ``source_epoch``; pieces None without provenance tables."""

    row: int
    rank: int
    rank_row: int
    source: str
    source_epoch: int
    source_row: int
    pieces: tuple[RowPiece, ...] | None


@dataclass(frozen=True)
class MixtureExplanation:
    """Every row of global step ``step`` of a mixture, and the weights in effect there."""

    step: int
    seq_len: int
    seed: int
    world_size: int
    batch_size: int
    origin: Origin
    weights: dict[str, tuple[int, int]]  # name -> (numerator, denominator)
    rows: tuple[MixtureRow, ...]


def _spec(spec: str | Path | MixtureSpec) -> MixtureSpec:
    return spec if isinstance(spec, MixtureSpec) else read_spec(spec)


def explain_mixture(
    spec: str | Path | MixtureSpec, step: int, **options: Any
) -> MixtureExplanation:
    """Every row of global step ``step`` of ``Loader(spec, ...)``: rank, source, the
    source's epoch and row, and (for sources packed with provenance) each piece's
    ``file:line``. Keyword options as :func:`wdstream.read.provenance.explain`
    (:class:`~wdstream.read.provenance.StepQuery`; the rest are store options); ``seq_len``
    defaults to the sources' packed one when they share it.

    Raises:
        ValueError: inconsistent sizes, or no ``seq_len`` to default to.
        StateMismatchError: a state of another mixture or configuration.
    """
    query, store_options = StepQuery.of(options)
    state, text = query.state, query.text
    mix = _spec(spec)
    sources = open_sources(mix, **store_options)
    packed = {s.index.seq_len if s.index else None for s in sources}
    cfg, batch_size = query.order_config(packed.pop() if len(packed) == 1 else None)
    reader = MixtureReader(mix, sources, cfg, 0, cfg.global_batch, 1, False)
    position = reader.position_of(state) if state is not None else reader.start(0)
    step = check_step(step, position.origin.step, position.origin.row, cfg.global_batch)
    rows = reader.rank_rows(step, 1, position.origin)
    provs: dict[int, Provenance | None] = {}
    tok = None
    if text:
        from wdstream.tokenizers import index_tokenizer

        index = next(s.index for s in sources if s.index is not None)
        tok = index_tokenizer(index.tokenizer)
    out = []
    for r, (i, epoch, row) in enumerate(reader.locate(rows, position)):
        if i not in provs:
            try:
                provs[i] = Provenance(sources[i], **store_options)
            except (WdstreamError, ValueError):
                provs[i] = None  # packed without provenance tables, or shard URLs
        prov, order = provs[i], reader.orders[i]
        pieces = row_pieces(prov, order, epoch, row) if prov is not None else None
        if pieces is not None and tok is not None:
            tokens = np.zeros((1, order.row_tokens), dtype=np.int64)
            order.fill(epoch, row, tokens, None)
            pieces = [with_text(p, tok.decode(tokens[0, p.row_start : p.row_end])) for p in pieces]
        out.append(MixtureRow(r, r // batch_size, r % batch_size, mix.names[i], epoch, row,
                              None if pieces is None else tuple(pieces)))  # fmt: skip
    sched = reader.schedule(position)
    piece = sched.pieces[sched.piece_at(int(rows[0]))]
    total = sum(piece.weights)
    weights = {n: (w, total) for n, w in zip(mix.names, piece.weights, strict=True)}
    return MixtureExplanation(step, cfg.seq_len, cfg.seed, query.world_size, batch_size,
                              position.origin, weights, tuple(out))  # fmt: skip


def mixture_explanation_lines(exp: MixtureExplanation) -> list[str]:
    """``wdstream explain SPEC``'s output: a header, then per row its rank and source and
    one line per piece (as ``explanation_lines``)."""
    o = exp.origin
    mix = " ".join(f"{n} {a}/{b}" for n, (a, b) in exp.weights.items())
    lines = [
        f"step {exp.step}: global batch {len(exp.rows)} = {count(exp.world_size, 'rank')} x "
        f"{exp.batch_size}; seq_len {exp.seq_len}, seed {exp.seed}; weights {mix}"
        + (f"; steps counted from step {o.step} = mixture row {o.row}" if o.step else "")
    ]
    for row in exp.rows:
        lines.append(f"row {row.row}: rank {row.rank} row {row.rank_row}  {row.source} epoch "
                     f"{row.source_epoch} row {row.source_row}")  # fmt: skip
        if row.pieces is None:
            lines.append("  (no provenance tables in this source)")
            continue
        for p in row.pieces:
            lines.append(f"  row [{p.row_start}, {p.row_end}) {p.shard_name} sample {p.sample} "
                         f"{p.file}:{p.line} doc [{p.doc_start}, {p.doc_end})")  # fmt: skip
            if p.text is not None:
                lines.append("    " + json.dumps(p.text, ensure_ascii=False))
    return lines


def mixture_stats(spec: str | Path | MixtureSpec, **store_options: Any) -> dict[str, Any]:
    """Per source its counts (from ``index.json``: shards, samples, tokens, packed
    ``seq_len``, tokenizer) and, per schedule piece, each source's share and the mixture
    rows it takes that source to go through one epoch at its packed ``seq_len``.

    Raises:
        ValueError: a malformed spec, or sources with different tokenizers.
    """
    mix = _spec(spec)
    names = mix.names
    sources = open_sources(mix, **store_options)
    per: dict[str, Any] = {}
    for name, url, src in zip(names, mix.sources.values(), sources, strict=True):
        idx = src.index
        per[name] = {
            "url": url, "shards": len(src.samples), "samples": int(src.samples.sum()),
            "tokens": int(src.tokens.sum()), "seq_len": idx.seq_len if idx else None,
            "tokenizer": idx.tokenizer.get("name") if idx else None,
            "mode": src.mode,
        }  # fmt: skip
    pieces = []
    for step, w in parse_weights(mix.weights, names):
        total = sum(w)
        epoch_rows = {}
        for name, x in zip(names, w, strict=True):
            st = per[name]["seq_len"]
            rows = per[name]["tokens"] // (st + 1) if st else None
            epoch_rows[name] = None if not x or rows is None else rows * total // x
        pieces.append({"step": step, "weights": {n: x / total for n, x in zip(names, w,
                                                                             strict=True)},
                       "mixture_rows_per_source_epoch": epoch_rows})  # fmt: skip
    return {"sources": per, "schedule": pieces, "stop": mix.stop}


def mixture_stats_lines(stats: dict[str, Any]) -> list[str]:
    """``wdstream stats SPEC``'s output."""
    lines = [f"mixture of {count(len(stats['sources']), 'source')}, stop rule "
             f"{stats['stop'] or 'none (forever)'}"]  # fmt: skip
    for name, s in stats["sources"].items():
        lines.append(
            f"  {name}: {s['url']}: {count(s['shards'], 'shard')}, "
            f"{count(s['samples'], 'sample')}, {count(s['tokens'], 'token')} "
            f"({s['tokenizer']}, mode {s['mode']}, seq_len {s['seq_len']})"
        )
    for piece in stats["schedule"]:
        shares = ", ".join(
            f"{n} {w:.4g} ({_epoch_rows(piece['mixture_rows_per_source_epoch'][n])})"
            for n, w in piece["weights"].items()
        )
        lines.append(f"from step {piece['step']}: {shares}")
    return lines


def _epoch_rows(rows: int | None) -> str:
    return "never read" if rows is None else f"an epoch per {rows:,} mixture rows"
