"""Shapes, paths and names every part of the benchmark shares."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH_PY = ROOT / "tools" / "bench.py"
COMMITTED_REPORT = ROOT / "docs" / "BENCHMARKS.md"
DEFAULT_OUTPUT = ROOT / "out" / "BENCHMARKS.md"  # /out/ is gitignored
DEFAULT_RESULTS = ROOT / "out" / "bench-results.json"

SEQ_LEN = 2048
BATCH = 8
SAMPLE = SEQ_LEN + 1  # one training row: input_ids = row[:-1], labels = row[1:]
TOKENS_PER_BATCH = BATCH * SEQ_LEN
EOT = 100257  # cl100k <|endoftext|>
SHARD_BYTES = 8 << 20  # every writer gets ~8 MB shards/chunks, so 2 workers have >= 2 each
WORKERS = (0, 2)


def du(path: str) -> int:
    """Bytes of a file, or of every file under a directory."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
