"""The Ray engine's piece reader takes the five reader columns of an input position (record,
offset, empty, bad, input bytes) whatever else a position carries (the document rules'
counters and a chat pack's audit came later): reading a piece works, without a cluster."""

from __future__ import annotations

import json
from pathlib import Path

from wdstream.inputs import expand_inputs
from wdstream.ray.pieces import InputPiece, read_piece


def test_read_piece_columns(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)))
    files = expand_inputs([str(src)])
    piece = InputPiece(0, 0, None, True, None, files[0].size or 0)
    texts, docs = read_piece(files, piece, "text", False, "raise", "strict", 1 << 20)
    assert texts == [f"doc {i}" for i in range(5)]
    assert docs.records.tolist() == [0, 1, 2, 3, 4]
    assert docs.input_bytes.tolist() == [0, 18, 36, 54, 72]  # each line is 18 bytes
