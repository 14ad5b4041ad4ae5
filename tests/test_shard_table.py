"""The shard table (``index.shards``) beside ``index.json``: format, old datasets, one fetch.

Oracles outside the code under test: the table's bytes parsed here with ``struct`` as
docs/FORMAT.md describes them, against index.json's list parsed by ``json``; the batches of
the same dataset opened without its table (as packed by the previous version); the GETs a
counting HTTP server saw.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdstream
from tests.processes import start_rank_server, start_ranks
from tools.scale import serve_counting
from wdstream.inspect import verify_dataset
from wdstream.testing import write_synthetic_dataset

SAMPLE_TOKENS = 17
OPTS: dict[str, Any] = dict(seq_len=SAMPLE_TOKENS - 1, batch_size=4, num_workers=0, seed=3, epochs=1,
                            shuffle_window=16)  # fmt: skip


def _dataset(root: Path, shards: int) -> None:
    write_synthetic_dataset(str(root), doc_lens=[SAMPLE_TOKENS * 2] * shards,
                            sample_tokens=SAMPLE_TOKENS, samples_per_shard=2)  # fmt: skip


def _parse(raw: bytes) -> list[dict[str, Any]]:
    """docs/FORMAT.md's layout, read with struct alone."""
    magic, version, flags, n, prefix_len, _crc, names_len = struct.unpack_from("<8sIIQIIQ", raw)
    assert (magic, version, names_len) == (b"WDSHARDS", 1, 0) and flags & 2 == 0
    at = 64
    prefix = raw[at : at + prefix_len].decode()
    at += prefix_len + (-prefix_len % 8)
    cols: dict[str, Any] = {}
    for key in ("samples", "tokens", "documents", "bytes"):
        cols[key] = struct.unpack_from(f"<{n}Q", raw, at)
        at += 8 * n
    hashes = ["sha256", "sidecar_sha256"] + (["provenance_sha256"] if flags & 1 else [])
    for key in hashes:
        cols[key] = [raw[at + 32 * i : at + 32 * i + 32].hex() for i in range(n)]
        at += 32 * n
    assert at == len(raw)
    return [
        {
            "name": f"{prefix}-{i:06d}.tar",
            "sidecar": f"{prefix}-{i:06d}.idx",
            **{k: cols[k][i] for k in cols},
        }  # fmt: skip
        for i in range(n)
    ]


def _rows(loader: wdstream.Loader) -> np.ndarray:
    return np.stack([b["input_ids"].numpy() for b in loader])


def _as_before_the_table(root: Path) -> None:
    """index.json as the previous version wrote it: keys sorted, no shard_table; no table."""
    index = json.loads((root / "index.json").read_text())
    del index["shard_table"]
    (root / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    (root / "index.shards").unlink()


def test_the_table_holds_what_index_json_lists(tmp_path: Path) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i} " * (i % 40 + 1)}) + "\n"
                           for i in range(300)))  # fmt: skip
    out = tmp_path / "packed"
    wdstream.pack([str(src)], str(out), seq_len=31, shard_samples=4, workers=0, progress=False)
    index = json.loads((out / "index.json").read_text())
    raw = (out / "index.shards").read_bytes()
    assert index["shard_table"]["bytes"] == len(raw)
    assert list(index)[-1] == "shards"  # a reader of the table parses only the text before it
    assert _parse(raw) == [
        {k: v for k, v in s.items() if k != "provenance"} for s in index["shards"]
    ]


@pytest.mark.parametrize("shards", [6, 400])  # index.json parsed whole / from its head
def test_a_dataset_packed_before_the_table_reads_identically(tmp_path: Path, shards: int) -> None:
    new, old = tmp_path / "new", tmp_path / "old"
    _dataset(new, shards)
    _dataset(old, shards)
    _as_before_the_table(old)
    assert ((new / "index.json").stat().st_size > 64 << 10) == (shards == 400)
    a, b = wdstream.Loader(str(new), **OPTS), wdstream.Loader(str(old), **OPTS)
    assert (_rows(a) == _rows(b)).all()
    a, b = wdstream.Loader(str(new), **OPTS), wdstream.Loader(str(old), **OPTS)
    next(iter(a))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # the same content identity
    assert (_rows(a) == _rows(b)).all()


def test_a_large_index_is_read_from_its_head_and_verify_checks_the_list(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    _dataset(root, 400)
    want = _rows(wdstream.Loader(str(root), **OPTS))
    text = (root / "index.json").read_text()
    assert len(text) > 64 << 10
    (root / "index.json").write_text(text[:-100])  # the list cut short, past the head
    assert (_rows(wdstream.Loader(str(root), **OPTS)) == want).all()  # never parsed
    report = verify_dataset(str(root))
    assert not report.ok and "index.json" in report.problems[0]


def test_an_index_edited_without_its_table_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    _dataset(root, 6)
    saved = (root / "index.json").read_text()
    index = json.loads(saved)
    index["shards"][0], index["shards"][1] = index["shards"][1], index["shards"][0]
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(wdstream.IndexValidationError, match=r"shards\[0\]\.name"):
        wdstream.Loader(str(root), **OPTS)
    (root / "index.json").write_text(saved)
    index = json.loads(saved)
    index["shards"][2]["sha256"] = "0" * 64
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(wdstream.IndexValidationError, match=r"shards\[2\]\.sha256: .*shard table"):
        wdstream.Loader(str(root), **OPTS)
    (root / "index.json").write_text(saved)
    (root / "index.shards").write_bytes(b"x" * 100)
    with pytest.raises(wdstream.IndexValidationError, match="index.shards"):
        wdstream.Loader(str(root), **OPTS)


def _rank(url: str, cache: str, rank: int) -> None:
    """One rank of two on one node (a process of its own): read the whole epoch, so what a
    rank reads is then the same at every start."""
    loader = wdstream.Loader(url, seq_len=16, batch_size=4, num_workers=2, rank=rank, epochs=1,
                             world_size=2, cache_dir=cache)  # fmt: skip
    for _ in loader:
        pass


def test_two_ranks_of_two_workers_fetch_the_table_once_per_node(tmp_path: Path) -> None:
    """The ranks are processes of their own, started together from tests/processes.py's fork
    server (torch and wdstream imported there once, not by each of the four ranks)."""
    start_rank_server()
    root = tmp_path / "ds"
    _dataset(root, 400)
    server, url = serve_counting(str(root))
    try:
        for start in ("first", "second"):
            server.handler.counts.clear()  # type: ignore[attr-defined]
            procs = start_ranks(_rank, [(url, str(tmp_path / "c"), r) for r in range(2)])
            for p in procs:
                p.join(timeout=300)
            assert [p.exitcode for p in procs] == [0, 0]
            counts = server.handler.counts  # type: ignore[attr-defined]
            if start == "first":
                assert counts[("index.shards", "gets")] == 1
                assert counts[("index.shards", "bytes")] == (root / "index.shards").stat().st_size
            else:
                assert counts[("index.shards", "gets")] == 0
                assert counts[(".idx", "gets")] == 0  # sidecars from the node cache
            # index.json: its 64 KiB head a rank, never the list (it is ~180 KB here)
            assert counts[("index.json", "bytes")] <= 2 * (64 << 10)
    finally:
        server.shutdown()
