"""Hugging Face ``datasets`` objects as records (``datasets`` is optional: skipped without
it): a ``Dataset`` and an ``IterableDataset`` pack to the bytes of the same rows given as a
plain list of dicts, and the Arrow files ``save_to_disk`` writes (IPC streams) pack through
the CLI to the bytes of the same documents as JSON Lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import wdstream
from tests.conftest import make_corpus
from tests.writer_support import assert_same_dataset, cli_pack

OPTS = {"seq_len": 31, "shard_size": "8KB", "workers": 0}


def test_datasets_objects_pack_as_their_rows(tmp_path: Path) -> None:
    # here, not at collection, which every xdist worker does for every file (~0.8 CPU-s)
    datasets = pytest.importorskip("datasets")
    docs = make_corpus(n_docs=40, seed=9, stdlib_files=0)
    rows = [{"text": t, "id": i} for i, t in enumerate(docs)]
    wdstream.pack_records(rows, str(tmp_path / "list"), source="corpus", **OPTS)
    ds = datasets.Dataset.from_dict({"text": docs, "id": list(range(len(docs)))})
    wdstream.pack_records(ds, str(tmp_path / "dataset"), source="corpus", **OPTS)
    assert_same_dataset(tmp_path / "dataset", tmp_path / "list")
    wdstream.pack_records(ds.to_iterable_dataset(), str(tmp_path / "iterable"), source="corpus",
                          **OPTS)  # fmt: skip
    assert_same_dataset(tmp_path / "iterable", tmp_path / "list")

    ds.save_to_disk(str(tmp_path / "saved"))
    (arrow_file,) = sorted((tmp_path / "saved").glob("*.arrow"))
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    cli = ["--seq-len", "31", "--shard-size", "8KB", "--workers", "0"]
    cli_pack([str(src)], tmp_path / "ref", *cli)
    cli_pack([str(arrow_file)], tmp_path / "saved-pack", *cli)
    assert_same_dataset(tmp_path / "saved-pack", tmp_path / "ref", stats=("input_bytes",),
                        names={str(arrow_file): str(src)})  # fmt: skip
