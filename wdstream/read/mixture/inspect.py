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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from wdstream.errors import WdstreamError
from wdstream.read.chat_turns import ChatTurns
from wdstream.read.mixture.reader import MixtureReader
from wdstream.read.mixture.schedule import parse_weights
from wdstream.read.mixture.sources import open_sources
from wdstream.read.mixture.spec import MixtureSpec, read_spec
from wdstream.read.order.global_order import Origin
from wdstream.read.provenance import (
    Provenance,
    RowPiece,
    piece_line,
    piece_record,
    pieces_with_text,
    row_ids,
    row_pieces,
)
from wdstream.read.sources.packed import ShardSource
from wdstream.read.step_query import StepQuery, checked_steps
from wdstream.words import count

__all__ = [
    "MixtureExplanation",
    "MixtureRow",
    "explain_mixture",
    "explain_mixture_steps",
    "mixture_explanation_lines",
    "mixture_explanation_records",
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

    step: int  # the training step asked about
    data_step: int  # the step whose rows it reads: ``step`` unless the state records skips
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
    (:class:`~wdstream.read.step_query.StepQuery`; the rest are store options); ``seq_len``
    defaults to the sources' packed one when they share it. With skips recorded in a
    ``state``, ``step`` is a training step and the data step it maps to is read.

    Raises:
        ValueError: inconsistent sizes, or no ``seq_len`` to default to.
        StateMismatchError: a state of another mixture or configuration.
    """
    return next(explain_mixture_steps(spec, [step], **options))


def explain_mixture_steps(
    spec: str | Path | MixtureSpec, steps: Iterable[int], **options: Any
) -> Iterator[MixtureExplanation]:
    """:func:`explain_mixture` of each of ``steps``, with the sources opened once. Every
    step is checked before this returns; the explanations are made as they are iterated.

    Raises:
        as :func:`explain_mixture`.
    """
    query, store_options = StepQuery.of(options)
    mix = _spec(spec)
    sources = open_sources(mix, **store_options)
    packed = {s.index.seq_len if s.index else None for s in sources}
    cfg, batch_size = query.order_config(packed.pop() if len(packed) == 1 else None)
    reader = MixtureReader(mix, sources, cfg, 0, cfg.global_batch, 1, False)
    state = query.state
    position = reader.position_of(state) if state is not None else reader.start(0)
    mapping = position.data_step if state is not None else None
    pairs = checked_steps(steps, position.origin, cfg.global_batch, mapping)
    tok = None
    if query.text:
        from wdstream.tokenizers import index_tokenizer

        index = next(s.index for s in sources if s.index is not None)
        tok = index_tokenizer(index.tokenizer, index.stats.get("pack_cwd"), query.tokenizer)
    provs: dict[int, Provenance | None] = {}
    chats: dict[int, ChatTurns | None] = {}  # chat sources: the turns of their pieces

    def provenance(i: int) -> Provenance | None:
        if i not in provs:
            try:
                provs[i] = Provenance(sources[i], **store_options)
            except (WdstreamError, ValueError):
                provs[i] = None  # packed without provenance tables, or shard URLs
        return provs[i]

    def explanations() -> Iterator[MixtureExplanation]:
        for step, data in pairs:
            rows = reader.rank_rows(data, 1, position.origin)
            out = []
            for r, (i, epoch, row) in enumerate(reader.locate(rows, position)):
                prov, order = provenance(i), reader.orders[i]
                pieces = row_pieces(prov, order, epoch, row) if prov is not None else None
                if pieces is not None and prov is not None:
                    if i not in chats:
                        chats[i] = ChatTurns.of(prov.index, query.tokenizer)
                    chat = chats[i]
                    if chat is not None:
                        ids = row_ids(order, epoch, row)
                        held = [ids[p.row_start : p.row_end] for p in pieces]
                        pieces = [replace(p, turns=t)
                                  for p, t in zip(pieces, chat.turns(pieces, held), strict=True)]  # fmt: skip
                if pieces is not None and tok is not None:
                    pieces = pieces_with_text(pieces, order, epoch, row, tok)
                out.append(MixtureRow(r, r // batch_size, r % batch_size, mix.names[i], epoch,
                                      row, None if pieces is None else tuple(pieces)))  # fmt: skip
            sched = reader.schedule(position)
            piece = sched.pieces[sched.piece_at(int(rows[0]))]
            total = sum(piece.weights)
            weights = {n: (w, total) for n, w in zip(mix.names, piece.weights, strict=True)}
            yield MixtureExplanation(step, data, cfg.seq_len, cfg.seed, query.world_size,
                                     batch_size, position.origin, weights, tuple(out))  # fmt: skip

    return explanations()


def mixture_explanation_lines(exp: MixtureExplanation) -> list[str]:
    """``wdstream explain SPEC``'s output: a header, then per row its rank and source and
    one line per piece (as ``explanation_lines``)."""
    o = exp.origin
    mix = " ".join(f"{n} {a}/{b}" for n, (a, b) in exp.weights.items())
    data = f" (data step {exp.data_step})" if exp.data_step != exp.step else ""
    lines = [
        f"step {exp.step}{data}: global batch {len(exp.rows)} = {count(exp.world_size, 'rank')} x "
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
            lines.append(piece_line(p))
            if p.text is not None:
                lines.append("    " + json.dumps(p.text, ensure_ascii=False))
    return lines


def mixture_explanation_records(exp: MixtureExplanation) -> list[dict[str, Any]]:
    """``wdstream explain SPEC --format jsonl``'s records of one step, one per row: as
    :func:`~wdstream.read.provenance.explanation_records`, with the row's ``source``, its
    ``source_epoch`` and ``source_row`` in place of ``epoch`` and ``epoch_row``; ``pieces``
    is null for a source packed without provenance tables."""
    return [
        {"step": exp.step, "data_step": exp.data_step, "row": row.row, "rank": row.rank,
         "rank_row": row.rank_row, "source": row.source, "source_epoch": row.source_epoch,
         "source_row": row.source_row,
         "pieces": None if row.pieces is None else [piece_record(p) for p in row.pieces]}
        for row in exp.rows
    ]  # fmt: skip


def mixture_stats(
    spec: str | Path | MixtureSpec, steps: int | None = None, **options: Any
) -> dict[str, Any]:
    """Per source its counts (from ``index.json``: shards, samples, tokens, packed
    ``seq_len``, tokenizer) and, per schedule piece, each source's share and the mixture
    rows it takes that source to go through one epoch at its packed ``seq_len``.

    With ``steps``, also ``run``: the first ``steps`` steps of ``Loader(spec, ...)`` as
    :func:`_run` follows them; ``batch_size`` (rows per rank), ``world_size`` and
    ``seq_len`` among ``options`` say how the Loader reads (as for :func:`explain_mixture`);
    the rest of ``options`` are store options.

    Raises:
        ValueError: a malformed spec, sources with different tokenizers, or with ``steps``
            no ``batch_size`` or ``seq_len`` to go by.
    """
    mix = _spec(spec)
    names = mix.names
    query, store_options = StepQuery.of(options)
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
    run = None if steps is None else _run(mix, sources, query, steps)
    return {"sources": per, "schedule": pieces, "stop": mix.stop, "run": run}


RUN_POINTS = 512  # steps sampled along a run (plus every schedule boundary and the last)


def _run(
    mix: MixtureSpec, sources: list[ShardSource], query: StepQuery, steps: int
) -> dict[str, Any]:
    """The first ``steps`` steps of a run from step 0, as the Loader's own reader counts
    them (:meth:`MixtureReader.progress`) at up to ``RUN_POINTS`` steps from 0 to ``steps``
    (each schedule boundary and its step before included): per source its ``weight`` in
    effect at each step, the ``rows`` it gave before it, ``epochs`` (rows over
    ``rows_per_epoch``, fractional), and ``stop_step``, where the stop rule ends the run
    (None without one)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    packed = {s.index.seq_len if s.index else None for s in sources}
    cfg, _ = query.order_config(packed.pop() if len(packed) == 1 else None)
    reader = MixtureReader(mix, sources, cfg, 0, cfg.global_batch, 1, False)
    start = reader.start(0)
    bounds = [p.step for p in start.pieces if 0 < p.step <= steps]
    at = np.linspace(0, steps, min(steps + 1, RUN_POINTS)).round().astype(np.int64)
    points = sorted({*at.tolist(), *bounds, *(b - 1 for b in bounds), steps})
    seen = [reader.progress(replace(start, step=t)) for t in points]
    per = {
        name: {
            "weight": [p[name]["weight"] for p in seen],
            "rows": [p[name]["rows"] for p in seen],
            "epochs": [p[name]["rows"] / p[name]["rows_per_epoch"] for p in seen],
            "rows_per_epoch": seen[0][name]["rows_per_epoch"],
        }
        for name in mix.names
    }
    stop = reader.stop_step(start) if mix.stop is not None else None
    return {"steps": points, "global_batch": cfg.global_batch, "seq_len": cfg.seq_len,
            "sources": per, "stop_step": stop}  # fmt: skip


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
    run = stats.get("run")
    if run is not None:
        end = run["steps"][-1]
        lines.append(f"after {count(end, 'step')} of {run['global_batch']} rows "
                     f"(seq_len {run['seq_len']}):")  # fmt: skip
        for name, r in run["sources"].items():
            lines.append(f"  {name}: {r['rows'][-1]:,} rows, {r['epochs'][-1]:.3f} epochs "
                         f"({r['rows_per_epoch']:,} rows per epoch)")  # fmt: skip
        if run["stop_step"] is not None:
            lines.append(f"  the stop rule {stats['stop']} ends the run at step "
                         f"{run['stop_step']:,}")  # fmt: skip
    return lines


def _epoch_rows(rows: int | None) -> str:
    return "never read" if rows is None else f"an epoch per {rows:,} mixture rows"
