"""Trust at the edges of a pack's inputs: special files and records too long to hold.

Real files and real processes: FIFOs made with ``os.mkfifo``, ``/dev/zero``, a Unix socket,
compressed bombs (a few KB of ``.zst``/``.gz`` holding one line of many MB), and the CLI
run as a subprocess with a time limit, so a regression fails instead of hanging. Every
outcome is one ``Error:`` line naming the file (and line) or correct data.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

import wdstream
from tests.cli_server import run_cli
from wdstream.errors import InputError
from wdstream.inputs import DocumentReader, expand_inputs
from wdstream.inputs.lines import DEFAULT_MAX_RECORD_BYTES
from wdstream.read.sources.text import TextSource

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 4096  # the small record limit the tests use (a real limit, set small)


def _line(i: int) -> bytes:
    return json.dumps({"text": f"document {i}: " + "y" * 40}).encode() + b"\n"


def _cli(*args: str, timeout: float = 60, stdin: str = os.devnull) -> tuple[int, str]:
    """``wdstream ARGS`` in a child process (this checkout first on the path), reading the
    file ``stdin``: forked from :mod:`tests.cli_server`'s server."""
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = run_cli(*args, timeout=timeout, stdin=stdin, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def _one_error(output: str) -> str:
    """The single ``Error:`` line of a failed command (and no traceback)."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output
    return errors[0]


def _pack_args(inputs: list[str], out: Path, *extra: str) -> list[str]:
    return ["pack", *inputs, "-o", str(out), "--workers", "0", "-q", *extra]


# ---- special files among the inputs -------------------------------------------------------


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.jsonl").write_bytes(b"".join(_line(i) for i in range(50)))
    return d


@pytest.mark.parametrize("where", ["named", "in a folder", "by a glob"])
def test_fifo_among_inputs_is_refused_before_any_work(
    tmp_path: Path, corpus: Path, where: str
) -> None:
    fifo = corpus / "b.jsonl"
    os.mkfifo(fifo)
    given = {
        "named": [str(corpus / "a.jsonl"), str(fifo)],
        "in a folder": [str(corpus)],
        "by a glob": [str(corpus / "*.jsonl")],
    }[where]
    out = tmp_path / "out"
    code, output = _cli(*_pack_args(given, out), timeout=60)
    assert code == 1
    assert _one_error(output) == (
        f"Error: {fifo}: not a regular file but a FIFO (named pipe); inputs must be regular "
        "files (pipe data in through stdin with '-' instead)"
    )
    assert not (out / ".wdstream-pack.json").exists()  # refused before the pack began
    assert not list(out.glob("*.tar")) if out.exists() else True


@pytest.mark.parametrize(
    ("make", "kind"),
    [("dev_zero", "a character device"), ("socket", "a socket")],
)
def test_device_and_socket_inputs_are_refused(
    tmp_path: Path, corpus: Path, make: str, kind: str
) -> None:
    if make == "dev_zero":
        path = "/dev/zero"
    else:
        path = str(tmp_path / "s.jsonl")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
    code, output = _cli(*_pack_args([str(corpus), path], tmp_path / "out"), timeout=60)
    assert code == 1
    assert f"Error: {path}: not a regular file but {kind}" in _one_error(output)


def test_fifo_put_in_place_after_the_check_does_not_block(tmp_path: Path, corpus: Path) -> None:
    """The input is a file when expanded and a FIFO when opened: O_NONBLOCK + fstat refuse it."""
    files = expand_inputs([str(corpus / "a.jsonl")])
    os.unlink(corpus / "a.jsonl")
    os.mkfifo(corpus / "a.jsonl")
    t0 = time.monotonic()
    with pytest.raises(InputError, match="not a regular file but a FIFO"):
        list(DocumentReader(files))
    assert time.monotonic() - t0 < 5


def test_raw_text_reader_refuses_a_fifo(corpus: Path) -> None:
    os.mkfifo(corpus / "b.jsonl")
    with pytest.raises(InputError, match=r"b\.jsonl: not a regular file but a FIFO"):
        TextSource(str(corpus), tokenizer="cl100k_base")


# ---- records longer than the limit --------------------------------------------------------


def _bomb_lines(long_bytes: int) -> bytes:
    """Three good lines, one JSON line of ``long_bytes`` bytes, three more good lines."""
    filler = long_bytes - len(b'{"text": ""}\n')
    long_line = b'{"text": "' + b"z" * filler + b'"}\n'
    return (
        b"".join(_line(i) for i in range(3)) + long_line + b"".join(_line(i) for i in range(3, 6))
    )


def _write(path: Path, data: bytes) -> Path:
    if path.name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    elif path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(data, compresslevel=6))
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", ["bomb.jsonl", "bomb.jsonl.gz", "bomb.jsonl.zst"])
def test_long_line_is_an_error_naming_file_and_line(tmp_path: Path, name: str) -> None:
    src = _write(tmp_path / name, _bomb_lines(1 << 20))  # 1 MiB line, a few KB compressed
    code, output = _cli(*_pack_args([str(src)], tmp_path / "out", "--max-record-bytes", "4096"))
    assert code == 1
    assert _one_error(output) == (
        f"Error: {src}:4: record longer than the limit of 4,096 bytes (max_record_bytes / "
        "--max-record-bytes: raise it for such records, or skip them with on_error='skip' / "
        "--on-error skip)"
    )


@pytest.mark.parametrize("name", ["bomb.jsonl", "bomb.jsonl.gz", "bomb.jsonl.zst"])
def test_long_line_skipped_and_counted(tmp_path: Path, name: str) -> None:
    src = _write(tmp_path / name, _bomb_lines(3 << 20))  # over the 1 MiB chunk: read in parts
    out = tmp_path / "out"
    res = wdstream.pack(
        [str(src)], str(out), workers=0, on_error="skip", max_record_bytes=LIMIT, seq_len=16
    )
    stats = res.index.stats
    assert stats["records_skipped"] == 1
    assert stats["skipped_locations"] == [
        f"{src}:4: record of {3 << 20:,} bytes is longer than the limit of 4,096 bytes "
        "(max_record_bytes / --max-record-bytes: raise it for such records, or skip them "
        "with on_error='skip' / --on-error skip)"
    ]
    assert res.index.total_documents == 6
    assert stats["input_bytes"] == len(_bomb_lines(3 << 20))
    # the same six documents as a pack of the good lines alone
    good = _write(tmp_path / "good.jsonl", b"".join(_line(i) for i in range(6)))
    ref = wdstream.pack([str(good)], str(tmp_path / "ref"), workers=0, seq_len=16)
    assert ref.index.total_tokens == res.index.total_tokens
    tars = sorted(out.glob("*.tar"))
    assert [t.read_bytes() for t in tars] == [
        t.read_bytes() for t in sorted((tmp_path / "ref").glob("*.tar"))
    ]


def test_line_at_the_limit_is_kept(tmp_path: Path) -> None:
    data = _bomb_lines(LIMIT)  # the long line is exactly the limit, newline included
    src = _write(tmp_path / "edge.jsonl", data)
    docs = [t for t, _ in DocumentReader(expand_inputs([str(src)]), max_record_bytes=LIMIT)]
    assert len(docs) == 7
    with pytest.raises(
        InputError, match=r"edge\.jsonl:4: record of 4,096 bytes is longer than the limit of 4,095"
    ):
        list(DocumentReader(expand_inputs([str(src)]), max_record_bytes=LIMIT - 1))


def test_long_line_from_stdin(tmp_path: Path) -> None:
    src = _write(tmp_path / "bomb.jsonl", _bomb_lines(1 << 20))
    code, output = _cli(
        *_pack_args(["-"], tmp_path / "out", "--max-record-bytes", "4KiB"), stdin=str(src)
    )
    assert code == 1
    assert _one_error(output).startswith("Error: <stdin>:4: record longer than the limit of 4,096")


def test_whole_text_document_over_the_limit(tmp_path: Path) -> None:
    src = _write(tmp_path / "book.txt.zst", b"word " * 10_000)
    (tmp_path / "short.txt").write_text("a short one")
    code, output = _cli(*_pack_args([str(src)], tmp_path / "out", "--max-record-bytes", "4096"))
    assert code == 1
    assert _one_error(output).startswith(
        f"Error: {src}:1: record longer than the limit of 4,096 bytes"
    )
    res = wdstream.pack(
        [str(src), str(tmp_path / "short.txt")], str(tmp_path / "o2"), workers=0,
        on_error="skip", max_record_bytes=LIMIT, seq_len=8,
    )  # fmt: skip
    assert res.index.total_documents == 1
    assert res.index.stats["records_skipped"] == 1
    assert res.index.stats["input_bytes"] == 50_000 + len("a short one")


def test_txt_lines_over_the_limit(tmp_path: Path) -> None:
    src = _write(tmp_path / "lines.txt.gz", b"one\n" + b"x" * 100_000 + b"\ntwo\n")
    with pytest.raises(InputError, match=r"lines\.txt\.gz:2: record longer"):
        list(DocumentReader(expand_inputs([str(src)]), lines=True, max_record_bytes=LIMIT))
    reader = DocumentReader(
        expand_inputs([str(src)]), lines=True, on_error="skip", max_record_bytes=LIMIT
    )
    assert [t for t, _ in reader] == ["one", "two"]


def test_raw_text_reader_refuses_a_long_line(tmp_path: Path) -> None:
    src = _write(tmp_path / "bomb.jsonl.zst", _bomb_lines(1 << 20))
    source = TextSource(str(src), tokenizer="cl100k_base", max_record_bytes=LIMIT)
    with pytest.raises(InputError, match=r"bomb\.jsonl\.zst:4: record longer than the limit"):
        list(source.docs(0))
    skipping = TextSource(
        str(src), tokenizer="cl100k_base", on_error="skip", max_record_bytes=LIMIT
    )
    assert len(list(skipping.docs(0))) == 6
    (tmp_path / "big.txt").write_bytes(b"w" * 10_000)
    whole = TextSource(str(tmp_path / "big.txt"), tokenizer="cl100k_base", max_record_bytes=LIMIT)
    with pytest.raises(InputError, match=r"big\.txt:1: record longer than the limit"):
        list(whole.docs(0))


def test_default_limit_refuses_a_small_bomb(tmp_path: Path) -> None:
    """The default limit, through the CLI: a small .zst holding one 1.25 GiB line.

    Nothing past the limit (256 MiB) is held, so the process's peak stays far below the
    line's size: checked below 1 GB (seen here: 0.3-0.7 GB, depending on how the
    decompressor's slices and the line's chunks meet; holding the line would pass 1.3 GB).
    The peak is VmHWM, the high-water mark of this process's own memory: ``ru_maxrss``
    keeps the parent's across the exec (subprocess forks with vfork), so after a long test
    run it read the pytest process's size (1.02 GB seen in a full run).
    """
    src = tmp_path / "bomb.jsonl.zst"
    line = DEFAULT_MAX_RECORD_BYTES + (1 << 30)
    comp = zstandard.ZstdCompressor(level=3).compressobj()
    parts = [comp.compress(b'{"text": "')]
    chunk = b"z" * (1 << 20)
    for _ in range(line >> 20):
        parts.append(comp.compress(chunk))
    parts.append(comp.compress(b'"}\n') + comp.flush())
    src.write_bytes(b"".join(parts))
    assert src.stat().st_size < 100_000
    code = (
        "import sys\n"
        "from wdstream.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:], standalone_mode=True)\n"
        "finally:\n"
        "    status = open('/proc/self/status').read()\n"
        "    peak = status.split('VmHWM:')[1].split()[0]\n"
        "    print(f'peak_kb={peak}', file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code, *_pack_args([str(src)], tmp_path / "out")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    seconds = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    assert _one_error(proc.stderr).startswith(
        f"Error: {src}:1: record longer than the limit of {DEFAULT_MAX_RECORD_BYTES:,} bytes"
    )
    peak_kb = int(proc.stderr.rsplit("peak_kb=", 1)[1].split()[0])
    assert peak_kb < 1_000_000, peak_kb
    assert seconds < 30, seconds  # about 2 s here; generous for a loaded CI host
