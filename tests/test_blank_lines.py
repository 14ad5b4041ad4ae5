"""Blank lines cost next to nothing (issue 33, item 12): a 33 KB ``.zst`` of 1 GiB of newlines
ran 1,299 s before its clear error, parsed line by line twice (the tokenizer check's peek
read all of it looking for text, then the pack).

The oracle is the line-by-line :class:`DocumentReader` (``bounded_lines``), against the
block parser taking either path (blank lines sorted out in bulk, or every line parsed):
the same documents, positions, counters, skipped locations and errors. The cost is asserted
by what is done (lines parsed one by one, bytes the peek reads), not by the clock.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pytest
import zstandard

from tests.edges_support import one_error, run_cli
from tests.test_inputs_blocks import _by_blocks, _by_lines, _outcome
from wdstream.inputs import DocumentReader, blocks, expand_inputs
from wdstream.write import sources
from wdstream.write.sources import PackInputs

BLANKS = ["", " ", "\t", "\r", " \t\r", "\x0b", "\x0c", "\x1c\x1f", "\u00a0", "\u3000 ", "\ufeff"]


def _lines(rng: random.Random, n: int, as_text: bool) -> list[bytes]:
    """Mostly blank lines of every whitespace (ASCII, Unicode, a BOM), among records."""
    kinds = [
        lambda: rng.choice(BLANKS) * rng.randint(1, 3),
        lambda: rng.choice(BLANKS) * rng.randint(1, 3),
        lambda: rng.choice(BLANKS),
        lambda: json.dumps({"text": "x" * rng.randint(1, 30)}),
        lambda: json.dumps({"text": ""}),
        lambda: '{"text": "unterminated',
        lambda: " " * rng.randint(90, 140),  # blank, over the smaller record limit
        lambda: "word " * rng.randint(1, 5) if as_text else json.dumps({"text": "é €"}),
    ]
    return [rng.choice(kinds)().encode("utf-8") for _ in range(n)]


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("seed", range(10))
def test_blank_lines_read_as_lines_read_them(
    tmp_path: Path, seed: int, sparse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blocks, "_SPARSE_LINE_BYTES", 1 << 30 if sparse else 0)
    rng = random.Random(seed)
    as_text = seed % 3 == 0
    path = tmp_path / ("a.txt" if as_text else "a.jsonl")
    data = b"\n".join(_lines(rng, rng.randint(1, 300), as_text))
    path.write_bytes(data + (b"\n" if rng.random() < 0.7 else b""))
    files = expand_inputs([str(path)])
    options = dict(
        lines=as_text,
        on_error=rng.choice(["skip", "raise"]),
        errors=rng.choice(["strict", "replace"]),
        max_record_bytes=rng.choice([2, 100, 1 << 20]),
    )
    want = _outcome(_by_lines, DocumentReader(files, **options))
    for block_bytes in (1, 13, 200, 1 << 20):
        got = _outcome(
            functools.partial(_by_blocks, block_bytes=block_bytes), DocumentReader(files, **options)
        )
        assert got == want, (block_bytes, options)


def test_blank_lines_are_not_parsed_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []
    real = blocks.BlockParser._line
    monkeypatch.setattr(
        blocks.BlockParser,
        "_line",
        lambda self, out, k, *a: parsed.append(k) or real(self, out, k, *a),
    )
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n" * 100_000 + b'{"text": "one"}\n' + b" \t\r\n" * 100_000)
    reader = DocumentReader(expand_inputs([str(path)]))
    docs = _by_blocks(reader, 1 << 20)
    assert [d for d, _ in docs] == ["one"] and docs[0][1].record == 100_000
    assert parsed == [100_000]  # the one record; 200,000 blank lines counted in bulk


def test_the_peek_reads_a_bounded_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[int] = []
    real = blocks.read_blocks

    def counted(*args: object, **kw: object):  # type: ignore[no-untyped-def]
        for block in real(*args, **kw):  # type: ignore[arg-type]
            read.append(block.size)
            yield block

    monkeypatch.setattr("wdstream.inputs.records.read_blocks", counted)
    path = tmp_path / "nl.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"\n" * (64 << 20) + b'{"text": "a"}\n'))
    assert PackInputs.from_paths([str(path)]).peek("text", False, 1 << 20) == []
    assert sum(read) <= sources._PEEK_INPUT_BYTES + sources._PEEK_BLOCK_BYTES


def test_a_newline_bomb_fails_with_its_clear_error(tmp_path: Path) -> None:
    bomb = tmp_path / "nl.jsonl.zst"
    with bomb.open("wb") as f, zstandard.ZstdCompressor(level=19).stream_writer(f) as w:
        for _ in range(16):
            w.write(b"\n" * (16 << 20))  # 256 MiB of newlines in a few KB
    assert bomb.stat().st_size < 20_000
    said = one_error(run_cli("pack", str(bomb), "-o", str(tmp_path / "o"), "--workers", "0", "-q"))
    assert said == f"Error: no non-empty documents in {bomb}"
