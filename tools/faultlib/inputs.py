"""Hostile pack inputs: truncated .zst, bad JSON records, special files, record bombs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import zstandard

from faultlib.common import Attempt, corpus_lines, run_cli
from wdstream.read.sources.shards import read_index
from wdstream.storage import open_store


def truncated_zst(work: Path, scale: float) -> Iterator[Attempt]:
    text = ("\n".join(corpus_lines()) + "\n").encode()
    cctx = zstandard.ZstdCompressor(level=3)
    co = cctx.compressobj()
    blob = (
        b"".join(
            co.compress(text[i : i + 4096]) + co.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
            for i in range(0, len(text), 4096)
        )
        + co.flush()
    )
    rng = np.random.default_rng(3)
    cuts = sorted({int(c) for c in rng.integers(16, len(blob) - 1, size=max(2, int(20 * scale)))})
    for i, cut in enumerate(cuts):
        src = work / f"trunc-{i}.jsonl.zst"
        src.write_bytes(blob[:cut])
        for skip in (False, True):
            out = work / f"trunc-out-{i}-{int(skip)}"
            args = ["pack", str(src), "-o", str(out), "--seq-len", "63", "--workers", "0", "-q"]
            args += ["--on-error", "skip"] if skip else []

            def attempt(args: list[str] = args) -> str:
                return run_cli(args, timeout=120)

            yield attempt


def bad_records(work: Path, scale: float) -> Iterator[Attempt]:
    good = corpus_lines(20)
    bad = {
        "lone surrogate": '{"text": "x\\ud800y"}',
        "100k nested [": "[" * 100_000,
        "5001-digit integer": '{"text": "a", "n": ' + "9" * 5001 + "}",
        "not JSON": "{text: nope",
        "no text field": '{"body": "x"}',
    }
    for label, line in bad.items():
        src = work / f"bad-{len(label)}-{abs(hash(label)) % 997}.jsonl"
        src.write_text("\n".join(good[:10] + [line] + good[10:]) + "\n")
        out = work / f"bad-out-{src.stem}"

        def strict(src: Path = src, out: Path = out) -> str:
            return run_cli(["pack", str(src), "-o", str(out), "--workers", "0", "-q"], 120)

        def skipping(src: Path = src, out: Path = out) -> str:
            out2 = Path(str(out) + "-skip")

            def ok() -> bool:
                stats = read_index(open_store(str(out2))).stats
                return stats["records_skipped"] == 1 and stats["documents"] == 20

            args = ["pack", str(src), "-o", str(out2), "--workers", "0", "-q", "--on-error", "skip"]
            return run_cli(args, 120, ok)

        yield strict
        yield skipping


def special_inputs(work: Path, scale: float) -> Iterator[Attempt]:
    """A FIFO (named, in a folder, matched by a glob), /dev/zero and a socket as pack inputs:
    each must be refused naming it, before any work, not block or fill memory."""
    import socket

    d = work / "special-in"
    d.mkdir()
    (d / "a.jsonl").write_text("\n".join(corpus_lines(20)) + "\n")
    os.mkfifo(d / "b.jsonl")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(work / "special.jsonl"))
    given = [
        [str(d / "a.jsonl"), str(d / "b.jsonl")],
        [str(d)],
        [str(d / "*.jsonl")],
        [str(d / "a.jsonl"), "/dev/zero"],
        [str(work / "special.jsonl")],
    ]
    for i, inputs in enumerate(given):
        out = work / f"special-out-{i}"

        def attempt(inputs: list[str] = inputs, out: Path = out) -> str:
            return run_cli(["pack", *inputs, "-o", str(out), "--workers", "0", "-q"], 60)

        yield attempt


def record_bombs(work: Path, scale: float) -> Iterator[Attempt]:
    """One line of 64 MiB in a few KB of .zst/.gz (and plain, and a whole .txt) under a
    1 MiB --max-record-bytes: refused naming file and line, or skipped and counted."""
    import gzip

    good = [ln.encode() + b"\n" for ln in corpus_lines(20)]
    long_line = b'{"text": "' + b"z" * (64 << 20) + b'"}\n'
    comp = zstandard.ZstdCompressor(level=3)
    blobs = {
        "bomb.jsonl.zst": lambda data: comp.compress(data),
        "bomb.jsonl.gz": lambda data: gzip.compress(data, compresslevel=1),
        "bomb.jsonl": lambda data: data,
        "bomb.txt.zst": lambda data: comp.compress(data),
    }
    for name, encode in blobs.items():
        src = work / name
        src.write_bytes(encode(b"".join(good[:10]) + long_line + b"".join(good[10:])))
        for skip in (False, True):
            out = work / f"bomb-out-{name}-{int(skip)}"
            args = ["pack", str(src), "-o", str(out), "--workers", "0", "-q"]
            args += ["--max-record-bytes", "1MiB"] + (["--on-error", "skip"] if skip else [])
            whole_txt = name.endswith(".txt.zst")

            def ok(out: Path = out) -> bool:
                stats = read_index(open_store(str(out))).stats
                return stats["records_skipped"] == 1 and stats["documents"] == 20

            def attempt(args: list[str] = args, skip: bool = skip, whole: bool = whole_txt) -> str:
                if skip and whole:  # the only document skipped: nothing to pack, a clear error
                    return run_cli(args, 120)
                return run_cli(args, 120, ok if skip else None)

            yield attempt
