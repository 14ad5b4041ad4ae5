"""Issue 33 items 3 and 4: one truth per target, and ids that are tokens.

Oracles outside the reader: the shards decoded with ``tarfile`` + ``msgpack`` (the stored
ids and their bit 31), the records written to the JSONL file, and ``wdstream pack`` run as a
real process (exit status and its output, never a traceback).

* Item 3: a masked pre-tokenized document holding the EOS id inside its own ids, with the
  token after it supervised: the Loader's target there is that token (the stored mask
  decides), in a masked best-fit dataset alone and mixed with an unmasked one, whose rows
  keep the padding and document-end rules.
* Item 4: an ``index.json`` whose ``loss_mask`` was deleted or nulled, or whose ``bos_id``
  is past the vocabulary, is refused naming the shard and sample (checked against the
  decoded shard) or the key; ``--bos-id`` outside the vocabulary and pre-tokenized ids
  ``null`` / ``2**64 - 1`` are one clear error naming the key or ``file:line``.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

import wdstream
from tests.cli_server import run_cli
from wdstream import Loader
from wdstream.errors import IndexValidationError

EOT = 100257  # cl100k_base's <|endoftext|>, the pack's EOS
N_VOCAB = 100277
BIT = 1 << 31
SEQ = 31
MASKED = {"pretokenized": True, "mask_key": "loss_mask", "tokenizer": "cl100k_base", "workers": 0}


def records(n: int, seed: int) -> list[dict[str, Any]]:
    """Masked records; every third holds EOT inside its ids with the next id supervised."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = rng.randint(4, 24)
        ids = [1000 + i] + [rng.randrange(1, 999) for _ in range(size - 1)]
        mask = [rng.randint(0, 1) for _ in range(size)]
        if i % 3 == 0:
            at = rng.randrange(1, size - 1)
            ids[at], mask[at + 1] = EOT, 1  # an EOS id inside the document, then a target
        mask[-1] = 1
        out.append({"input_ids": ids, "loss_mask": mask})
    return out


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def decoded(root: Path) -> list[tuple[str, int, np.ndarray]]:
    """``(shard, sample number, stored uint32 ids)`` of every sample, by tarfile + msgpack."""
    index = json.loads((root / "index.json").read_text())
    out = []
    for shard in index["shards"]:
        with tarfile.open(root / shard["name"]) as tf:
            for k, m in enumerate(tf.getmembers()):
                f = tf.extractfile(m)
                assert f is not None
                obj = msgpack.unpackb(f.read())
                dtype = np.dtype(obj["dtype"]).newbyteorder("<")
                out.append((shard["name"], k, np.frombuffer(obj["tokens"], dtype=dtype).copy()))
    return out


def stored_labels(stored: np.ndarray) -> list[int]:
    """The targets a row of stored ids must have: each next id, -100 where it has bit 31."""
    ids = (stored & (BIT - 1)).astype(np.int64)
    return [-100 if int(s) >= BIT else int(i) for s, i in zip(stored[1:], ids[1:], strict=True)]


def ruled_labels(row: list[int]) -> list[int]:
    """An unmasked best-fit row's targets: -100 after each EOS and on the padding."""
    last = max(t for t, x in enumerate(row) if x != EOT)
    return [-100 if row[t] == EOT or t + 1 >= last + 2 else row[t + 1] for t in range(len(row) - 1)]


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("trust")
    recs = records(150, seed=4)
    wdstream.pack([str(write_jsonl(tmp / "in.jsonl", recs))], str(tmp / "ds"), mode="bestfit",
                  seq_len=SEQ, shard_samples=12, **MASKED)  # fmt: skip
    return tmp / "ds", recs


def test_the_stored_mask_decides_every_target(masked: tuple[Path, list]) -> None:
    root, recs = masked
    samples = decoded(root)
    want = {tuple((s & (BIT - 1)).tolist()[:-1]): stored_labels(s) for _, _, s in samples}
    # The pack stores each document's first id without loss (no BOS precedes it).
    firsts = {1000 + i for i in range(len(recs))}
    for _, _, s in samples:
        starts = [int(x) for x in s if (int(x) & (BIT - 1)) in firsts]
        assert starts and all(x >= BIT for x in starts)
    inner = 0
    for workers in (0, 2):
        for b in Loader(str(root), seq_len=SEQ, batch_size=4, num_workers=workers, epochs=1):
            for ids, labels in zip(b["input_ids"].tolist(), b["labels"].tolist(), strict=True):
                assert labels == want[tuple(ids)]  # a best-fit row is one stored sample
                inner += sum(1 for t in range(len(ids) - 1)
                             if ids[t] == EOT and labels[t] not in (-100, EOT))  # fmt: skip
    assert inner > 10  # targets after an EOS inside a document are served, as stored


def test_a_mixture_gives_stored_rows_their_mask_and_the_others_the_rules(
    masked: tuple[Path, list], tmp_path: Path
) -> None:
    root, _ = masked
    plain = [{"input_ids": [5000 + i] + [7] * (i % 11) + [EOT, 8, 9]} for i in range(120)]
    other = tmp_path / "plain"
    wdstream.pack([str(write_jsonl(tmp_path / "p.jsonl", plain))], str(other), pretokenized=True,
                  mode="bestfit", seq_len=SEQ, workers=0)  # fmt: skip
    want = {tuple((s & (BIT - 1)).tolist()[:-1]): stored_labels(s) for _, _, s in decoded(root)}
    seen = {0: 0, 1: 0}
    loader = Loader({"chat": str(root), "text": str(other)}, weights={"chat": 1, "text": 1},
                    seq_len=SEQ, batch_size=4, num_workers=0, seed=2)  # fmt: skip
    for step, b in zip(range(25), loader, strict=False):
        if step % 6 == 0:  # random access labels each row by its source too
            again = loader.batch_at(step)
            assert all((again[k] == b[k]).all() for k in ("input_ids", "labels", "source"))
        for ids, labels, src in zip(b["input_ids"].tolist(), b["labels"].tolist(),
                                    b["source"].tolist(), strict=True):  # fmt: skip
            seen[src] += 1
            if src == 0:
                assert labels == want[tuple(ids)]
            else:  # the reader's rules fill in where no mask is stored
                assert labels[:-1] == ruled_labels(ids)[: len(ids) - 1]
    assert seen[0] and seen[1]


def _edited(root: Path, to: Path, **keys: Any) -> Path:
    shutil.copytree(root, to)
    index = json.loads((to / "index.json").read_text())
    for k, v in keys.items():
        if v is ...:
            del index[k]
        else:
            index[k] = v
    (to / "index.json").write_text(json.dumps(index, indent=1))
    return to


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("edit", ["deleted", "null"])
def test_an_index_without_its_loss_mask_names_the_shard_and_sample(
    masked: tuple[Path, list], tmp_path: Path, edit: str, workers: int
) -> None:
    """At 0 workers the ids are checked as a window is read; a torch worker of several
    checks those of the rows it copies (window_data.copy_rows): the same error."""
    root, _ = masked
    bad = _edited(root, tmp_path / "bad", loss_mask=... if edit == "deleted" else None)
    with pytest.raises(IndexValidationError) as info:
        for _ in Loader(str(bad), seq_len=SEQ, batch_size=4, num_workers=workers, epochs=1):
            pass
    msg = str(info.value)
    found = re.search(r"(data-\d+\.tar): sample (\d+), token (\d+): id (\d+) carries the loss bit",
                      msg)  # fmt: skip
    assert found, msg
    name, k, t, got = found.group(1), *map(int, found.groups()[1:])
    stored = {(s, j): ids for s, j, ids in decoded(root)}[(name, k)]
    assert int(stored[t]) == got >= BIT  # the decoded shard holds exactly that id there
    assert 'no "loss_mask"' in msg


@pytest.mark.parametrize("bos", [N_VOCAB, 2**31, 2**32 - 1])
def test_a_mixture_source_with_a_bos_id_past_the_vocabulary_is_refused(
    masked: tuple[Path, list], tmp_path: Path, bos: int
) -> None:
    root, _ = masked
    bad = _edited(root, tmp_path / "bad", bos_id=bos)
    # index.json's rules refuse it on open (bos_id below tokenizer.n_vocab)
    refused = rf"index.json: bos_id: expected an id below tokenizer.n_vocab = {N_VOCAB}, got {bos}"
    with pytest.raises(IndexValidationError, match=refused):
        Loader({"a": str(root), "b": str(bad)}, weights={"a": 1, "b": 1}, seq_len=SEQ,
               batch_size=4)  # fmt: skip


def _pack(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return run_cli("pack", *args, cwd=cwd, timeout=300)


@pytest.mark.parametrize("bos", [str(2**31), str(2**32), str(2**64), "-1", str(N_VOCAB)])
def test_pack_refuses_a_bos_id_outside_the_vocabulary(tmp_path: Path, bos: str) -> None:
    write_jsonl(tmp_path / "in.jsonl", [{"text": "hello world"}])
    res = _pack(["in.jsonl", "-o", "out", "--bos-id", bos, "--workers", "0"], tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert f"bos_id (--bos-id): {int(bos)} is not a token of tokenizer" in res.stderr + res.stdout
    assert not (tmp_path / "out" / "index.json").exists()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"input_ids": [5, null, 7]}', "id null at position 1 of 'input_ids' is not an integer"),
        (
            '{"input_ids": [5, 18446744073709551615, 7]}',
            "id 18446744073709551615 at position 1 of 'input_ids' is outside the vocabulary",
        ),
    ],
)
def test_pretokenized_ids_that_are_no_tokens_name_file_and_line(
    tmp_path: Path, line: str, why: str
) -> None:
    good = [{"input_ids": [100 + i, 200 + i, 300 + i]} for i in range(4)]
    text = "".join(json.dumps(r) + "\n" for r in good[:2]) + line + "\n"
    text += "".join(json.dumps(r) + "\n" for r in good[2:])
    (tmp_path / "in.jsonl").write_text(text)
    base = ["in.jsonl", "--pretokenized", "--seq-len", "8", "--mode", "docs", "--workers", "0"]
    res = _pack([*base, "-o", "strict"], tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert f"in.jsonl:3: {why}" in res.stderr + res.stdout
    res = _pack([*base, "-o", "skip", "--on-error", "skip"], tmp_path)
    assert res.returncode == 0, res.stderr
    docs = [s.tolist() for _, _, s in decoded(tmp_path / "skip")]
    assert docs == [r["input_ids"] + [EOT] for r in good]  # the others, exactly
