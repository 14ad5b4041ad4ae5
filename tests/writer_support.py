"""Helpers of the Python writer and Arrow input tests: the CLI pack as the oracle, and
comparisons of two dataset folders read with json and msgpack (never wdstream's reader)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
from click.testing import CliRunner

from wdstream.cli import main
from wdstream.format.shard_table import ShardRows


def cli_pack(inputs: list[str], out: Path, *options: str) -> None:
    """``wdstream pack INPUTS -o OUT OPTIONS --quiet`` through click; fails the test on error."""
    res = CliRunner().invoke(main, ["pack", *inputs, "-o", str(out), *options, "--quiet"])
    assert res.exit_code == 0, res.output


def visible(root: Path) -> dict[str, bytes]:
    """Every file of a dataset folder a listing shows (no dot files: lock, journal, partials)."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if not p.name.startswith(".")}


def index_less(raw: bytes, *, stats: tuple[str, ...] = (), prov_sha: bool = False) -> Any:
    """``index.json`` parsed, less the ``stats`` keys named (and the shards' provenance
    hashes when ``prov_sha``)."""
    index = json.loads(raw)
    for key in stats:
        index["stats"].pop(key)
    if prov_sha:
        for shard in index["shards"]:
            shard.pop("provenance_sha256")
        index.pop("shard_table", None)  # it holds them too: compared by table_less
    return index


def table_less(raw: bytes) -> Any:
    """The shard table (``index.shards``) decoded, less its provenance hashes."""
    rows = ShardRows(raw, "index.shards")
    return [{k: v for k, v in r.items() if k != "provenance_sha256"} for r in rows]


def prov_less_names(raw: bytes) -> tuple[Any, list[str]]:
    """A ``.prov`` table decoded with msgpack: the table less its input names, and the names."""
    table = msgpack.unpackb(raw)
    return {k: v for k, v in table.items() if k != "files"}, table["files"]


def assert_same_dataset(
    got: Path,
    want: Path,
    *,
    stats: tuple[str, ...] = (),
    names: dict[str, str] | None = None,
) -> None:
    """Every visible file of ``got`` equals ``want``'s byte for byte, except: index.json may
    differ in the ``stats`` keys named; with ``names`` (got's input name -> want's), the
    provenance tables name the inputs so and are otherwise identical, and index.json's
    provenance hashes are not compared."""
    g, w = visible(got), visible(want)
    assert sorted(g) == sorted(w)
    assert "index.json" in w
    for name, data in w.items():
        if name == "index.json":
            kw: dict[str, Any] = {"stats": stats, "prov_sha": names is not None}
            assert index_less(g[name], **kw) == index_less(data, **kw), name
        elif name == "index.shards" and names is not None:
            assert table_less(g[name]) == table_less(data), name
        elif name.endswith(".prov") and names is not None:
            table, files = prov_less_names(g[name])
            want_table, want_files = prov_less_names(data)
            assert table == want_table, name
            assert [names[f] for f in files] == want_files, name
        else:
            assert g[name] == data, name
