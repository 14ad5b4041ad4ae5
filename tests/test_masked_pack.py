"""Packing pre-tokenized records with a loss mask (``--pretokenized --mask-key``).

The oracle is the JSONL records themselves: every stored document must be the record's ids
with bit 31 set exactly where its mask is 0, then the EOS with the bit, whatever the mode;
shards are decoded with tarfile + msgpack (``tests.test_pack.raw_samples``), not wdstream.
"""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import wdstream
from tests.test_pack import EOT, raw_samples
from wdstream import CorruptShardError, InputError, Loader
from wdstream.cli import main
from wdstream.format.wds import wds_decoder
from wdstream.inputs.pretokenized import TokenDocument
from wdstream.inspect import verify_dataset
from wdstream.inspect_stats import dataset_stats
from wdstream.write.builders import sample_builder
from wdstream.write.docrules import DocumentRules
from wdstream.write.encoders import TokenIdsEncoder

BIT = 1 << 31
MASKED = {"pretokenized": True, "mask_key": "loss_mask", "tokenizer": "cl100k_base", "workers": 0}


def make_records(n: int, seed: int, longest: int = 40) -> list[dict[str, Any]]:
    """Records with recognisable ids (the first id is 1000 + the record's number) and random
    masks with at least one supervised token after the first (a document's first token is
    never a target: the pack stores it without loss whatever the mask says)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = rng.randint(2, longest)
        ids = [1000 + i] + [rng.randrange(1, 999) for _ in range(size - 1)]
        mask = [rng.randint(0, 1) for _ in range(size)]
        if not any(mask[1:]):
            mask[rng.randrange(1, size)] = 1
        out.append({"input_ids": ids, "loss_mask": mask if seed % 2 else [bool(m) for m in mask]})
    return out


def write_records(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def stored(record: dict[str, Any]) -> tuple[int, ...]:
    """The oracle: the record's ids with bit 31 where its mask is 0 and on the first id (no
    target: nothing in the document predicts it), then EOS with the bit."""
    ids = [
        i if m and k else i | BIT
        for k, (i, m) in enumerate(zip(record["input_ids"], record["loss_mask"], strict=True))
    ]
    return (*ids, EOT | BIT)


def stored_documents(root: Path, mode: str) -> list[tuple[int, ...]]:
    """Documents rebuilt from the raw samples (pieces joined by ``cont``; best-fit padding
    checked to be EOS with the bit and left out)."""
    docs: list[list[int]] = []
    for s in raw_samples(root):
        tokens, lens = s.tokens.tolist(), list(s.doc_lens)
        if mode == "bestfit":
            pad = lens.pop()
            assert tokens[len(tokens) - pad :] == [EOT | BIT] * pad
        at = 0
        for j, n in enumerate(lens):
            if j == 0 and s.cont:
                docs[-1] += tokens[at : at + n]
            else:
                docs.append(tokens[at : at + n])
            at += n
    return [tuple(d) for d in docs]


@pytest.mark.parametrize("mode", ["concat", "docs", "bestfit"])
def test_every_stored_document_is_its_record_with_the_mask_in_bit_31(
    tmp_path: Path, mode: str
) -> None:
    records = make_records(60, seed=1)
    src = write_records(tmp_path / "in.jsonl", records)
    root = tmp_path / "out"
    result = wdstream.pack([str(src)], str(root), mode=mode, seq_len=24, shard_samples=7, **MASKED)
    index = result.index
    assert (index.loss_mask, index.dtype) == ("bit31", "uint32")
    kept = [r for r in records if mode != "bestfit" or len(r["input_ids"]) + 1 <= 25]
    got = stored_documents(root, mode)
    want = [stored(r) for r in kept]
    if mode == "bestfit":  # rows reorder documents inside a block
        assert Counter(got) == Counter(want)
    else:
        assert got == want
    stats = index.stats
    supervised = sum(sum(map(bool, r["loss_mask"][1:])) for r in kept)  # the first: no target
    assert stats["supervised_tokens"] == supervised
    assert stats["supervised_tokens"] + stats["unsupervised_tokens"] == index.total_tokens
    assert stats["masked_documents"] == len(kept)
    assert stats.get("long_documents_dropped", 0) == len(records) - len(kept)
    assert stats["unsupervised_documents_refused"] == 0
    # The public paths give ids without the bit, and the mask beside them.
    docs = list(wdstream.documents(str(root), with_mask=True))
    assert sorted((tuple(i.tolist()), tuple(m.tolist())) for i, m in docs) == sorted(
        (tuple(r["input_ids"] + [EOT]), (False, *map(bool, r["loss_mask"][1:]), False))
        for r in kept
    )
    audit = dataset_stats(str(root))["loss_mask"]
    assert (audit["supervised_tokens"], audit["index_agrees"]) == (supervised, True)
    assert verify_dataset(str(root)).ok


def test_truncate_keeps_a_row_and_ends_it_with_eos(tmp_path: Path) -> None:
    records = make_records(40, seed=3)
    src = write_records(tmp_path / "in.jsonl", records)
    root = tmp_path / "out"
    index = wdstream.pack(
        [str(src)], str(root), mode="bestfit", seq_len=15, long_docs="truncate",
        allow_unsupervised=True, **MASKED,
    ).index  # fmt: skip
    want = [stored(r)[:15] + (EOT | BIT,) if len(r["input_ids"]) + 1 > 16 else stored(r)
            for r in records]  # fmt: skip
    assert Counter(stored_documents(root, "bestfit")) == Counter(want)
    long = sum(len(r["input_ids"]) + 1 > 16 for r in records)
    assert index.stats["long_documents_truncated"] == long > 0
    assert index.stats["long_documents_dropped"] == 0


def test_plain_pretokenized_is_stored_as_text_packing_stores_it(tmp_path: Path) -> None:
    records = [{"input_ids": r["input_ids"]} for r in make_records(30, seed=5)]
    src = write_records(tmp_path / "in.jsonl", records)
    root = tmp_path / "out"
    index = wdstream.pack([str(src)], str(root), pretokenized=True, workers=0, seq_len=16).index
    assert index.loss_mask is None and "supervised_tokens" not in index.stats
    flat = np.concatenate([s.tokens for s in raw_samples(root)]).tolist()
    assert flat == [t for r in records for t in r["input_ids"] + [EOT]]


def test_bad_records_name_file_and_line_or_are_counted(tmp_path: Path) -> None:
    good = make_records(3, seed=7)
    bad = [
        {"input_ids": [1, 2, 3], "loss_mask": [1, 0]},  # another length
        {"input_ids": [1, 200_000], "loss_mask": [1, 1]},  # id out of cl100k's vocabulary
        {"input_ids": [1, 2], "loss_mask": [0, 0]},  # no supervised token
        {"input_ids": [1, 2.5], "loss_mask": [1, 1]},  # not an integer
        {"input_ids": [1, 2], "loss_mask": [1, 2]},  # not 0/1
        {"input_ids": [1, 2]},  # no mask in a masked pack
        {"input_ids": [1, True], "loss_mask": [1, 1]},  # a JSON boolean among ids
        {"input_ids": [1, 2**64], "loss_mask": [1, 1]},  # past any integer numpy holds
    ]
    src = write_records(tmp_path / "in.jsonl", good + bad)
    messages = [
        "2 entries for 3 ids", "outside the tokenizer's vocabulary", "no token of the document",
        "holds 2.5", "holds 2; expected 0/1", "no mask field 'loss_mask'",
        "mixes the boolean true with integers", "holds 18446744073709551616, an integer outside",
    ]  # fmt: skip
    for line, (record, message) in enumerate(zip(bad, messages, strict=True), start=4):
        one = write_records(tmp_path / f"bad{line}.jsonl", [*good, record])
        with pytest.raises(InputError, match=rf"bad{line}\.jsonl:4: .*{message}"):
            wdstream.pack([str(one)], str(tmp_path / f"o{line}"), mode="docs", **MASKED)
    index = wdstream.pack(
        [str(src)], str(tmp_path / "skip"), mode="docs", on_error="skip", **MASKED
    ).index
    assert index.total_documents == 3
    assert index.stats["records_skipped"] == 7  # refused at read time
    assert index.stats["unsupervised_documents_refused"] == 1  # refused once encoded
    allowed = wdstream.pack(
        [str(src)], str(tmp_path / "allow"), mode="docs", on_error="skip",
        allow_unsupervised=True, **MASKED,
    ).index  # fmt: skip
    assert (allowed.total_documents, allowed.stats["unsupervised_documents_refused"]) == (4, 0)


def test_a_mask_is_never_dropped_silently(tmp_path: Path) -> None:
    src = write_records(tmp_path / "in.jsonl", make_records(2, seed=1))
    with pytest.raises(InputError, match="in.jsonl:1: .*pass --mask-key loss_mask"):
        wdstream.pack([str(src)], str(tmp_path / "o"), pretokenized=True, workers=0)
    with pytest.raises(ValueError, match="engine='ray' packs text only"):
        wdstream.pack([str(src)], str(tmp_path / "r"), engine="ray", **MASKED)
    with pytest.raises(ValueError, match="--mode bestfit"):
        wdstream.pack([str(src)], str(tmp_path / "c"), long_docs="drop", **MASKED)


def test_wds_decoder_gives_the_records_masks(tmp_path: Path) -> None:
    import tarfile

    records = make_records(20, seed=9)
    root = tmp_path / "out"
    wdstream.pack([str(write_records(tmp_path / "in.jsonl", records))], str(root), mode="docs",
                  **MASKED)  # fmt: skip
    with tarfile.open(root / "data-000000.tar") as tf:
        got = [wds_decoder(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]  # type: ignore[union-attr]
    for sample, record in zip(got, records, strict=True):
        assert sample is not None
        assert sample["input_ids"].tolist() == record["input_ids"] + [EOT]
        want = [False] + [bool(m) for m in record["loss_mask"][1:]] + [False]  # first: no target
        assert sample["loss_mask"].tolist() == want


def test_a_flipped_mask_bit_is_a_corrupt_shard(tmp_path: Path) -> None:
    records = make_records(30, seed=11)
    root = tmp_path / "out"
    wdstream.pack([str(write_records(tmp_path / "in.jsonl", records))], str(root),
                  mode="bestfit", seq_len=31, **MASKED)  # fmt: skip
    first = raw_samples(root)[0].tokens.astype("<u4")
    data = bytearray((root / "data-000000.tar").read_bytes())
    at = bytes(data).find(first.tobytes())
    assert at > 0
    k = int(np.flatnonzero(first < BIT)[0])  # a supervised token: give it the no-loss bit
    data[at + 4 * k + 3] ^= 0x80
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    (bad / "data-000000.tar").write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match="data-000000.tar"):
        for _ in Loader(str(bad), seq_len=31, batch_size=2, num_workers=0, epochs=1):
            pass
    assert not verify_dataset(str(bad)).ok


def test_cli_pack_stats_inspect(tmp_path: Path) -> None:
    records = make_records(30, seed=13)
    src = write_records(tmp_path / "in.jsonl", records)
    out = str(tmp_path / "out")
    runner = CliRunner()
    res = runner.invoke(main, ["pack", str(src), "-o", out, "--pretokenized", "--mask-key",
                               "loss_mask", "--mode", "bestfit", "--seq-len", "20",
                               "--workers", "0", "-q"])  # fmt: skip
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["stats", out])
    supervised = sum(sum(r["loss_mask"][1:]) for r in records if len(r["input_ids"]) < 21)
    assert f"loss mask: {supervised:,} supervised tokens" in res.output
    assert "documents longer than a row dropped" in res.output
    res = runner.invoke(main, ["inspect", out, "-n", "1"])
    assert res.exit_code == 0 and "[[" in res.output and "supervised" in res.output
    res = runner.invoke(main, ["pack", str(src), "-o", out + "2", "--mask-key", "m"])
    assert res.exit_code != 0 and "Error: " in res.output and "--pretokenized" in res.output


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 500), st.booleans()), min_size=1, max_size=30),
        min_size=1,
        max_size=25,
    ),
    st.integers(1, 40),
    st.sampled_from(["concat", "docs", "bestfit"]),
    st.sampled_from(["split", "drop", "truncate"]),
)
def test_packing_never_moves_a_mask(
    docs: list[list[tuple[int, bool]]], seq_len: int, mode: str, long_docs: str
) -> None:
    """The pack's own pipeline after reading (encoder, rules, builder): every stored token
    keeps its own mask bit, whatever the mode, row length and long-document rule."""
    encoder = TokenIdsEncoder(None, EOT, "uint32", True)
    S = seq_len + 1
    rules = DocumentRules(S if mode == "bestfit" else None, long_docs, True, True, EOT | BIT,
                          "raise", ["x"])  # fmt: skip
    batch = [TokenDocument(np.array([i for i, _ in d]), np.array([m for _, m in d])) for d in docs]
    encoded = encoder.encode(None, batch)  # type: ignore[arg-type]
    positions = [wdstream.inputs.InputPosition(0, i, 0, 0, 0, 0) for i in range(len(docs))]
    flat, lens, positions = rules.apply(encoded, positions)
    builder = sample_builder(mode, seq_len, 4, None, EOT, np.dtype("uint32"), EOT | BIT)
    samples = [*builder.add(flat, lens, positions), *builder.flush()]
    rebuilt: list[list[int]] = []
    for s in samples:
        pieces = s.doc_lens[:-1] if mode == "bestfit" else s.doc_lens
        at = 0
        for j, n in enumerate(pieces):
            part = s.tokens[at : at + n].tolist()
            if j == 0 and s.cont:
                rebuilt[-1] += part
            else:
                rebuilt.append(part)
            at += n
        assert all(t == EOT | BIT for t in s.tokens[at:].tolist())  # padding: no loss
    want = []
    for d in docs:
        one = [i if m and k else i | BIT for k, (i, m) in enumerate(d)] + [EOT | BIT]
        if mode == "bestfit" and len(one) > S and long_docs == "drop":
            continue
        if mode == "bestfit" and len(one) > S and long_docs == "truncate":
            one = one[: S - 1] + [EOT | BIT]
        want.append(one)
    if mode == "bestfit":
        assert Counter(map(tuple, rebuilt)) == Counter(map(tuple, want))
    else:
        assert rebuilt == want


@pytest.mark.parametrize("mode", ["concat", "bestfit"])
def test_interrupted_masked_pack_resumes_byte_identical(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rules' counters travel in the journal's position: a resumed pack writes the same
    shards and the same index.json (counts included) as an uninterrupted one."""
    from tests.test_pack_resume import _interrupted_writer
    from wdstream.storage.local import LocalStore

    records = make_records(300, seed=15, longest=30)
    records[7]["loss_mask"] = [0] * len(records[7]["loss_mask"])  # refused, counted
    src = write_records(tmp_path / "in.jsonl", records)
    kw: dict[str, Any] = dict(mode=mode, seq_len=19, shard_size="4KB", on_error="skip", **MASKED)
    ref, out = tmp_path / "ref", tmp_path / "out"
    wdstream.pack([str(src)], str(ref), **kw)
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer("data-000004.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(src)], str(out), **kw)
    assert wdstream.pack([str(src)], str(out), **kw).resumed_shards == 4
    files = sorted(p.name for p in ref.iterdir())
    assert files == sorted(p.name for p in out.iterdir())
    for name in files:
        assert (ref / name).read_bytes() == (out / name).read_bytes(), name
    stats = json.loads((out / "index.json").read_text())["stats"]
    assert stats["unsupervised_documents_refused"] == 1
