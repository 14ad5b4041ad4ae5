"""``wdstream stats`` and ``wdstream explain`` on a mixture spec: the same spec the Loader
reads; explain names each row's source and its input file:line, and the explained pieces
re-tokenise to exactly the Loader's rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import wdstream
from tests.cli_server import run_cli
from wdstream.cli import main
from wdstream.read.mixture.inspect import explain_mixture
from wdstream.tokenizers import load_tokenizer

SEQ = 7


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mixcli")
    for name, word, n in (("web", "alpha", 30), ("code", "def", 12)):
        lines = [json.dumps({"text": f"{word} {i} " + "x y " * (i % 7)}) for i in range(n)]
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        wdstream.pack([str(root / f"{name}.jsonl")], str(root / name), seq_len=SEQ, workers=0,
                      shard_size="1KB", progress=False)  # fmt: skip
    path = root / "mix.json"
    path.write_text(json.dumps({"sources": {"web": "web", "code": "code"},
                                "weights": {"web": 0.75, "code": 0.25}}))  # fmt: skip
    return path


def test_stats_of_a_spec(spec: Path) -> None:
    res = CliRunner().invoke(main, ["stats", str(spec)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "mixture of 2 sources, stop rule none (forever)"
    assert lines[1].startswith("  web: ") and "cl100k_base, mode concat, seq_len 7" in lines[1]
    assert lines[3].startswith("from step 0: web 0.75 (an epoch per ")
    data = json.loads(CliRunner().invoke(main, ["stats", str(spec), "--json"]).output)
    web = data["sources"]["web"]
    rows = web["tokens"] // (SEQ + 1)
    assert data["schedule"][0]["mixture_rows_per_source_epoch"]["web"] == rows * 4 // 3


def test_explain_names_sources_and_lines_that_retokenise_to_the_rows(spec: Path) -> None:
    loader = wdstream.Loader(str(spec), seq_len=SEQ, batch_size=4, num_workers=0, seed=2,
                             shuffle_window=4, shuffle_lanes=2)  # fmt: skip
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == 6:
            break
    state = loader.state_dict()
    tok = load_tokenizer("cl100k_base", "tiktoken")
    texts = {
        name: (spec.parent / f"{name}.jsonl").read_text().splitlines() for name in ("web", "code")
    }
    for step in (0, 5):
        exp = explain_mixture(spec, step, batch_size=4, seq_len=SEQ, seed=2, shuffle_window=4,
                              shuffle_lanes=2)  # fmt: skip
        row_tokens = torch.cat([batches[step]["input_ids"], batches[step]["labels"][:, -1:]], 1)
        for r, row in enumerate(exp.rows):
            assert loader.sources.index(row.source) == int(batches[step]["source"][r])
            assert row.pieces
            for p in row.pieces:
                assert Path(p.file).name == f"{row.source}.jsonl"
                text = json.loads(texts[row.source][p.line - 1])["text"]
                doc = [*np.asarray(tok.encode(text)).tolist(), tok.eos_id]
                want = np.asarray(doc[p.doc_start : p.doc_end])
                np.testing.assert_array_equal(row_tokens[r, p.row_start : p.row_end].numpy(), want)
    state_file = spec.parent / "state.json"
    state_file.write_text(json.dumps(state))
    args = ["explain", str(spec), "--step", "6", "--state", str(state_file)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    head = res.output.splitlines()[0]
    assert (
        head == "step 6: global batch 4 = 1 rank x 4; seq_len 7, seed 2; weights web 3/4 code 1/4"
    )
    nxt = next(iter(loader))
    shown = [ln.split("  ")[1].split(" ")[0] for ln in res.output.splitlines()
             if ln.startswith("row ")]  # fmt: skip
    assert shown == [loader.sources[int(i)] for i in nxt["source"]]
    real = run_cli(*args)
    assert real.returncode == 0, real.stderr
    assert real.stdout == res.output


def test_explain_errors(spec: Path) -> None:
    res = CliRunner().invoke(main, ["explain", str(spec), "--step", "0"])
    assert res.exit_code != 0 and "batch_size is needed" in res.output
    bad = spec.parent / "bad.json"
    bad.write_text(json.dumps({"sources": {"web": "web"}, "weights": {"web": 1, "x": 2}}))
    res = CliRunner().invoke(main, ["stats", str(bad)])
    assert res.exit_code != 0 and "weights: unknown source 'x'; the sources are web" in res.output
