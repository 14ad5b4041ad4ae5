"""Bad input: a clear error naming file and position, and nothing half-written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import wdstream
from wdstream.errors import InputError


def _write(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


GOOD = json.dumps({"text": "a good document"})
BAD_CASES = {
    "malformed": (
        '{"text": "unterminated',
        "malformed JSON (a string is not closed before the end of the line)",
    ),
    "control_char": ('{"text": "a\tb"}', "malformed JSON (Invalid control character at column 12)"),
    "extra_data": ('{"text": "a"} x', "malformed JSON (Extra data at column 15)"),
    "incomplete": (
        '{"text": "a"',
        "malformed JSON (Expecting ',' delimiter at the end of the line)",
    ),
    "missing": (
        json.dumps({"body": "no text key", "id": 7}),
        "no text field 'text' (the record has keys 'body', 'id')",
    ),
    "empty_object": ("{}", "no text field 'text' (the record is an empty object)"),
    "not_string": (json.dumps({"text": 42}), "text field 'text' is int, not a string"),
    "not_object": (
        json.dumps(["text"]),
        "no text field 'text' (the record is a JSON array, not an object)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_record_raises_with_file_and_line(tmp_path: Path, case: str) -> None:
    line, why = BAD_CASES[case]
    src = _write(tmp_path / "in.jsonl", [GOOD] * 300 + [line] + [GOOD] * 5)
    out = tmp_path / "out"
    with pytest.raises(InputError) as info:
        wdstream.pack([str(src)], str(out), seq_len=7, shard_size="2KB", workers=0)
    assert str(info.value) == f"{src}:301: {why}"
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
    assert "1 bad record skipped" in res.output and "in.jsonl:2" in res.output


def _first_error(tmp_path: Path, record: object, text_key: str = "text") -> str:
    src = _write(tmp_path / "in.jsonl", [json.dumps(record)])
    with pytest.raises(InputError) as info:
        wdstream.pack([str(src)], str(tmp_path / "out"), text_key=text_key, workers=0)
    return str(info.value).removeprefix(f"{src}:1: ")


def test_missing_text_field_lists_a_few_keys(tmp_path: Path) -> None:
    many = {f"k{i:02d}": i for i in range(20)}
    assert _first_error(tmp_path, many) == (
        "no text field 'text' (the record has 20 keys: 'k00', 'k01', 'k02', 'k03', 'k04', "
        "'k05', 'k06', 'k07' and 12 more)"
    )
    long_key = {"x" * 100: 1}
    assert _first_error(tmp_path, long_key) == (
        f"no text field 'text' (the record has keys '{'x' * 36}...)"
    )


def test_missing_nested_text_field_names_the_parent(tmp_path: Path) -> None:
    record = {"meta": {"lang": "en", "title": "t"}}
    assert _first_error(tmp_path, record, "meta.body") == (
        "no text field 'meta.body' ('meta' has keys 'lang', 'title')"
    )
    assert _first_error(tmp_path, {"meta": 3}, "meta.body") == (
        "no text field 'meta.body' ('meta' is a JSON number, not an object)"
    )


def test_every_record_skipped_is_an_error_saying_why(tmp_path: Path) -> None:
    lines = ["{oops", json.dumps({"body": "x"}), json.dumps({"text": ""}), "[1", "{}"]
    src = _write(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out"
    expected = (
        "nothing to pack: every record was bad or empty (4 bad records skipped with "
        f"on_error='skip', 1 empty); the first: {src}:1: malformed JSON (Expecting property "
        f"name enclosed in double quotes at column 2); {src}:2: no text field 'text' (the "
        "record has keys 'body'); "
        f"{src}:4: malformed JSON (Expecting ',' delimiter at the end of the line)"
    )
    with pytest.raises(InputError) as info:
        wdstream.pack([str(src)], str(out), on_error="skip", workers=0)
    assert str(info.value) == expected
    assert not (out / "index.json").exists()

    from click.testing import CliRunner

    from wdstream.cli import main

    res = CliRunner().invoke(
        main, ["pack", str(src), "-o", str(out), "--workers", "0", "--on-error", "skip"]
    )
    assert res.exit_code == 1 and res.output == f"Error: {expected}\n"


def test_one_bad_record_is_not_a_plural(tmp_path: Path) -> None:
    src = _write(tmp_path / "in.jsonl", ["{oops"])
    expected = (
        f"nothing to pack: every record was bad (1 bad record skipped with on_error='skip'); "
        f"the first: {src}:1: malformed JSON (Expecting property name enclosed in double quotes "
        "at column 2)"
    )
    with pytest.raises(InputError) as info:
        wdstream.pack([str(src)], str(tmp_path / "out"), on_error="skip", workers=0)
    assert str(info.value) == expected


def test_demo_output_escapes_once_and_explains_the_counts(tmp_path: Path) -> None:
    from wdstream.demo import _documents_note, run_demo

    lines: list[str] = []
    run_demo(str(tmp_path), megabytes=0.2, echo=lines.append)
    preview = next(line for line in lines if line.startswith("batch 0, row 0: "))
    assert "\\n" in preview and "\\\\n" not in preview  # a newline shows as \n, not \\n
    assert any(line.startswith("documents: ") for line in lines)
    assert _documents_note(315, 1) == (
        "documents: 314 of 315 files packed: pack skips empty documents, and 1 file was empty "
        "(some stdlib packages have an empty __init__.py); the index counts them in "
        "stats['empty_documents_skipped']"
    )
    assert _documents_note(3, 0) == "documents: one per file, all 3 packed"


def test_script_without_a_main_guard_gets_the_reason(tmp_path: Path) -> None:
    """A script packing at its top level with worker processes: each worker imports the
    script again (Python's forkserver/spawn), so the pool breaks. The pack says why, and
    what to do, instead of multiprocessing's BrokenProcessPool."""
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i} " * 50}) + "\n" for i in range(400)))
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import wdstream\n"
        "from wdstream.write.tokenpool import TokenPool\n"
        "TokenPool.inline_while_starting = False  # the pool encodes even a small input\n"
        f"wdstream.pack([{str(src)!r}], {str(tmp_path / 'out')!r}, workers=2, progress=False)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("wdstream.errors.WdstreamError: a tokenizer worker process died")
    assert "if __name__ == '__main__':" in last
    assert not (tmp_path / "out" / "index.json").exists()
