"""What ``wdstream explain`` prints of an :class:`~wdstream.read.provenance.Explanation`:
its text lines and its ``--format jsonl`` records (moved from ``read/provenance.py``, which
re-exports them)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from wdstream.words import count

if TYPE_CHECKING:
    from wdstream.read.provenance import Explanation, RowPiece

__all__ = ["explanation_lines", "explanation_records", "piece_line", "piece_record"]


def piece_line(p: RowPiece) -> str:
    """One piece as ``explain`` prints it: spans, shard, sample, ``file:line`` (as given to
    pack, then the path it resolves to if that differs), and in a chat dataset its turns."""
    where = f" ({p.path})" if p.path is not None and p.path != p.file else ""
    return (
        f"  row [{p.row_start}, {p.row_end}) {p.shard_name} sample {p.sample} "
        f"{p.file}:{p.line}{where} doc [{p.doc_start}, {p.doc_end})"
        + ("" if p.turns is None else f" {p.turns.describe()}")
    )


def explanation_lines(exp: Explanation) -> list[str]:
    """``wdstream explain``'s output: a header, then per row its rank and one line per piece
    (``[start, end)`` token spans; text, when decoded, as a JSON string on the next line)."""
    o, a, b = exp.origin, exp.rows[0].epoch_row, exp.rows[-1].epoch_row
    data = f" (data step {exp.data_step})" if exp.data_step != exp.step else ""
    lines = [
        f"step {exp.step}{data}: epoch {exp.epoch}, {f'rows {a}-{b}' if b > a else f'row {a}'} of the "
        f"epoch; global batch {len(exp.rows)} = {count(exp.world_size, 'rank')} x "
        f"{exp.batch_size}; seq_len {exp.seq_len}, seed {exp.seed}"
        + (f"; steps counted from step {o.step} = epoch {o.epoch} row {o.row}" if o.step else "")
    ]
    for row in exp.rows:
        lines.append(f"row {row.row}: rank {row.rank} row {row.rank_row}")
        for p in row.pieces:
            lines.append(piece_line(p))
            if p.text is not None:
                lines.append("    " + json.dumps(p.text, ensure_ascii=False))
    return lines


def piece_record(p: RowPiece) -> dict[str, Any]:
    """One piece as ``explain --format jsonl`` writes it: the shard (name and number in
    ``index.json``), sample, dataset-wide document number, input ``file`` (as given to
    pack) and 1-based ``line``, ``path`` (where the file lies: :meth:`Provenance.path`;
    null when not known), and ``[start, end)`` token spans in the row (``span``) and in the document
    (``doc_span``); ``text`` when decoded; ``turns`` in a chat dataset
    (:meth:`~wdstream.read.chat_turns.Turns.record`)."""
    record: dict[str, Any] = {
        "shard": p.shard_name, "shard_index": p.shard, "sample": p.sample,
        "document": p.document, "file": p.file, "line": p.line, "path": p.path,
        "span": [p.row_start, p.row_end], "doc_span": [p.doc_start, p.doc_end],
    }  # fmt: skip
    if p.text is not None:
        record["text"] = p.text
    if p.turns is not None:
        record["turns"] = p.turns.record()
    return record


def explanation_records(exp: Explanation) -> list[dict[str, Any]]:
    """``wdstream explain --format jsonl``'s records of one step, one per row: training
    ``step``, ``data_step``, ``row`` of the global step, the ``rank`` it goes to and its
    ``rank_row`` there, ``epoch`` and ``epoch_row``, and its ``pieces``
    (:func:`piece_record`), for joining with a loss log on ``step`` (and ``rank``)."""
    return [
        {"step": exp.step, "data_step": exp.data_step, "row": row.row, "rank": row.rank,
         "rank_row": row.rank_row, "epoch": exp.epoch, "epoch_row": row.epoch_row,
         "pieces": [piece_record(p) for p in row.pieces]}
        for row in exp.rows
    ]  # fmt: skip
