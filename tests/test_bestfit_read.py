"""Reading ``--mode bestfit`` datasets: one sample is one row, targets -100 exactly on
padding (and document ends when chosen), ``doc_ids``, and the global order's guarantees
(resume, elastic, ``batch_at``) as for concat."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import wdstream
from tests.conftest import make_corpus
from tests.test_pack import EOT, raw_samples
from wdstream.read.batches.rows import IGNORE_INDEX, RowLabels, row_labels
from wdstream.testing import assert_resumes_exactly
from wdstream.write.bestfit import BestFitSampleBuilder

SEQ = 63


def _truth(doc_lens: list[int], S: int, mask_ends: bool) -> tuple[list[bool], list[int]]:
    """From a row's structure: which targets (positions 1..S-1) are -100, and per input
    token (0..S-2) its piece number with -1 on padding."""
    pad = doc_lens[-1]
    masked = [t >= S - pad for t in range(1, S)]
    ids, at = [-1] * S, 0
    for j, n in enumerate(doc_lens[:-1]):
        ids[at : at + n] = [j] * n
        at += n
        if mask_ends and at - 1 < S - 1 and at < S - pad:  # next token: another document
            masked[at - 1] = True
    return masked, ids[: S - 1]


@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=30),
    st.integers(2, 30),
    st.booleans(),
    st.booleans(),
)
def test_targets_are_ignored_exactly_on_padding_and_chosen_ends(
    lens: list[int], S: int, mask_ends: bool, bos: bool
) -> None:
    """Rows as the sample builder writes them (text tokens never the EOS id); with ``bos`` the
    BOS is the EOS id too, as pack's default BOS."""
    docs = []
    for d, n in enumerate(lens):
        text = (np.arange(n) % 97 + d).tolist()
        docs.append(np.array(([EOT] if bos else []) + text + [EOT], dtype=np.uint32))
    builder = BestFitSampleBuilder(S, np.dtype("<u4"), 7, EOT, 2 if bos else 1)
    samples = list(
        builder.add(np.concatenate(docs), [len(d) for d in docs], list(range(len(docs))))
    )
    samples += list(builder.flush())
    rule = RowLabels(EOT, EOT, EOT if bos else None, mask_ends)
    rows = torch.from_numpy(np.stack([s.tokens.astype(np.int32) for s in samples]))
    padding = rule.padding(rows)
    masked = rule.masked(rows, padding)
    assert padding is not None and masked is not None
    for k, s in enumerate(samples):
        # A document end is a real one only where the piece is the document's last.
        lens_k = list(s.doc_lens)
        want_mask, _ = _truth(lens_k, S, False)
        if mask_ends:
            at = 0
            for n in lens_k[:-1]:
                at += n
                # the piece ends its document iff its last token is the EOS
                if int(s.tokens[at - 1]) == EOT and at < S and not want_mask[at - 1]:
                    want_mask[at - 1] = True
        assert masked[k].tolist() == want_mask, f"row {k}: {s.tokens.tolist()} {lens_k}"
        assert padding[k].tolist() == [t >= S - lens_k[-1] for t in range(S)]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bfread")
    src = d / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in make_corpus(80, seed=5, stdlib_files=1))
    )
    wdstream.pack([str(src)], str(d / "out"), seq_len=SEQ, mode="bestfit", bestfit_buffer=24,
                  shard_size="16KB", workers=0)  # fmt: skip
    return d / "out"


def _loader(root: Path, **kw: object) -> wdstream.Loader:
    opts: dict = dict(seq_len=SEQ, batch_size=4, num_workers=0, seed=1, epochs=1)
    return wdstream.Loader(str(root), **{**opts, **kw})


def test_each_batch_row_is_one_sample_with_its_targets(root: Path) -> None:
    samples = {tuple(s.tokens.tolist()): s for s in raw_samples(root)}
    seen = []
    for batch in _loader(root, return_doc_boundaries=True):
        for r in range(batch["input_ids"].shape[0]):
            row = batch["input_ids"][r].tolist() + [batch["labels"][r, -1].item()]
            s = next(
                v for k, v in samples.items() if list(k[:SEQ]) == row[:SEQ]
            )  # the row is a whole sample
            seen.append(tuple(s.tokens.tolist()))
            masked = (batch["labels"][r] == IGNORE_INDEX).tolist()
            want, ids = _truth(list(s.doc_lens), SEQ + 1, mask_ends=True)
            assert masked == want
            assert batch["doc_ids"][r].tolist() == ids
            assert batch["doc_ids"].dtype == torch.int32
    assert len(seen) == len(set(seen))  # no sample twice in an epoch
    assert len(seen) >= len(samples) - 4  # the remainder of less than a batch is left out


def test_one_epoch_of_rows_is_every_sample_once(root: Path) -> None:
    """With a global batch of 1 nothing is left out: the epoch's rows are the samples, each
    once, so every document appears whole or as its consecutive pieces exactly once."""
    rows = [
        tuple(b["input_ids"][0].tolist()) for b in _loader(root, batch_size=1, mask_doc_ends=False)
    ]
    samples = [tuple(s.tokens.tolist()[:SEQ]) for s in raw_samples(root)]
    assert sorted(rows) == sorted(samples)


def test_plain_targets_when_document_ends_are_not_masked(root: Path) -> None:
    batch = next(iter(_loader(root, mask_doc_ends=False)))
    last = batch["labels"][:, -1:]  # -100 there only on padding, which is EOT
    rows = torch.cat([batch["input_ids"], torch.where(last == IGNORE_INDEX, EOT, last)], dim=1)
    padding = RowLabels(EOT, EOT, None, False).padding(rows)
    assert padding is not None
    want = torch.where(padding[:, 1:], IGNORE_INDEX, rows[:, 1:])
    assert torch.equal(batch["labels"], want)


def test_another_seq_len_is_refused(root: Path) -> None:
    with pytest.raises(ValueError, match=r"bestfit at seq_len 63.*seq_len=63 \(got 31\)"):
        _loader(root, seq_len=31)


def test_concat_dataset_keeps_plain_targets(tmp_path: Path) -> None:
    # Without an index the targets stay plain (no padding, no document ends are known);
    # only a loss bit, which no vocabulary's ids reach, is split off (tests/test_masked_read).
    assert row_labels(None, 10, None) == RowLabels(None, None, None, False, loss_mask=True)
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_corpus(10)))
    idx = wdstream.pack([str(src)], str(tmp_path / "o"), seq_len=31, workers=0).index
    assert row_labels(idx, 31, None) is None
    rule = row_labels(idx, 31, True)
    assert rule == RowLabels(None, EOT, None, True)


def test_resume_exact_at_every_step(root: Path) -> None:
    assert_resumes_exactly(lambda: _loader(root, return_doc_boundaries=True), steps=12)


def test_same_rows_on_any_world_size_and_batch_at(root: Path) -> None:
    one = [b for b in _loader(root, batch_size=4)]
    two = [[b for b in _loader(root, batch_size=2, rank=r, world_size=2)] for r in range(2)]
    assert len(one) == len(two[0]) == len(two[1])
    for k, b in enumerate(one):
        joined = torch.cat([two[0][k]["labels"], two[1][k]["labels"]])
        assert torch.equal(b["labels"], joined)
    loader = _loader(root, batch_size=4)
    for k in (0, len(one) // 2, len(one) - 1):
        assert all(torch.equal(loader.batch_at(k)[f], one[k][f]) for f in one[k])


def test_state_from_two_ranks_resumes_on_one_with_workers(root: Path) -> None:
    """Elastic: rank 0's state of a 2 x 2 run continues on 1 x 4 (with a worker) exactly."""
    full = [b["labels"] for b in _loader(root, batch_size=4)]
    saver = _loader(root, batch_size=2, rank=0, world_size=2)
    it = iter(saver)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    resumed = _loader(root, batch_size=4, num_workers=1)
    resumed.load_state_dict(state)
    rest = [b["labels"] for b in resumed]
    assert len(rest) == len(full) - 3
    assert all(torch.equal(a, b) for a, b in zip(rest, full[3:], strict=True))


def test_per_rank_streams_also_read_one_sample_per_row(root: Path) -> None:
    samples = {tuple(s.tokens.tolist()[:SEQ]) for s in raw_samples(root)}
    for batch in _loader(root, order="streams", streams=2):
        for row in batch["input_ids"].tolist():
            assert tuple(row) in samples


def test_stats_cli_reports_rows_truncation_and_padding(root: Path) -> None:
    from click.testing import CliRunner

    from wdstream.cli import main

    res = CliRunner().invoke(main, ["stats", str(root)])
    assert res.exit_code == 0, res.output
    s = json.loads(CliRunner().invoke(main, ["stats", str(root), "--json"]).output)
    assert (
        f"rows {s['rows']:,}; documents split across rows {s['documents_split']:,} "
        f"({s['documents_split_pct']:.2f} %); padding {s['padding_pct']:.2f} % of tokens"
    ) in res.output
    assert s["rows"] == len(raw_samples(root)) and s["mode"] == "bestfit"
