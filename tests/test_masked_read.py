"""Reading a dataset packed from masked pre-tokenized records: labels are -100 exactly where
the records' masks (shifted by one: a label is the next token) and the EOS/padding rules say,
ids are the records' ids, at 0 and 2 workers, shuffled, resumed mid-epoch, and mixed with
an unmasked dataset.

The oracle is the JSONL records: a best-fit row's ``input_ids`` are split at EOS (record ids
never hold it) and each document is found by its first id (1000 + the record's number).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import wdstream
from tests.test_masked_pack import MASKED, make_records, write_records
from tests.test_pack import EOT
from wdstream import Loader
from wdstream.testing import assert_resumes_exactly

SEQ = 23


def expected_labels(row: list[int], records: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """``(labels, record numbers)`` of one best-fit row's ``input_ids``, from the records:
    a document's token ``t + 1`` is the label at ``t`` when its mask is 1; its first token
    (nothing in the row predicts it), the EOS and padding never are."""
    labels = [-100] * len(row)
    seen, t = [], 0
    while t < len(row) and row[t] != EOT:
        i = row[t] - 1000
        ids, mask = records[i]["input_ids"], records[i]["loss_mask"]
        assert row[t : t + len(ids)] == ids[: len(row) - t], "ids are the record's"
        for k in range(1, len(ids)):
            if t + k - 1 < len(row) and mask[k]:
                labels[t + k - 1] = ids[k]
        seen.append(i)
        t += len(ids) + 1  # the EOS
    assert all(x == EOT for x in row[t:]), "padding after the last document"
    return labels, seen


def check_batches(batches: list[dict[str, torch.Tensor]], records: list[dict[str, Any]]) -> Counter:
    seen: Counter = Counter()
    for b in batches:
        for ids, labels in zip(b["input_ids"].tolist(), b["labels"].tolist(), strict=True):
            want, docs = expected_labels(ids, records)
            assert labels == want
            seen.update(docs)
    return seen


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("masked")
    records = make_records(400, seed=21, longest=30)
    src = write_records(tmp / "in.jsonl", records)
    wdstream.pack([str(src)], str(tmp / "ds"), mode="bestfit", seq_len=SEQ, shard_samples=20,
                  bestfit_buffer=64, **MASKED)  # fmt: skip
    return str(tmp / "ds"), records


@pytest.mark.parametrize("workers", [0, 2])
def test_labels_follow_the_records_masks(
    masked: tuple[str, list[dict[str, Any]]], workers: int
) -> None:
    root, records = masked
    loader = Loader(root, seq_len=SEQ, batch_size=4, num_workers=workers, epochs=1, seed=3,
                    shuffle=True)  # fmt: skip
    batches = list(loader)
    seen = check_batches(batches, records)
    assert max(seen.values()) == 1  # no document twice in an epoch
    rows = sum(len(b["input_ids"]) for b in batches)
    assert (
        rows
        == wdstream.DatasetIndex.from_json(Path(root, "index.json").read_text()).total_samples
        // 4
        * 4
    )


def test_resume_mid_epoch_gives_the_same_labels(masked: tuple[str, list[dict[str, Any]]]) -> None:
    root, records = masked
    items = assert_resumes_exactly(
        lambda: Loader(root, seq_len=SEQ, batch_size=4, num_workers=2, epochs=1, seed=5),
        steps=12, check_at=[0, 5, 11],
    )  # fmt: skip
    batches = [{k: torch.tensor(v) for k, v in b.items()} for b in items]
    check_batches(batches, records)


def test_a_mixture_gives_each_row_its_own_labels(
    masked: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, records = masked
    plain = [{"input_ids": [5000 + i] + [7] * (i % 9)} for i in range(200)]
    src = write_records(tmp_path / "plain.jsonl", plain)
    other = str(tmp_path / "plain")
    wdstream.pack([str(src)], other, pretokenized=True, mode="bestfit", seq_len=SEQ, workers=0)
    loader = Loader({"chat": root, "text": other}, weights={"chat": 1, "text": 1}, seq_len=SEQ,
                    batch_size=4, num_workers=0, seed=1)  # fmt: skip
    chat_rows = text_rows = 0
    for _, b in zip(range(20), loader, strict=False):
        for ids, labels in zip(b["input_ids"].tolist(), b["labels"].tolist(), strict=True):
            if ids[0] >= 5000:  # pretraining: every target but those after an EOS
                text_rows += 1
                want = [-100 if x == EOT else y for x, y in zip(ids, ids[1:], strict=False)]
                assert labels[:-1] == want
                assert labels[-1] == -100 if ids[-1] == EOT else labels[-1] != -100
            else:
                chat_rows += 1
                assert labels == expected_labels(ids, records)[0]
    assert chat_rows and text_rows


def test_global_batch_at_gives_the_loaders_labels(masked: tuple[str, list[dict[str, Any]]]) -> None:
    """``global_batch_at`` is the Loader's batch of that step: ids without the loss bit,
    -100 where the records' masks and the padding say (it once copied the stored ids)."""
    root, records = masked
    loader = Loader(root, seq_len=SEQ, batch_size=4, num_workers=0, seed=2)
    for step, batch in zip(range(3), loader, strict=False):
        whole = wdstream.global_batch_at(root, step, seq_len=SEQ, global_batch=4, seed=2)
        assert torch.equal(whole["input_ids"], batch["input_ids"])
        assert torch.equal(whole["labels"], batch["labels"])
    check_batches([whole], records)


def test_shard_urls_without_an_index_split_the_loss_bit(
    masked: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Shards read without index.json: nothing says they carry a mask, but no id reaches bit
    31, so the bit is split anyway: ids are the records' ids, and no label carries the bit."""
    root, _ = masked
    urls = sorted(str(p) for p in Path(root).glob("*.tar"))
    for p in Path(root).glob("*.idx"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    for url in urls:
        (tmp_path / Path(url).name).write_bytes(Path(url).read_bytes())
    bare = sorted(str(tmp_path / Path(u).name) for u in urls)
    with_index = Loader(root, seq_len=SEQ, batch_size=4, num_workers=0, seed=2, shuffle=False,
                        mask_doc_ends=False)  # fmt: skip
    without = Loader(bare, seq_len=SEQ, batch_size=4, num_workers=0, seed=2, shuffle=False)
    for _, a, b in zip(range(5), with_index, without, strict=False):
        assert torch.equal(a["input_ids"], b["input_ids"]) and int(b["input_ids"].min()) >= 0
        # without an index no padding rule is known: only the loss bit's -100 differ
        assert ((b["labels"] == a["labels"]) | (a["input_ids"].roll(-1, 1) == EOT)).all()
        assert int(b["labels"].min()) >= -100


def test_mixture_explain_text_decodes_masked_rows(
    masked: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """``explain --text`` of a mixture holding a masked source decodes its ids without the
    bit (it once passed the stored ids to the tokenizer, a KeyError)."""
    from wdstream.read.mixture.inspect import explain_mixture

    root, _ = masked
    spec = tmp_path / "mix.json"
    spec.write_text(json.dumps({"sources": {"chat": root, "more": root},
                                "weights": {"chat": 1, "more": 1}}))  # fmt: skip
    exp = explain_mixture(str(spec), 0, batch_size=4, seq_len=SEQ, text=True)
    texts = [p.text for row in exp.rows for p in (row.pieces or ())]
    assert texts and all(isinstance(t, str) for t in texts)


def test_every_document_dropped_says_why(tmp_path: Path) -> None:
    records = make_records(3, seed=4, longest=30)
    for r in records:
        r["input_ids"], r["loss_mask"] = r["input_ids"] * 3, r["loss_mask"] * 3
    src = write_records(tmp_path / "long.jsonl", records)
    with pytest.raises(wdstream.errors.InputError, match="3 documents longer than a row"):
        wdstream.pack([str(src)], str(tmp_path / "ds"), mode="bestfit", seq_len=8, **MASKED)
