"""Bad input: a clear error naming file and position, and nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import wdstream
from wdstream.errors import InputError


def _write(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


GOOD = json.dumps({"text": "a good document"})
BAD_CASES = {
    "malformed": ('{"text": "unterminated', "malformed JSON"),
    "missing": (json.dumps({"body": "no text key"}), "no text field 'text'"),
    "not_string": (json.dumps({"text": 42}), "is int, not a string"),
    "not_object": (json.dumps(["text"]), "no text field"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_record_raises_with_file_and_line(tmp_path: Path, case: str) -> None:
    line, why = BAD_CASES[case]
    src = _write(tmp_path / "in.jsonl", [GOOD] * 300 + [line] + [GOOD] * 5)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=rf"in\.jsonl:301: .*{why}"):
        wdstream.pack([str(src)], str(out), seq_len=7, shard_size="2KB", workers=0)
    assert not (out / "index.json").exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".partial")]


def test_skip_bad_records_counts_and_locates(tmp_path: Path) -> None:
    lines = [
        GOOD,
        BAD_CASES["malformed"][0],
        GOOD,
        BAD_CASES["missing"][0],
        "",
        BAD_CASES["not_string"][0],
        GOOD,
    ]
    src = _write(tmp_path / "in.jsonl", lines)
    idx = wdstream.pack([str(src)], str(tmp_path / "out"), on_error="skip", workers=0).index
    assert idx.stats["records_skipped"] == 3
    locs = idx.stats["skipped_locations"]
    assert [loc.split(": ")[0].rsplit(":", 1)[1] for loc in locs] == ["2", "4", "6"]
    assert idx.total_documents == 3


def test_empty_documents_skipped_and_counted(tmp_path: Path) -> None:
    src = _write(
        tmp_path / "in.jsonl", [GOOD, json.dumps({"text": ""}), GOOD, json.dumps({"text": ""})]
    )
    idx = wdstream.pack([str(src)], str(tmp_path / "out"), workers=0).index
    assert idx.stats["empty_documents_skipped"] == 2 and idx.total_documents == 2


def test_invalid_utf8_names_byte_offset(tmp_path: Path) -> None:
    bad = b'{"text": "caf\xe9"}'
    src = _write(tmp_path / "in.jsonl", [GOOD, bad])
    offset = len(GOOD) + 1 + bad.index(b"\xe9")
    with pytest.raises(InputError, match=rf"in\.jsonl: invalid UTF-8 at byte {offset}"):
        wdstream.pack([str(src)], str(tmp_path / "out"), workers=0)
    assert not (tmp_path / "out" / "index.json").exists()
    wdstream.pack([str(src)], str(tmp_path / "out"), errors="replace", workers=0)
    docs = list(wdstream.documents(str(tmp_path / "out")))
    assert len(docs) == 2


def test_missing_input_and_empty_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nope.jsonl"):
        wdstream.pack([str(tmp_path / "nope.jsonl")], str(tmp_path / "out"))
    with pytest.raises(InputError, match="no file matches"):
        wdstream.pack([str(tmp_path / "*.jsonl")], str(tmp_path / "out"))
    src = _write(tmp_path / "in.jsonl", [json.dumps({"text": ""})])
    with pytest.raises(InputError, match="no non-empty documents"):
        wdstream.pack([str(src)], str(tmp_path / "out"), workers=0)


def test_truncated_gzip_is_an_input_error(tmp_path: Path) -> None:
    import gzip

    data = gzip.compress(("\n".join([GOOD] * 2000) + "\n").encode())
    (tmp_path / "in.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"in\.jsonl\.gz"):
        wdstream.pack([str(tmp_path / "in.jsonl.gz")], str(tmp_path / "out"), workers=0)


def test_cli_bad_input_exit_code(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from wdstream.cli import main

    src = _write(tmp_path / "in.jsonl", [GOOD, "{oops"])
    res = CliRunner().invoke(
        main, ["pack", str(src), "-o", str(tmp_path / "out"), "--workers", "0"]
    )
    assert res.exit_code != 0 and "in.jsonl:2" in res.output
    res = CliRunner().invoke(
        main,
        ["pack", str(src), "-o", str(tmp_path / "out"), "--workers", "0", "--on-error", "skip"],
    )
    assert res.exit_code == 0, res.output
    assert "1 bad records skipped" in res.output and "in.jsonl:2" in res.output
