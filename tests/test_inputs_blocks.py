"""Raw blocks of lines (wdstream/inputs/blocks.py) against the line-by-line reader.

The oracle is :class:`DocumentReader` iterated line by line (``bounded_lines`` and
``text_of``); reading the same files as blocks of any size, parsing each block as a worker
would and settling them in order must give the same documents, positions, counters,
skipped locations and errors.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from wdstream.errors import InputError
from wdstream.inputs import DocumentReader, InputPosition, expand_inputs


def _lines(rng: random.Random, n: int) -> list[bytes]:
    """JSON lines of every kind a reader meets: text, empty text, blank lines, long lines,
    malformed JSON, a missing field, non-ASCII, a lone surrogate, and lines split by \\r."""
    kinds = [
        lambda: json.dumps({"text": "x" * rng.randint(1, 60)}),
        lambda: json.dumps({"text": "é€😀 " * rng.randint(1, 9)}, ensure_ascii=rng.random() < 0.5),
        lambda: json.dumps({"text": ""}),
        lambda: " \t",
        lambda: "",
        lambda: json.dumps({"text": "y" * rng.randint(120, 400)}),
        lambda: '{"text": "unterminated',
        lambda: json.dumps({"body": "no text field"}),
        lambda: '{"text": "\\ud800 lone"}',
        lambda: json.dumps({"text": "a\rb"}),
    ]
    return [rng.choice(kinds)().encode("utf-8") for _ in range(n)]


def _write(path: Path, lines: list[bytes], last_newline: bool, bom: bool) -> None:
    data = b"\n".join(lines) + (b"\n" if last_newline else b"")
    if bom:
        data = b"\xef\xbb\xbf" + data
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def _by_lines(reader: DocumentReader) -> list[tuple[Any, InputPosition]]:
    return list(reader)


def _by_blocks(reader: DocumentReader, block_bytes: int) -> list[tuple[Any, InputPosition]]:
    parser = reader.block_parser()
    assert parser is not None
    out: list[tuple[Any, InputPosition]] = []
    for block in reader.blocks(block_bytes):
        parsed = parser.parse(block)
        positions = reader.settle((block.file, block.record), parsed)
        out.extend(zip(parsed.docs, positions, strict=True))
    reader.finished()
    return out


def _outcome(read: Any, reader: DocumentReader) -> tuple[Any, ...]:
    """What reading gives: documents and counters, or only the error (blocks read ahead)."""
    try:
        docs: Any = read(reader)
    except InputError as exc:
        return ("error", str(exc))
    return docs, reader.empty, reader.bad, reader.input_bytes, reader.bad_locations


@pytest.mark.parametrize("seed", range(12))
def test_blocks_read_what_lines_read(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    paths = []
    for k in range(rng.randint(1, 3)):
        suffix = ".jsonl.gz" if rng.random() < 0.3 else ".jsonl"
        path = tmp_path / f"part-{k}{suffix}"
        _write(path, _lines(rng, rng.randint(0, 40)), rng.random() < 0.7, rng.random() < 0.3)
        paths.append(str(path))
    files = expand_inputs(paths)
    options = dict(
        on_error=rng.choice(["skip", "raise"]),
        errors=rng.choice(["strict", "replace"]),
        max_record_bytes=rng.choice([100, 250, 1 << 20]),
    )
    want = _outcome(_by_lines, DocumentReader(files, **options))
    for block_bytes in (1, 7, 64, 333, 1 << 20):
        got = _outcome(
            functools.partial(_by_blocks, block_bytes=block_bytes), DocumentReader(files, **options)
        )
        assert got == want, (block_bytes, options)
    # Resume at a document in the middle: both continue the same way.
    docs = want[0]
    if want[0] != "error" and len(docs) > 2:
        start = docs[len(docs) // 2][1]
        want = _outcome(_by_lines, DocumentReader(files, start=start, **options))
        got = _outcome(lambda r: _by_blocks(r, 50), DocumentReader(files, start=start, **options))
        assert got == want


@pytest.mark.parametrize("on_error", ["skip", "raise"])
@pytest.mark.parametrize("errors", ["strict", "replace"])
def test_invalid_utf8_and_long_lines_across_blocks(
    tmp_path: Path, on_error: str, errors: str
) -> None:
    path = tmp_path / "a.jsonl"
    long = b'{"text": "' + b"z" * 5000 + b'"}'
    bad = b'{"text": "caf\xe9"}'
    path.write_bytes(b"\n".join([b'{"text": "a"}', long, b'{"text": "b"}', bad, b'{"text": "c"}']))
    files = expand_inputs([str(path)])
    options = dict(on_error=on_error, errors=errors, max_record_bytes=1000)
    want = _outcome(_by_lines, DocumentReader(files, **options))
    for block_bytes in (3, 100, 999, 1001, 4096, 1 << 20):
        got = _outcome(
            functools.partial(_by_blocks, block_bytes=block_bytes), DocumentReader(files, **options)
        )
        assert got == want, block_bytes


def test_text_lines_as_blocks(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"\xef\xbb\xbfone\r\ntwo\n\n   \nthree")
    files = expand_inputs([str(path)])
    want = _outcome(_by_lines, DocumentReader(files, lines=True))
    assert [d for d, _ in want[0]] == ["one", "two", "   ", "three"]
    for block_bytes in (1, 5, 1 << 20):
        got = _outcome(
            functools.partial(_by_blocks, block_bytes=block_bytes),
            DocumentReader(files, lines=True),
        )
        assert got == want


def test_whole_text_files_are_not_read_as_blocks(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one document")
    assert DocumentReader(expand_inputs([str(tmp_path / "a.txt")])).block_parser() is None
