"""``wdstream explain --steps A:B --format jsonl``: one record per row of every step, for
joining with a loss log.

Oracles independent of explain: the rows the Loaders deliver (``batch_at``, or the batches
a run with skipped steps yielded), each piece's ``file:line`` re-read and re-tokenised with
tiktoken itself, each piece's shard and sample decoded with tarfile + msgpack, and the skip
arithmetic written out by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from click.testing import CliRunner

import wdstream
import wdstream.read.provenance as provenance_module
from tests.conftest import make_corpus
from tests.test_provenance import _doc_tokens, _rows_of, _write
from wdstream.cli import main
from wdstream.read.provenance import explain, explain_steps

SEQ = 31
B, W = 2, 2  # rows per rank, ranks
SEED = 4


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("explain-range")
    docs = make_corpus(n_docs=50, seed=11, stdlib_files=0)
    inputs = [_write(d / "a.jsonl", docs[:30]), _write(d / "b.jsonl", docs[30:])]
    wdstream.pack([str(p) for p in inputs], str(d / "ds"), seq_len=SEQ, shard_size="8KB",
                  workers=0, on_error="skip", progress=False)  # fmt: skip
    return d / "ds"


def _cli(*args: str) -> tuple[int, list[str]]:
    res = CliRunner().invoke(main, ["explain", *args])
    return res.exit_code, res.output.splitlines()


def _jsonl(*args: str) -> list[dict[str, Any]]:
    code, lines = _cli(*args, "--format", "jsonl")
    assert code == 0, lines
    return [json.loads(line) for line in lines]


def _sample_tokens(root: Path, shard: str, sample: int) -> tuple[np.ndarray, list[int]]:
    """Sample ``sample`` of tar ``shard``: its tokens and document piece lengths, read with
    tarfile and msgpack alone."""
    with tarfile.open(root / shard) as tar:
        members = [m for m in tar.getmembers() if m.name.endswith(".mp")]
        data = msgpack.unpackb(tar.extractfile(members[sample]).read())  # type: ignore[union-attr]
    return np.frombuffer(data["tokens"], dtype=data["dtype"]).astype(np.int64), data["doc_lens"]


def _check_pieces(root: Path, record: dict[str, Any], row: np.ndarray) -> None:
    """The record's pieces tile ``row``; each one's tokens are its document's at
    ``doc_span`` (re-tokenised from ``file:line``) and lie inside one document piece of
    its shard's sample (decoded from the tar)."""
    at = 0
    for p in record["pieces"]:
        (a, b), (c, d) = p["span"], p["doc_span"]
        assert a == at and b - a == d - c > 0
        want = row[a:b]
        np.testing.assert_array_equal(_doc_tokens(p["file"], p["line"])[c:d], want)
        tokens, lens = _sample_tokens(root, p["shard"], p["sample"])
        bounds = np.concatenate([[0], np.cumsum(lens)])
        hits = [o for o in range(len(tokens) - (b - a) + 1)
                if np.array_equal(tokens[o : o + b - a], want)
                and np.searchsorted(bounds, o, "right") == np.searchsorted(bounds, o + b - a - 1,
                                                                          "right")]  # fmt: skip
        assert hits, (record["step"], record["row"], p)
        at = b
    assert at == len(row)


def test_jsonl_records_every_row_of_a_range_across_an_epoch_end(root: Path) -> None:
    loaders = [wdstream.Loader(str(root), seq_len=SEQ, batch_size=B, rank=r, world_size=W,
                               seed=SEED, num_workers=0, order="global") for r in range(W)]  # fmt: skip
    per_epoch = len(loaders[0])
    first, end = per_epoch - 3, per_epoch + 3
    records = _jsonl(str(root), "--steps", f"{first}:{end}", "--batch-size", str(B),
                     "--world-size", str(W), "--seed", str(SEED))  # fmt: skip
    assert len(records) == (end - first) * B * W
    index = json.loads((root / "index.json").read_text())
    shards = {s["name"]: i for i, s in enumerate(index["shards"])}
    for k, rec in enumerate(records):
        step, row = first + k // (B * W), k % (B * W)
        assert set(rec) == {"step", "data_step", "row", "rank", "rank_row", "epoch",
                            "epoch_row", "pieces"}  # fmt: skip
        assert (rec["step"], rec["data_step"], rec["row"]) == (step, step, row)
        assert (rec["rank"], rec["rank_row"]) == (row // B, row % B)
        assert rec["epoch"] == (0 if step < per_epoch else 1)
        assert rec["epoch_row"] == (step % per_epoch) * B * W + row
        batch = _rows_of(loaders[rec["rank"]].batch_at(step))
        _check_pieces(root, rec, batch[rec["rank_row"]])
        for p in rec["pieces"]:
            assert shards[p["shard"]] == p["shard_index"]
            assert set(p) == {"shard", "shard_index", "sample", "document", "file", "line", "path",
                              "span", "doc_span"}  # fmt: skip


def test_text_of_a_range_and_of_one_step(root: Path) -> None:
    args = ("--batch-size", str(B), "--seed", str(SEED))
    code, lines = _cli(str(root), "--steps", "2:5", *args)
    assert code == 0
    heads = [i for i, line in enumerate(lines) if line.startswith("step ")]
    assert [lines[i].split(":")[0] for i in heads] == ["step 2", "step 3", "step 4"]
    assert [lines[i - 1] for i in heads[1:]] == ["", ""]  # steps apart by a blank line
    assert all(line.startswith(("step ", "row ", "  row [")) for line in lines if line)
    _, one = _cli(str(root), "--step", "3", *args)
    assert one == lines[heads[1] : heads[2] - 1]  # --step N prints the same block


def test_a_range_opens_the_dataset_once_and_equals_each_step(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = []
    real = provenance_module.Provenance.__init__

    def counting(self: Any, *args: Any, **kw: Any) -> None:
        opened.append(args)
        real(self, *args, **kw)

    monkeypatch.setattr(provenance_module.Provenance, "__init__", counting)
    steps = range(10, 40)
    got = list(explain_steps(str(root), steps, batch_size=B, world_size=W, seed=SEED))
    assert len(opened) == 1
    assert got == [explain(str(root), s, batch_size=B, world_size=W, seed=SEED) for s in steps]


def test_a_state_with_skips_maps_training_steps_to_data_steps(root: Path, tmp_path: Path) -> None:
    """A run trains 5 steps, skips 4, trains 3: explain with its state, over training steps
    0-7, names the rows the run was given at each, read from data steps 0-4 and 9-11."""
    loader = wdstream.Loader(str(root), seq_len=SEQ, batch_size=B, seed=SEED, num_workers=0,
                             order="global")  # fmt: skip
    given: list[np.ndarray] = []
    for take in (5, 3):
        it = iter(loader)
        given += [_rows_of(next(it)) for _ in range(take)]
        it.close()
        if take == 5:
            loader.skip_steps(4)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    records = _jsonl(str(root), "--steps", "0:8", "--state", str(state))
    assert [r["data_step"] for r in records[::B]] == [0, 1, 2, 3, 4, 9, 10, 11]
    assert [r["step"] for r in records[::B]] == list(range(8))
    for rec in records:
        _check_pieces(root, rec, given[rec["step"]][rec["rank_row"]])
    code, lines = _cli(str(root), "--steps", "4:6", "--state", str(state))
    assert code == 0
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == [
        "step 4",
        "step 5 (data step 9)",
    ]


def test_a_mixture_range_names_sources_and_follows_skips(tmp_path: Path) -> None:
    for name, word, n in (("web", "alpha", 30), ("code", "def", 12)):
        lines = [json.dumps({"text": f"{word} {i} " + "x y " * (i % 7)}) for i in range(n)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        wdstream.pack([str(tmp_path / f"{name}.jsonl")], str(tmp_path / name), seq_len=7,
                      workers=0, shard_size="1KB", progress=False)  # fmt: skip
    spec = tmp_path / "mix.json"
    spec.write_text(json.dumps({"sources": {"web": str(tmp_path / "web"),
                                            "code": str(tmp_path / "code")},
                                "weights": {"web": 0.75, "code": 0.25}}))  # fmt: skip
    loader = wdstream.Loader(str(spec), seq_len=7, batch_size=4, num_workers=0, seed=2,
                             shuffle_window=4, shuffle_lanes=2)  # fmt: skip
    it = iter(loader)
    given = [next(it) for _ in range(3)]
    it.close()
    loader.skip_steps(2)
    it = iter(loader)
    given += [next(it) for _ in range(2)]
    it.close()
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    records = _jsonl(str(spec), "--steps", "0:5", "--state", str(state))
    assert [r["data_step"] for r in records[::4]] == [0, 1, 2, 5, 6]
    for rec in records:
        batch = given[rec["step"]]
        assert rec["source"] == loader.sources[int(batch["source"][rec["rank_row"]])]
        assert {"source_epoch", "source_row"} <= set(rec) and "epoch" not in rec
        row = _rows_of(batch)[rec["rank_row"]]
        at = 0
        for p in rec["pieces"]:
            assert Path(p["file"]).name == f"{rec['source']}.jsonl"
            doc = _doc_tokens(str(tmp_path / f"{rec['source']}.jsonl"), p["line"])
            (a, b), (c, d) = p["span"], p["doc_span"]
            assert a == at
            np.testing.assert_array_equal(row[a:b], doc[c:d])
            at = b
        assert at == len(row)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--steps", "5:3"), "--steps: expected A:B with integers A < B"),
        (("--steps", "3"), "--steps: expected A:B with integers A < B"),
        (("--steps", "a:b"), "--steps: expected A:B with integers A < B"),
        (("--steps", "3:"), "--steps: expected A:B with integers A < B"),
        ((), "give one of --step N or --steps A:B"),
        (("--step", "1", "--steps", "1:2"), "give one of --step N or --steps A:B"),
        (("--steps", "-1:2"), "step -1 is outside the steps this run can reach"),
        # the last step a run of 2 rows a step can number is 2**62 - 1: the range fails whole
        (("--steps", f"{2**62 - 2}:{2**62 + 1}"), f"step {2**62} is outside the steps"),
    ],
)
def test_errors_are_one_line_and_nothing_else(
    root: Path, args: tuple[str, ...], message: str
) -> None:
    code, lines = _cli(str(root), "--batch-size", str(B), *args, "--format", "jsonl")
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], lines


def test_a_step_past_the_range_under_skips_names_both_steps(root: Path, tmp_path: Path) -> None:
    loader = wdstream.Loader(str(root), seq_len=SEQ, batch_size=B, seed=SEED, num_workers=0,
                             order="global")  # fmt: skip
    loader.skip_steps(3)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(loader.state_dict()))
    last = 2**62 - 1  # data steps of 2 rows end here; training step last - 3 reads it
    code, lines = _cli(str(root), "--steps", f"{last - 4}:{last - 1}", "--state", str(state))
    assert code != 0 and len(lines) == 1, lines
    assert lines[0].startswith(f"Error: training step {last - 2} reads data step {last + 1} ")
    assert _cli(str(root), "--step", str(last - 3), "--state", str(state))[0] == 0


def test_a_reader_that_stops_early_is_not_an_error(root: Path) -> None:
    """``wdstream explain ... | head -1``: the pipe closes under the writer; the command
    ends quietly with status 0 (it once printed ``Error: [Errno 32] Broken pipe``)."""
    cmd = [sys.executable, "-m", "wdstream.cli", "explain", str(root), "--steps", "0:40",
           "--batch-size", str(B), "--format", "jsonl"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    json.loads(proc.stdout.readline())
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Error" not in err and "Traceback" not in err


def test_a_huge_range_is_checked_at_its_ends_and_read_lazily(root: Path) -> None:
    """A range of 10**8 steps gives its first explanation at once (every step was checked
    and listed first, 14 s for 2 * 10**6 steps), and a range past the last reachable step
    is still refused before any output."""
    exps = explain_steps(str(root), range(5, 10**8), batch_size=B, world_size=W, seed=SEED)
    first = next(iter(exps))
    assert first.step == 5 and first == explain(str(root), 5, batch_size=B, world_size=W,
                                                seed=SEED)  # fmt: skip
    with pytest.raises(ValueError, match="outside the steps this run can reach"):
        explain_steps(str(root), range(0, 10**19), batch_size=B, world_size=W, seed=SEED)
