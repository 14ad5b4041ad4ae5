"""The Python writer and checkpoint states at their edges (issue 33, items 9-11): arguments
that are no path or key, a row length no reader accepts, a text over the record limit, a
mask key that is the ids key, and checkpoint files that are no loader state.

Oracles: ``pack_records`` of the good records alone (decoded with tarfile + msgpack), the
reader's own refusal of the index such a pack would write, and the clean loader's batches.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import wdstream
from tests.edges_support import index_stats, one_error, run_cli, stored_samples
from wdstream.errors import InputError, StateMismatchError
from wdstream.integrations.base import MAX_STATE_DEPTH
from wdstream.testing import write_synthetic_dataset

OPTS = {"seq_len": 31, "workers": 0, "progress": False}
TEXTS = [f"text {i}: " + "lorem ipsum dolor " * (i % 5 + 1) for i in range(30)]


@pytest.mark.parametrize("output", [None, 5, "", b"out"])
def test_an_output_that_is_no_path_is_refused_naming_it(tmp_path: Path, output: object) -> None:
    with pytest.raises(TypeError, match="output must be a dataset root"):
        wdstream.Writer(output, **OPTS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="output must be a dataset root"):
        wdstream.pack_records(TEXTS, output, **OPTS)  # type: ignore[arg-type]


def test_a_path_object_is_an_output(tmp_path: Path) -> None:
    with wdstream.Writer(tmp_path / "a", **OPTS) as w:
        for t in TEXTS:
            w.write(t)
    wdstream.pack_records(TEXTS, str(tmp_path / "b"), **OPTS)
    assert stored_samples(tmp_path / "a") == stored_samples(tmp_path / "b")


@pytest.mark.parametrize(("key", "value"), [("text_key", 5), ("text_key", ""),
                                            ("ids_key", None), ("mask_key", 3)])  # fmt: skip
def test_a_record_key_that_is_no_str_is_refused(tmp_path: Path, key: str, value: object) -> None:
    with pytest.raises(TypeError, match=f"{key} must be a non-empty str"):
        wdstream.Writer(str(tmp_path / "o"), **OPTS, **{key: value})
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("key", "value", "error"), [("source", 5, TypeError),
                                                     ("source", None, TypeError),
                                                     ("queue_size", "x", ValueError),
                                                     ("queue_size", True, ValueError)])  # fmt: skip
def test_a_source_or_queue_size_of_the_wrong_type_is_refused(
    tmp_path: Path, key: str, value: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match=f"{key} must be"):
        wdstream.Writer(str(tmp_path / "o"), **OPTS, **{key: value})
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("seq_len", [2**31 - 1, 2**40, 0, -1])
def test_a_row_length_no_reader_accepts_is_refused_at_construction(
    tmp_path: Path, seq_len: int
) -> None:
    with pytest.raises(ValueError, match=r"seq_len must be in \[1, 2147483646\]"):
        wdstream.Writer(str(tmp_path / "o"), **{**OPTS, "seq_len": seq_len})
    assert not (tmp_path / "o").exists()
    with pytest.raises(TypeError, match="seq_len must be an int"):
        wdstream.Writer(str(tmp_path / "o"), **{**OPTS, "seq_len": 31.0})


def test_the_row_bound_is_the_readers(tmp_path: Path) -> None:
    """The oracle for the bound: the reader's index rules refuse an index.json whose seq_len
    is one past it (rewritten with json), and not for its seq_len at the bound (the shard
    counts, left as packed, are then what it refuses)."""
    wdstream.pack_records(TEXTS, str(tmp_path / "d"), **OPTS)
    index = tmp_path / "d" / "index.json"
    obj = json.loads(index.read_text())
    for seq_len, ok in ((2**31 - 1, False), (2**31 - 2, True)):
        obj.update(seq_len=seq_len, sample_tokens=seq_len + 1)
        index.write_text(json.dumps(obj))
        try:
            wdstream.Loader(str(tmp_path / "d"), seq_len=8, batch_size=1, num_workers=0)
            accepted = True
        except wdstream.WdstreamError as exc:
            accepted = not re.search(r"index\.json: (seq_len|sample_tokens):", str(exc))
        assert accepted == ok, seq_len


def _with_long(text: str) -> list[object]:
    return [*TEXTS[:10], text, *TEXTS[10:]]


@pytest.mark.parametrize("long", ["x" * (3 << 20), "é" * (1 << 20), {"text": "y" * (2 << 20)}])
def test_a_text_over_the_record_limit_is_a_bad_record(tmp_path: Path, long: object) -> None:
    records = _with_long(long)  # type: ignore[arg-type]
    opts = {**OPTS, "max_record_bytes": "1MiB"}
    with pytest.raises(InputError, match=r"<records>:11: record .*longer than the limit"):
        with wdstream.Writer(str(tmp_path / "strict"), **opts) as w:
            for r in records:
                w.write(r)
    assert not (tmp_path / "strict" / "index.json").exists()
    with wdstream.Writer(str(tmp_path / "skip"), on_error="skip", **opts) as w:
        for r in records:
            w.write(r)
    wdstream.pack_records(TEXTS, str(tmp_path / "ref"), **OPTS)
    assert stored_samples(tmp_path / "skip") == stored_samples(tmp_path / "ref")
    assert index_stats(tmp_path / "skip")["records_skipped"] == 1


def test_a_mask_key_that_is_the_ids_key_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "p.jsonl"
    src.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 0, 1]}\n')
    args = ["pack", str(src), "-o", str(tmp_path / "o"), "--pretokenized", "--mode", "docs",
            "--workers", "0", "-q", "--mask-key", "input_ids"]  # fmt: skip
    said = one_error(run_cli(*args))
    assert "mask_key and ids_key are both 'input_ids'" in said
    assert not (tmp_path / "o" / "index.json").exists()
    with pytest.raises(ValueError, match="mask_key and ids_key are both 'ids'"):
        wdstream.Writer(str(tmp_path / "w"), pretokenized=True, ids_key="ids", mask_key="ids",
                        mode="docs", **OPTS)  # fmt: skip


# -- checkpoint states that are no loader state ---------------------------------------------

HOSTILE = {
    "null": b"null",
    "5": b"5",
    "NaN": b"NaN",
    "a list": b"[1, 2]",
    "NaN inside": b'{"step": NaN}',
    "Infinity inside": b'{"step": -Infinity}',
    "not UTF-8": b'{"a": "\xff\xfe"}',
    "not JSON": b"{",
    "60 KB deep": b"[" * 60_000 + b"]" * 60_000,
    "60 KB deep, unclosed": b'{"a": ' + b"[" * 60_000,
    "deep in an object": b'{"config": ' + b'{"a": ' * 40 + b"1" + b"}" * 41,
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("edges") / "ds"
    write_synthetic_dataset(str(root), n_docs=30, sample_tokens=33, samples_per_shard=9)
    return str(root)


# The integrations are imported by the tests that use them (transformers, accelerate,
# torch.distributed.checkpoint: ~4 CPU-s), not at collection, which every xdist worker does.
def _loader(root: str) -> wdstream.Loader:
    return wdstream.Loader(root, seq_len=32, batch_size=2, num_workers=0, seed=3)


@pytest.mark.parametrize("label", list(HOSTILE))
def test_a_hf_checkpoint_state_that_is_no_state_is_refused_naming_the_file(
    tmp_path: Path, label: str
) -> None:
    from wdstream.integrations.hf import LOADER_STATE_FILE, load_loader_state

    (tmp_path / LOADER_STATE_FILE).write_bytes(HOSTILE[label])
    with pytest.raises(StateMismatchError, match=f"{tmp_path / LOADER_STATE_FILE}.*: not a JSON"):
        load_loader_state(str(tmp_path), 0)


@pytest.mark.parametrize("label", list(HOSTILE))
def test_a_dcp_state_that_is_no_state_is_refused(dataset: str, label: str) -> None:
    from wdstream.integrations.dcp import LoaderState

    raw = HOSTILE[label].ljust(130_000)  # space-padded, as LoaderState stores the JSON
    tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    with pytest.raises(StateMismatchError, match=r"LoaderState json(:1)?: not a JSON loader"):
        LoaderState(_loader(dataset), capacity=len(raw)).load_state_dict({"json": tensor})


def test_a_good_state_still_resumes_where_the_clean_run_goes(dataset: str, tmp_path: Path) -> None:
    from wdstream.integrations.dcp import LoaderState
    from wdstream.integrations.hf import LOADER_STATE_FILE, load_loader_state

    clean = _loader(dataset)
    it = iter(clean)
    for _ in range(3):
        next(it)
    state = clean.state_dict()
    want = next(it)["input_ids"]
    assert len(json.dumps(state)) and MAX_STATE_DEPTH >= 8
    (tmp_path / LOADER_STATE_FILE).write_text(json.dumps(state))
    resumed = _loader(dataset)
    resumed.load_state_dict(load_loader_state(str(tmp_path), 0))
    assert torch.equal(next(iter(resumed))["input_ids"], want)
    saver = LoaderState(clean)
    clean2 = _loader(dataset)
    clean2.load_state_dict(state)
    loaded = _loader(dataset)
    LoaderState(loaded).load_state_dict(LoaderState(clean2).state_dict())
    assert torch.equal(next(iter(loaded))["input_ids"], want) and saver.capacity > 0
