"""Shard-table formats side by side: the fixed-width table, JSON, Parquet, Arrow IPC.

One fresh process per format opens an N-shard table (the import of the reading library
included, as a reader pays it), sums its tokens column and reads shard N/2's name; prints
the bytes on disk, the seconds, and RSS/USS. Needs pyarrow (the ``[arrow]`` extra).
``docs/FORMAT.md``, "The shard table", quotes a run. Usage::

    python tools/table_formats.py 100000 /tmp/formats
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = ("table", "json", "parquet", "arrow")


def _sha(i: int, key: str) -> str:
    return hashlib.sha256(f"{key}{i}".encode()).hexdigest()


def write_all(n: int, folder: Path) -> None:
    """The same n shard entries as each format."""
    import pyarrow as pa
    import pyarrow.feather as pf
    import pyarrow.parquet as pq

    from wdstream.format.index import ShardEntry
    from wdstream.format.shard_table import build_table

    folder.mkdir(parents=True, exist_ok=True)
    entries = [
        ShardEntry(
            f"data-{i:06d}.tar",
            f"data-{i:06d}.idx",
            8,
            520,
            3,
            9216 + 512 * (i % 3),
            _sha(i, "a"),
            _sha(i, "b"),
            f"data-{i:06d}.prov",
            _sha(i, "c"),
        )  # fmt: skip
        for i in range(n)
    ]
    (folder / "t.shards").write_bytes(build_table(entries))
    rows = [e.__dict__ for e in entries]
    (folder / "t.json").write_text(json.dumps(rows, indent=1))
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, folder / "t.parquet")
    pf.write_feather(table, str(folder / "t.arrow"), compression="uncompressed")


def open_one(n: int, folder: Path, kind: str) -> dict[str, Any]:
    """Open one format, sum the tokens, read one name; time and memory."""
    import psutil

    me = psutil.Process()
    before = me.memory_info().rss
    start = time.perf_counter()
    if kind == "table":
        from wdstream.read.sources.index_open import MappedRows

        path = folder / "t.shards"
        rows = MappedRows(str(path), "t.shards", path.stat().st_size)
        total, name = int(rows.counts["tokens"].sum()), rows.name("name", n // 2)
    elif kind == "json":
        listed = json.loads((folder / "t.json").read_text())
        total, name = sum(r["tokens"] for r in listed), listed[n // 2]["name"]
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if kind == "parquet":
            table = pq.read_table(folder / "t.parquet")
        else:
            table = pa.ipc.open_file(pa.memory_map(str(folder / "t.arrow"))).read_all()
        total, name = int(table["tokens"].to_numpy().sum()), table["name"][n // 2].as_py()
    seconds = time.perf_counter() - start
    suffix = {"table": "shards", "json": "json", "parquet": "parquet", "arrow": "arrow"}[kind]
    return {"kind": kind, "bytes": os.path.getsize(folder / f"t.{suffix}"),
            "open_s": round(seconds, 4),
            "rss_mb": round((me.memory_info().rss - before) / 2**20, 1),
            "uss_mb": round(me.memory_full_info().uss / 2**20, 1), "check": [total, name]}  # fmt: skip


def main() -> None:
    n, folder = int(sys.argv[1]), Path(sys.argv[2])
    if len(sys.argv) > 3:
        print(json.dumps(open_one(n, folder, sys.argv[3])))
        return
    write_all(n, folder)
    for kind in KINDS:
        out = subprocess.run([sys.executable, __file__, str(n), str(folder), kind],
                             capture_output=True, text=True, check=True)  # fmt: skip
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
