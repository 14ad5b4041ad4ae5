"""Item 11 of issue 34: ``pack --holdout F`` / ``Writer(holdout=F)``: a held-out dataset at
``OUTPUT/holdout/`` that never shares a document with the training one.

Oracles outside the code under test: documents are tokenised with tiktoken itself and
shards are read back with tarfile + msgpack (``tests/test_pack.py``'s helpers); each
document's side is computed here from the documented hash (blake2b, 8-byte digest read
little-endian, of its ids as little-endian uint32 without bit 31, below
``floor(F * 2**64)``); a resumed pack is compared with the uninterrupted one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from hashlib import blake2b
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pytest
from click.testing import CliRunner

import wdstream
from tests.conftest import make_corpus
from tests.test_pack import expected_concat, expected_docs, raw_samples
from tests.test_pack_resume import _interrupted_writer, _kill_after
from wdstream.cli import main
from wdstream.storage import LocalStore, open_store
from wdstream.testing import committed_shards
from wdstream.write.pack import JOURNAL_NAME

pytest_plugins = ["tests.fixtures_remote"]

FRACTION = 0.25


def side_of(ids: Any, fraction: float = FRACTION) -> bool:
    """True when the documented rule holds the document out: computed here, not by wdstream."""
    data = (np.asarray(ids, dtype=np.int64) & 0x7FFFFFFF).astype("<u4").tobytes()
    value = int.from_bytes(blake2b(data, digest_size=8).digest(), "little")
    return value < int(fraction * 2**64)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    docs = make_corpus(n_docs=160, seed=7, stdlib_files=0)
    return docs + docs[::9]  # exact duplicates, later in the input


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, texts: list[str]) -> Path:
    path = tmp_path_factory.mktemp("holdout") / "in.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def _files(root: Path) -> dict[str, bytes]:
    """The dataset's files at ``root`` (not the held-out dataset's folder, nor hidden ones)."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())
            if p.is_file() and not p.name.startswith(".")}  # fmt: skip


def _split(texts: list[str]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    docs = expected_docs(texts)
    return [d for d in docs if not side_of(d)], [d for d in docs if side_of(d)]


def test_docs_split_is_the_independent_hash(tmp_path: Path, corpus: Path, texts: list[str]) -> None:
    out = tmp_path / "out"
    res = wdstream.pack([str(corpus)], str(out), seq_len=31, mode="docs", shard_size="16KB",
                        workers=0, holdout=FRACTION)  # fmt: skip
    train, held = _split(texts)
    got_train = [s.tokens for s in raw_samples(out)]
    got_held = [s.tokens for s in raw_samples(out / "holdout")]
    assert len(got_train) == len(train) and len(got_held) == len(held)
    assert all(np.array_equal(g, w) for g, w in zip(got_train, train, strict=True))
    assert all(np.array_equal(g, w) for g, w in zip(got_held, held, strict=True))
    # No document on both sides; every duplicate with its original.
    assert not {tuple(d) for d in got_train} & {tuple(d) for d in got_held}
    assert len(texts) == 160 + 18 and 20 < len(held) < 70  # 25 % of 178, binomial
    assert res.holdout is not None
    assert res.holdout.total_documents == len(held)
    assert res.index.total_documents == len(train)
    assert res.index.stats["holdout"]["split"] == "train"
    assert res.holdout.stats["holdout"] == {**res.index.stats["holdout"], "split": "holdout",
                                            "other": ".."}  # fmt: skip
    # Each dataset has its own index, shard table and provenance tables.
    for root in (out, out / "holdout"):
        assert (root / "index.json").exists() and (root / "index.shards").exists()
        index = json.loads((root / "index.json").read_text())
        assert all((root / s["name"].replace(".tar", ".prov")).exists() for s in index["shards"])
        assert not (root / ".wdstream-pack.json").exists()


def test_concat_split_same_for_any_workers(tmp_path: Path, corpus: Path, texts: list[str]) -> None:
    kw: dict[str, Any] = dict(seq_len=31, shard_size="8KB", holdout=FRACTION)
    serial, pooled = tmp_path / "serial", tmp_path / "pooled"
    wdstream.pack([str(corpus)], str(serial), workers=0, **kw)
    wdstream.pack([str(corpus)], str(pooled), workers=2, **kw)
    train, held = _split(texts)
    for root, docs in ((serial, train), (serial / "holdout", held)):
        got = [(s.tokens.tolist(), s.doc_lens, s.cont) for s in raw_samples(root)]
        assert got == expected_concat(docs, 32)
    assert _files(serial) == _files(pooled)
    assert _files(serial / "holdout") == _files(pooled / "holdout")


def _stopped_at(folder: str, victim: str) -> Callable[..., AbstractContextManager[BinaryIO]]:
    """``LocalStore.writer`` raising KeyboardInterrupt once ``victim`` is written in the
    store whose folder is named ``folder`` (before the rename that would publish it)."""
    real = LocalStore.writer

    @contextmanager
    def writer(self: LocalStore, name: str) -> Iterator[BinaryIO]:
        with real(self, name) as out:
            yield out
            if name == victim and self.root.name == folder:
                raise KeyboardInterrupt

    return writer


def _resume_key(root: Path) -> tuple[int, int, int]:
    """(file, record, offset) of the document a dataset's journal resumes from."""
    return tuple(json.loads((root / JOURNAL_NAME).read_text())["position"]["position"][:3])


def test_interrupted_pack_resumes_both_datasets(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped while one dataset writes a shard, both having committed some: the rerun reads
    from the one further behind, the other skips to its own place, and both finish
    byte-identical to the uninterrupted pack. Either side is the one behind in some case."""
    behind = set()
    cases = [
        (mode, folder, victim)
        for mode in ("concat", "docs", "bestfit")
        for folder, victim in (("holdout", "data-000002.tar"), ("out", "data-000003.tar"))
    ]
    for k, (mode, folder, victim) in enumerate(cases):
        kw: dict[str, Any] = dict(seq_len=31, shard_size="8KB", workers=0, mode=mode,
                                  holdout=0.5, bestfit_buffer=16, batch_bytes=2048)  # fmt: skip
        ref, out = tmp_path / f"ref-{k}", tmp_path / f"{k}" / "out"
        wdstream.pack([str(corpus)], str(ref), **kw)
        with monkeypatch.context() as patch:
            patch.setattr(LocalStore, "writer", _stopped_at(folder, victim))
            with pytest.raises(KeyboardInterrupt):
                wdstream.pack([str(corpus)], str(out), **kw)
        assert not (out / "index.json").exists()
        assert not (out / "holdout" / "index.json").exists()
        assert committed_shards(out) >= 1 and committed_shards(out / "holdout") >= 1, (mode, folder)
        keys = _resume_key(out), _resume_key(out / "holdout")
        assert keys[0] != keys[1]
        behind.add("train" if keys[0] < keys[1] else "holdout")
        committed = committed_shards(out)
        res = wdstream.pack([str(corpus)], str(out), **kw)
        assert res.resumed_shards == committed
        assert _files(out) == _files(ref)
        assert _files(out / "holdout") == _files(ref / "holdout")
    assert behind == {"train", "holdout"}
    # Another fraction is another command.
    with pytest.raises(wdstream.WdstreamError, match="already holds a complete dataset"):
        wdstream.pack([str(corpus)], str(out), **{**kw, "holdout": 0.1})


def test_sigkilled_cli_pack_resumes(tmp_path: Path, corpus: Path) -> None:
    def cmd(out: Path) -> list[str]:
        return [sys.executable, "-m", "wdstream.cli", "pack", str(corpus), "-o", str(out),
                "--seq-len", "31", "--shard-size", "8KB", "--workers", "0", "--holdout",
                "0.3", "--quiet"]  # fmt: skip

    ref, out = tmp_path / "ref", tmp_path / "out"
    subprocess.run(cmd(ref), check=True)
    assert _kill_after(cmd(out), out, 5), "pack finished before it could be killed"
    assert not (out / "index.json").exists()
    with pytest.raises(wdstream.WdstreamError, match=r"differs in: holdout"):
        wdstream.pack([str(corpus)], str(out), seq_len=31, shard_size="8KB", workers=0)
    subprocess.run(cmd(out), check=True)
    assert _files(out) == _files(ref)
    assert _files(out / "holdout") == _files(ref / "holdout")


def test_masked_counts_are_per_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pre-tokenized records with a loss mask: the mask bit does not change a document's
    side, and each dataset's supervised-token count is its own (resumed too)."""
    rng = np.random.default_rng(3)
    records = []
    for _ in range(300):
        ids = rng.integers(1, 1000, size=int(rng.integers(3, 40))).tolist()
        records.append({"input_ids": ids, "loss_mask": [int(k % 3 != 0) for k in range(len(ids))]})
    src = tmp_path / "ids.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    kw: dict[str, Any] = dict(seq_len=15, shard_size="4KB", workers=0, pretokenized=True,
                              mask_key="loss_mask", tokenizer="cl100k_base", holdout=0.3,
                              batch_bytes=2048)  # fmt: skip
    ref, out = tmp_path / "ref", tmp_path / "out"
    res = wdstream.pack([str(src)], str(ref), **kw)
    assert res.holdout is not None
    for root, index in ((ref, res.index), (ref / "holdout", res.holdout)):
        tokens = np.concatenate([s.tokens for s in raw_samples(root)])
        supervised = int(np.count_nonzero(tokens < 2**31))
        assert index.stats["supervised_tokens"] == supervised
        assert index.stats["unsupervised_tokens"] == len(tokens) - supervised
    # The side depends on the ids (and the EOS), not on the mask.
    eos = res.index.eos_id
    expect_held = sum(side_of([*r["input_ids"], eos], 0.3) for r in records)
    assert res.holdout.total_documents == expect_held
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer("data-000004.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack([str(src)], str(out), **kw)
    wdstream.pack([str(src)], str(out), **kw)
    assert _files(out) == _files(ref) and _files(out / "holdout") == _files(ref / "holdout")


def test_loader_reads_the_holdout_once_in_order(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "out"
    wdstream.pack([str(corpus)], str(out), seq_len=31, shard_size="8KB", workers=0,
                  holdout=FRACTION)  # fmt: skip
    samples = [s.tokens for s in raw_samples(out / "holdout")]
    loader = wdstream.Loader(str(out / "holdout"), seq_len=31, batch_size=4, epochs=1,
                             shuffle=False, num_workers=0)  # fmt: skip
    rows = [row for batch in loader for row in batch["input_ids"].tolist()]
    assert len(rows) == len(samples) // 4 * 4  # one pass; the last partial batch left out
    assert rows == [s[:31].tolist() for s in samples[: len(rows)]]


def test_bad_fractions_and_engines(tmp_path: Path, corpus: Path) -> None:
    for bad in (0, 1, 1.5, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="holdout must be a fraction"):
            wdstream.pack([str(corpus)], str(tmp_path / "x"), holdout=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="engine='local'"):
        wdstream.pack([str(corpus)], str(tmp_path / "x"), holdout=0.1, engine="ray")
    res = CliRunner().invoke(main, ["pack", str(corpus), "-o", str(tmp_path / "y"),
                                    "--holdout", "2"])  # fmt: skip
    assert res.exit_code == 1 and res.output.startswith("Error: holdout must be a fraction")
    with pytest.raises(wdstream.InputError, match="no document of <records> was held out"):
        wdstream.pack_records(["one short text"], str(tmp_path / "z"), holdout=0.01, workers=0)
    one = next(t for t in ("a", "b", "c", "d", "e", "f") if side_of(expected_docs([t])[0], 0.9))
    with pytest.raises(wdstream.InputError, match="every document of <records> was held out"):
        wdstream.pack_records([one], str(tmp_path / "z2"), holdout=0.9, workers=0)
    assert not (tmp_path / "z2" / "holdout" / "index.json").exists()


def test_writer_and_overwrite(tmp_path: Path, texts: list[str]) -> None:
    """``Writer(holdout=)`` writes the same pair as ``pack``; ``--overwrite`` without a
    holdout removes the earlier pack's held-out dataset with the rest."""
    out = tmp_path / "w"
    with wdstream.Writer(str(out), seq_len=31, mode="docs", workers=0, holdout=FRACTION) as w:
        for t in texts:
            w.write(t)
    train, held = _split(texts)
    assert [s.tokens.tolist() for s in raw_samples(out / "holdout")] == [d.tolist() for d in held]
    assert len(raw_samples(out)) == len(train)
    # The training dataset removed by hand, its held-out one left: that one is not replaced.
    for p in out.iterdir():
        if p.is_file():
            p.unlink()
    with pytest.raises(wdstream.WdstreamError, match=r"holdout/index.json exists: a held-out"):
        wdstream.pack_records(texts, str(out), seq_len=31, workers=0, holdout=FRACTION)
    wdstream.pack_records(texts, str(out), seq_len=31, workers=0, overwrite=True)
    assert not (out / "holdout" / "index.json").exists()
    assert not list((out / "holdout").glob("*.tar"))


def test_hf_trainer_example_evaluates_on_the_holdout(tmp_path: Path, texts: list[str]) -> None:
    """``examples/hf_trainer.py``'s eval loop reads every full batch of the held-out dataset
    once, in order: its loss equals the loss of the same model on the samples decoded here.

    The first 40 documents only, several held-out batches still: each batch is a cl100k logit
    layer (~100k x 124 logits) three times over, and with the whole corpus this test took
    17-19 s of CPU, 6.5 s with 40 documents. The whole held-out dataset read once, in order,
    is test_loader_reads_the_holdout_once_in_order's."""
    pytest.importorskip("transformers")
    import torch

    from tests.integrations_support import load_example

    corpus = tmp_path / "in.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:40]))
    out = tmp_path / "out"
    res = wdstream.pack([str(corpus)], str(out), seq_len=31, shard_size="8KB", workers=0,
                        holdout=FRACTION)  # fmt: skip
    example = load_example("hf_trainer")
    torch.manual_seed(0)
    model = example.tiny_gpt2(int(res.index.tokenizer["n_vocab"]), 31)
    got = example.evaluate(model, str(out / "holdout"), 31, 4)
    samples = [s.tokens for s in raw_samples(out / "holdout")]
    n = len(samples) // 4 * 4
    assert n >= 4 * 4, n  # several batches: the order across batches is checked
    rows = torch.tensor(np.stack(samples[:n]))
    with torch.no_grad():
        logits = model(input_ids=rows[:, :31]).logits
        want = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="mean"
        )
    assert got["eval_tokens"] == n * 31
    assert got["eval_loss"] == pytest.approx(float(want), rel=1e-5)
    record = example.main([str(out), "--output-dir", str(tmp_path / "run"), "--steps", "2",
                           "--seq-len", "31", "--eval", str(out / "holdout")])  # fmt: skip
    assert record["eval_tokens"] == n * 31 and np.isfinite(record["eval_loss"])


@pytest.mark.timeout(180)
def test_remote_outputs_hold_both_datasets(
    tmp_path: Path, corpus: Path, s3_bucket: str, http_server: Any
) -> None:
    """Packed to S3 (moto) and to an HTTP server with PUT: both datasets' objects are the
    local pack's, byte for byte, each under its own root, and the held-out one verifies."""
    args = ["--seq-len", "31", "--shard-size", "32KB", "--workers", "0", "-q", "--holdout",
            str(FRACTION)]  # fmt: skip
    local = tmp_path / "local"
    assert CliRunner().invoke(main, ["pack", str(corpus), "-o", str(local), *args]).exit_code == 0
    for url in (f"s3://{s3_bucket}/ds", f"{http_server.base_url}/ds"):
        res = CliRunner().invoke(main, ["pack", str(corpus), "-o", url, *args])
        assert res.exit_code == 0, res.output
        for sub in (local, local / "holdout"):
            store = open_store(url + str(sub)[len(str(local)) :])
            names = [p.name for p in sorted(sub.glob("data-*"))] + ["index.shards"]
            assert len(names) > 3
            for name in names:
                assert store.read(name) == (sub / name).read_bytes(), (url, sub, name)
            assert store.exists("index.json") and not store.exists(JOURNAL_NAME)
        assert CliRunner().invoke(main, ["verify", f"{url}/holdout"]).exit_code == 0


def test_chat_conversations_are_hashed_whole(tmp_path: Path) -> None:
    """A conversation is one document: its side is the hash of all its rendered ids (as
    transformers' apply_chat_template gives them, then the pack's EOS), whatever ``train_on``
    masks, so the same conversations are held out for every ``train_on``."""
    pytest.importorskip("transformers")
    from tests.chat_pack_support import conversations, transformers_reference, write_conversations
    from tests.chat_support import CHATML_GENERATION, build_chat_hf

    hf = build_chat_hf(tmp_path / "tok", CHATML_GENERATION)
    convs = conversations(60, seed=5)
    convs += convs[::7]  # duplicates
    src = write_conversations(tmp_path / "in.jsonl", convs)
    reference = transformers_reference(hf, convs)
    kw: dict[str, Any] = dict(tokenizer=str(hf.parent), chat=True, mode="docs", seq_len=4095,
                              shard_size="8KB", workers=0, holdout=0.3)  # fmt: skip
    splits = []
    for train_on in ("assistant", "last", "all"):
        out = tmp_path / train_on
        res = wdstream.pack([str(src)], str(out), train_on=train_on, **kw)
        eos = res.index.eos_id
        stored = [[*ids, eos] for ids, _ in reference]
        want_held = [s for s in stored if side_of(s, 0.3)]
        want_train = [s for s in stored if not side_of(s, 0.3)]
        got_held = [(s.tokens & 0x7FFFFFFF).tolist() for s in raw_samples(out / "holdout")]
        got_train = [(s.tokens & 0x7FFFFFFF).tolist() for s in raw_samples(out)]
        assert got_held == want_held and got_train == want_train
        assert want_held and want_train
        splits.append(got_held)
    assert splits[0] == splits[1] == splits[2]
