"""The CLI's messages in a real process: one ``Error:`` line (``--debug``: the traceback),
the advice a read-only HTTP server needs, progress lines off a terminal, the one-shard
warning. Subprocesses, so stderr is not a terminal and a missing package is really missing:
a fresh ``python`` where a package is blocked on its path, else forked from
:mod:`tests.cli_server`'s server (a process of its own, its stderr a file).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cli_server import run_cli
from tests.servers import FileServer

ROOT = Path(__file__).resolve().parents[1]


def _cli(
    *args: str, extra_path: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m wdstream.cli ARGS`` in a process of its own: with ``extra_path`` (a folder
    of modules that shadow installed ones) a fresh one with it first on the path, then this
    checkout; else forked from the CLI server, whose modules are this checkout's."""
    if extra_path is None:
        return run_cli(*args, env=env)
    path = [str(p) for p in (extra_path, ROOT) if p is not None]
    run_env = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "wdstream.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=run_env,
        stdin=subprocess.DEVNULL,
    )


def _without_boto3(tmp_path: Path) -> Path:
    """A folder whose ``boto3`` fails to import as a missing package does."""
    blocker = tmp_path / "blocker" / "boto3"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'boto3'\", name='boto3')\n"
    )
    return blocker.parent


def _jsonl(path: Path, n: int) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"document {i}: the quick brown fox"}) + "\n")
    return path


def test_missing_extra_is_one_error_line(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", 3)
    args = ("pack", str(src), "-o", "s3://bucket/ds/", "--workers", "0")
    proc = _cli(*args, extra_path=_without_boto3(tmp_path))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and proc.stdout == "", proc.stderr
    assert lines[0].startswith("Error: s3:// storage needs boto3")
    assert "pip install 'wdstream[s3]'" in lines[0]
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", 3)
    args = ("--debug", "pack", str(src), "-o", "s3://bucket/ds/", "--workers", "0")
    proc = _cli(*args, extra_path=_without_boto3(tmp_path))
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "ModuleNotFoundError" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("ImportError: s3:// storage")


def test_expected_errors_of_other_commands_are_one_line(tmp_path: Path) -> None:
    """An error caught by a command (no dataset) is one line too, a traceback with --debug."""
    proc = _cli("stats", str(tmp_path / "nothing"))
    assert proc.returncode == 1 and proc.stderr.startswith("Error: ")
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    proc = _cli("--debug", "stats", str(tmp_path / "nothing"))
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_pack_to_a_server_refusing_put_says_what_to_do(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", 3)
    (tmp_path / "root").mkdir()
    with FileServer(tmp_path / "root") as server:
        server.faults.reset(fail_every=1, fail_status=501, methods=("PUT",))
        proc = _cli("pack", str(src), "-o", f"{server.base_url}/ds/", "--workers", "0")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    assert "HTTP 501" in lines[0] and "the server does not accept PUT" in lines[0]
    assert "or write to a local folder or s3://" in lines[0]


def _pack_args(src: Path, out: Path, *more: str) -> tuple[str, ...]:
    return ("pack", str(src), "-o", str(out), "--workers", "0", "--seq-len", "63", *more)


def test_progress_off_a_terminal_is_one_line_at_a_time(tmp_path: Path) -> None:
    """30,000 documents (~1.4 MB) are read in two ~1 MB blocks of lines: a line after each,
    with a period of 0 s, the counts growing; every line says documents, tokens, MB/s and
    shards."""
    src = _jsonl(tmp_path / "in.jsonl", 30_000)
    args = _pack_args(src, tmp_path / "ds", "--shard-size", "64KB", "--progress")
    proc = _cli(*args, env={"WDSTREAM_PROGRESS_SECONDS": "0"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) >= 2 and "\r" not in proc.stderr, proc.stderr
    docs = [int(line.split("): ")[1].split(" documents")[0].replace(",", "")) for line in lines]
    assert docs == sorted(set(docs)), lines
    for line in lines:
        assert line.startswith("pack: ") and " %): " in line, line
        assert "documents, " in line and "tokens, " in line and " MB/s, " in line, line
        assert line.endswith(" shards"), line
    assert "30,000 documents" in lines[-1] and "(100 %)" in lines[-1]
    assert proc.stdout.startswith("packed 30,000 documents")
    assert len(proc.stdout.splitlines()) == 1


def test_progress_from_the_environment_and_its_period(tmp_path: Path) -> None:
    """WDSTREAM_PROGRESS=1 asks for the lines without --progress; a long period prints
    none in a short pack; without either, nothing."""
    src = _jsonl(tmp_path / "in.jsonl", 20_000)
    args = _pack_args(src, tmp_path / "a", "--shard-size", "64KB")
    proc = _cli(*args, env={"WDSTREAM_PROGRESS": "1", "WDSTREAM_PROGRESS_SECONDS": "0"})
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and lines and "(100 %)" in lines[-1], proc.stderr
    args = _pack_args(src, tmp_path / "b", "--shard-size", "64KB")
    proc = _cli(*args, env={"WDSTREAM_PROGRESS": "1", "WDSTREAM_PROGRESS_SECONDS": "600"})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    proc = _cli(*_pack_args(src, tmp_path / "c", "--shard-size", "64KB"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    args = _pack_args(src, tmp_path / "d", "--shard-size", "64KB", "--progress", "--quiet")
    proc = _cli(*args, env={"WDSTREAM_PROGRESS_SECONDS": "0"})
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == "", proc.stderr


def test_one_shard_is_warned_about(tmp_path: Path) -> None:
    src = _jsonl(tmp_path / "in.jsonl", 50)
    proc = _cli(*_pack_args(src, tmp_path / "one"))
    assert proc.returncode == 0 and "into 1 shard " in proc.stdout, proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Warning: the dataset is 1 shard"), lines
    assert "--shard-size" in lines[0] and "split_by_node" in lines[0]
    proc = _cli(*_pack_args(src, tmp_path / "two", "--shard-size", "2KB"))
    assert proc.returncode == 0 and "into 1 shard " not in proc.stdout, proc.stdout
    assert proc.stderr == ""
