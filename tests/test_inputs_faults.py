"""Damaged input: truncated compressed files and records Python cannot load.

Each is a clear :class:`InputError` naming the file (and the line, or the decompressed byte
reached), or, for a bad *record* under ``on_error="skip"``, a counted skip with everything
else packed. A truncated file is never a skippable record: ``--on-error skip`` must not turn
a file cut short into a dataset missing its tail.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import zstandard
from click.testing import CliRunner

import wdstream
from wdstream.cli import main
from wdstream.errors import InputError
from wdstream.inputs import DocumentReader, decompressed, expand_inputs
from wdstream.tokenizers import load_tokenizer
from wdstream.write.progress import Progress

N_DOCS = 3000


def _doc(i: int) -> str:
    return f"doc {i:05d}: " + "x" * 50


def _line(i: int) -> bytes:
    return json.dumps({"text": _doc(i)}).encode() + b"\n"


BLOCK = 250 * len(_line(0))  # decompressed bytes per zstd block in _zstd_blocks: whole lines
TRUNCATED = (
    "{path}: truncated {kind} file: the compressed data stops before the end of the stream "
    "(at decompressed byte {reached:,}); the file is incomplete (an interrupted download or copy?)"
)


def _jsonl(n: int = N_DOCS) -> bytes:
    return b"".join(_line(i) for i in range(n))


def _zstd_blocks(data: bytes) -> tuple[bytes, list[int]]:
    """One frame (with checksum) whose blocks each end at a multiple of BLOCK; block ends."""
    comp = zstandard.ZstdCompressor(level=3, write_checksum=True).compressobj()
    out, ends = b"", []
    for i in range(0, len(data), BLOCK):
        out += comp.compress(data[i : i + BLOCK])
        out += comp.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        ends.append(len(out))
    return out + comp.flush(), ends


def _pack(src: Path, out: Path, on_error: str = "raise", **kw: Any) -> wdstream.PackResult:
    return wdstream.pack([str(src)], str(out), on_error=on_error, workers=0, **kw)


def _texts(out: Path) -> list[str]:
    """The packed documents as text (each ends with EOS)."""
    tok = load_tokenizer("cl100k_base", "tiktoken")
    return [tok.decode(ids[:-1].tolist()) for ids in wdstream.documents(str(out))]


def _cli(src: Path, out: Path, *extra: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["pack", str(src), "-o", str(out), "--workers", "0", *extra])
    return res.exit_code, res.output


def _nothing_written(out: Path) -> bool:
    return not out.exists() or not [p for p in out.iterdir() if p.name.endswith((".tar", ".json"))]


# ---- truncated zstd -------------------------------------------------------------------------

ZSTD_CUTS = {
    # name: (compressed bytes kept, given the block ends and the size; decompressed bytes reached)
    "at the 1st block end": (lambda ends, size: ends[0], BLOCK),
    "at the 5th block end": (lambda ends, size: ends[4], 5 * BLOCK),
    "inside the 2nd block": (lambda ends, size: ends[0] + 100, BLOCK),
    "inside the frame header": (lambda ends, size: 3, 0),
    "inside the checksum": (lambda ends, size: size - 2, len(_jsonl())),
}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("cut", sorted(ZSTD_CUTS))
def test_truncated_zstd_is_an_input_error(tmp_path: Path, cut: str, on_error: str) -> None:
    data = _jsonl()
    comp, ends = _zstd_blocks(data)
    keep_of, reached = ZSTD_CUTS[cut]
    keep = keep_of(ends, len(comp))
    src = tmp_path / "in.jsonl.zst"
    src.write_bytes(comp[:keep])
    if cut.startswith("at the"):
        # The cut leaves whole lines that zstandard's stream_reader reads without complaint:
        # without the frame check this packed part of the file and exited 0.
        prefix = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(comp[:keep])).read()
        assert prefix == data[:reached] and prefix.endswith(b"\n")
    expected = TRUNCATED.format(path=src, kind="zstd", reached=reached)
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        _pack(src, out, on_error)
    assert str(info.value) == expected
    assert _nothing_written(out)


@pytest.mark.parametrize("skip", [False, True])
def test_truncated_zstd_through_the_cli(tmp_path: Path, skip: bool) -> None:
    comp, ends = _zstd_blocks(_jsonl())
    src = tmp_path / "in.jsonl.zst"
    src.write_bytes(comp[: ends[2]])
    code, output = _cli(src, tmp_path / "out", *(["--on-error", "skip"] if skip else []))
    assert code == 1
    assert TRUNCATED.format(path=src, kind="zstd", reached=3 * BLOCK) in output
    assert "Traceback" not in output and "skipped" not in output


def test_whole_text_file_truncated(tmp_path: Path) -> None:
    comp, ends = _zstd_blocks(b"word " * 20_000)
    src = tmp_path / "doc.txt.zst"
    src.write_bytes(comp[: ends[1]])
    with pytest.raises(InputError) as info:
        _pack(src, tmp_path / "out")
    assert str(info.value) == TRUNCATED.format(path=src, kind="zstd", reached=2 * BLOCK)


def test_concatenated_zstd_frames_are_all_read(tmp_path: Path) -> None:
    first, second = _jsonl(5), json.dumps({"text": "in the second frame"}).encode() + b"\n"
    src = tmp_path / "in.jsonl.zst"
    cctx = zstandard.ZstdCompressor()
    src.write_bytes(cctx.compress(first) + cctx.compress(second))  # like `cat a.zst b.zst`
    out = tmp_path / "out"
    _pack(src, out, mode="docs", seq_len=64)
    texts = _texts(out)
    assert texts == [_doc(i) for i in range(5)] + ["in the second frame"]


def test_corrupt_zstd_names_the_file(tmp_path: Path) -> None:
    comp, ends = _zstd_blocks(_jsonl())
    src = tmp_path / "in.jsonl.zst"
    src.write_bytes(comp[: ends[1] + 10] + b"\xff" * 40 + comp[ends[1] + 50 :])
    with pytest.raises(InputError) as info:
        _pack(src, tmp_path / "out", "skip")
    # The bytes named are the slice of compressed data the decompressor refused: the
    # corruption is found at or after the damaged bytes, never before them.
    found = re.fullmatch(
        rf"{re.escape(str(src))}: read failed \(corrupt zstd data in compressed bytes "
        r"([\d,]+)-([\d,]+): zstd decompressor error: Data corruption detected\)",
        str(info.value),
    )
    assert found is not None, str(info.value)
    start, end = (int(g.replace(",", "")) for g in found.groups())
    assert start < end <= len(comp) and end > ends[1] + 10


@pytest.mark.parametrize("name", ["a.jsonl.zst", "a.jsonl.gz", "a.tgz"])
def test_decompressed_raises_eof_where_the_data_stops(name: str) -> None:
    data = _jsonl()
    if name.endswith(".zst"):
        comp = zstandard.ZstdCompressor(write_checksum=True).compress(data)
    else:
        comp = gzip.compress(data)
    assert decompressed(io.BytesIO(comp), name).read() == data
    stream = decompressed(io.BytesIO(comp[:-2]), name)  # all the data, the end marker cut
    with pytest.raises(EOFError):
        stream.read()
    assert stream.tell() == len(data)


# ---- truncated gzip -------------------------------------------------------------------------


def _gzip_cuts(size: int) -> dict[str, int]:
    return {"in the header": 5, "mid-stream": size // 2, "before the trailer": size - 8}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("cut", sorted(_gzip_cuts(100)))
def test_truncated_gzip_is_an_input_error(tmp_path: Path, cut: str, on_error: str) -> None:
    comp = gzip.compress(_jsonl())
    keep = _gzip_cuts(len(comp))[cut]
    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(comp[:keep])
    # What the prefix decompresses to, independently of gzip.GzipFile.
    reached = len(zlib.decompressobj(wbits=31).decompress(comp[:keep])) if keep > 10 else 0
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        _pack(src, out, on_error)
    assert str(info.value) == TRUNCATED.format(path=src, kind="gzip", reached=reached)
    assert _nothing_written(out)


def test_truncated_gzip_through_the_cli_with_skip(tmp_path: Path) -> None:
    data = _jsonl()
    comp = gzip.compress(data)
    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(comp[:-4])  # only the length field of the trailer is missing
    code, output = _cli(src, tmp_path / "out", "--on-error", "skip")
    assert code == 1
    assert TRUNCATED.format(path=src, kind="gzip", reached=len(data)) in output


@pytest.mark.parametrize("suffix,kind", [(".jsonl.gz", "gzip"), (".jsonl.zst", "zstd")])
def test_empty_compressed_file_is_an_input_error(tmp_path: Path, suffix: str, kind: str) -> None:
    src = tmp_path / f"in{suffix}"
    src.write_bytes(b"")
    with pytest.raises(InputError) as info:
        _pack(src, tmp_path / "out", "skip")
    assert str(info.value) == f"{src}: empty {kind} file (0 bytes, not even a header)"


# ---- records Python cannot load --------------------------------------------------------------

GOOD = [f"good document {i}" for i in range(3)]
UNLOADABLE = {
    "lone surrogate": (
        '{"text": "x\\ud800y"}',
        "text field 'text' holds a lone surrogate \\ud800 at character 1 (half of a UTF-16 "
        "pair, not text UTF-8 can encode; use errors='replace' / --errors replace to "
        "substitute U+FFFD)",
    ),
    "deep nesting": ("[" * 100_000, "JSON nested too deeply to parse (Python's recursion limit)"),
    "long integer": (
        '{"text": "ok", "n": ' + "7" * 5001 + "}",
        "JSON integer longer than Python's limit of 4,300 digits",
    ),
}


def _with_bad_line(path: Path, bad: str) -> Path:
    lines = [json.dumps({"text": GOOD[0]}), bad, json.dumps({"text": GOOD[1]})]
    lines.append(json.dumps({"text": GOOD[2]}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("case", sorted(UNLOADABLE))
def test_unloadable_record_raises_naming_file_and_line(tmp_path: Path, case: str) -> None:
    line, why = UNLOADABLE[case]
    src = _with_bad_line(tmp_path / "in.jsonl", line)
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        _pack(src, out)
    assert str(info.value) == f"{src}:2: {why}"
    assert _nothing_written(out)


@pytest.mark.parametrize("case", sorted(UNLOADABLE))
def test_unloadable_record_is_skipped_and_counted(tmp_path: Path, case: str) -> None:
    line, why = UNLOADABLE[case]
    src = _with_bad_line(tmp_path / "in.jsonl", line)
    out = tmp_path / "out"
    idx = _pack(src, out, "skip", mode="docs", seq_len=64).index
    assert idx.stats["records_skipped"] == 1
    assert idx.stats["skipped_locations"] == [f"{src}:2: {why}"]
    assert _texts(out) == GOOD
    tok = load_tokenizer("cl100k_base", "tiktoken")
    assert idx.total_tokens == sum(len(tok.encode(t)) + 1 for t in GOOD)  # + EOS each


@pytest.mark.parametrize("case", sorted(UNLOADABLE))
def test_unloadable_record_through_the_cli(tmp_path: Path, case: str) -> None:
    line, why = UNLOADABLE[case]
    src = _with_bad_line(tmp_path / "in.jsonl", line)
    code, output = _cli(src, tmp_path / "out")
    assert code == 1 and f"Error: {src}:2: {why}" in output and "Traceback" not in output
    code, output = _cli(src, tmp_path / "out2", "--on-error", "skip")
    assert code == 0, output
    assert "packed 3 documents" in output and f"skipped {src}:2: {why}" in output


def test_lone_surrogate_replaced_with_errors_replace(tmp_path: Path) -> None:
    src = _with_bad_line(tmp_path / "in.jsonl", '{"text": "x\\udfffy"}')
    out = tmp_path / "out"
    idx = _pack(src, out, errors="replace", mode="docs", seq_len=64).index
    assert idx.stats["records_skipped"] == 0
    assert _texts(out) == [GOOD[0], "x\ufffdy", GOOD[1], GOOD[2]]


def test_surrogate_pairs_and_escaped_backslashes_are_text(tmp_path: Path) -> None:
    pair = json.dumps({"text": "smile \U0001f600"})  # json.dumps writes \ud83d\ude00
    literal = json.dumps({"text": "a literal \\ud800"})  # backslash, then "ud800"
    assert "\\ud83d\\ude00" in pair and "\\\\ud800" in literal
    src = tmp_path / "in.jsonl"
    src.write_text(pair + "\n" + literal + "\n", encoding="utf-8")
    out = tmp_path / "out"
    _pack(src, out, mode="docs", seq_len=64)
    assert _texts(out) == ["smile \U0001f600", "a literal \\ud800"]


# ---- progress: bytes as stored, against their total --------------------------------------------


def test_source_bytes_count_compressed_bytes_up_to_the_total(tmp_path: Path) -> None:
    data = _jsonl()
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.jsonl").write_bytes(data)
    files = expand_inputs([str(tmp_path / "*")])
    reader = DocumentReader(files)
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert reader.source_total == total
    seen = [reader.source_bytes for _ in reader]
    assert len(seen) == 3 * N_DOCS
    assert seen == sorted(seen) and 0 < seen[0] and seen[-1] <= total
    assert reader.source_bytes == total and reader.input_bytes == 3 * len(data)


def test_stdin_has_no_total() -> None:
    reader = DocumentReader(expand_inputs(["-"]))
    assert reader.source_total is None


def test_progress_bar_shows_percentage_and_eta(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the bar is for a terminal
    bar = Progress(True, total=4_000_000)
    bar.update(1_000_000, docs=10, tokens=100)
    bar.update(2_000_000, docs=10, tokens=100)
    bar.close()
    err = capsys.readouterr().err
    assert "50%|" in err and "| 2.00M/4.00M [00:00<00:00," in err  # [elapsed<remaining ETA
    Progress(False, total=10).update(5, 1, 1)  # disabled: nothing at all
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("compress", ["zstd", "gzip"])
def test_raw_text_loader_refuses_a_truncated_file(tmp_path: Path, compress: str) -> None:
    # The on-the-fly reader shares ``decompressed``: a file cut at a block boundary is an
    # error naming it, not an epoch that silently ends early.
    data = _jsonl(600)
    if compress == "zstd":
        comp, ends = _zstd_blocks(data)
        src, cut = tmp_path / "in.jsonl.zst", ends[0]
    else:
        comp = gzip.compress(data)
        src, cut = tmp_path / "in.jsonl.gz", len(comp) - 8
    src.write_bytes(comp[:cut])
    loader = wdstream.Loader(str(src), tokenizer="cl100k_base", seq_len=16, batch_size=2,
                             num_workers=0, shuffle=False, epochs=1)  # fmt: skip
    with pytest.raises(InputError, match=rf"{src.name}: read failed"):
        list(loader)
