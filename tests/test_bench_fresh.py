"""Smoke test of the bench's ``fresh`` part (tools/benchlib/fresh.py): its children run a
real Loader in a new process (an epoch at 0 workers, a state at 90 %, a 2-worker first batch
after the heavy imports, resumed from the saved state), and its section takes each ratio to
LitData inside a round (median and min–max over rounds, not a ratio of medians)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from benchlib import fresh, runner  # noqa: E402
from benchlib.common import SAMPLE  # noqa: E402


def test_children_time_a_real_loader_in_a_new_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first-batch child after the heavy imports, transformers' Llama code among them
    where installed; the resumed one without transformers (blocked on its path as a missing
    package is missing: ~4 s of CPU here), its other heavy imports kept."""
    from wdstream.testing import write_synthetic_dataset

    root = str(tmp_path / "ds")
    write_synthetic_dataset(root, doc_lens=[SAMPLE] * 96, sample_tokens=SAMPLE,
                            samples_per_shard=24)  # fmt: skip
    epoch = runner.run_child("fresh_epoch", timeout=120, reader="wdstream", root=root)
    assert "error" not in epoch, epoch
    assert epoch["batches"] == 12 and epoch["tokens_per_s"] > 0 and epoch["first_batch_s"] > 0
    state = tmp_path / "state.json"
    made = runner.run_child("fresh_state", timeout=120, reader="wdstream", root=root,
                            out=str(state))  # fmt: skip
    assert made == {"at": 10, "epoch_batches": 12, "wall_s": made["wall_s"]}
    assert json.loads(state.read_text())["step"] == 10  # the Loader's own state, as JSON
    first = runner.run_child("fresh_first", timeout=180, reader="wdstream", root=root)
    blocker = tmp_path / "blocker" / "transformers"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'transformers'\", name='transformers')\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(blocker.parent), *filter(None, [os.environ.get("PYTHONPATH")])]))  # fmt: skip
    resumed = runner.run_child("fresh_first", timeout=180, reader="wdstream", root=root,
                               state=str(state))  # fmt: skip
    for res in (first, resumed):
        assert "error" not in res, res
        assert res["first_batch_s"] > 0
        assert {"json", "email", "asyncio", "unittest"} <= set(res["heavy"])
    installed = importlib.util.find_spec("transformers") is not None
    assert ("transformers.models.llama.modeling_llama" in first["heavy"]) == installed
    assert "transformers" not in resumed["heavy"]


def test_section_ratios_to_litdata_per_round() -> None:
    def runs(name: str, scale: float) -> dict[str, list[dict[str, object]]]:
        out = {}
        for m in fresh.MEASURES:
            out[f"{m}/{name}"] = [
                {"round": r, "first_batch_s": scale * (r + 1) * 0.01,
                 "follow_s": scale * (r + 1) * 0.1, "tokens_per_s": 1e8 / scale,
                 "batches": 428, "heavy": ["json"]}
                for r in range(3)
            ]  # fmt: skip
        return out

    results = {
        "args": {"repeats": 3},
        "fresh": {
            "runs": {**runs("wdstream", 0.8), **runs("litdata", 1.0)},
            "states": {"wdstream": {"at": 385, "epoch_batches": 428}},
        },
    }
    notes: list[str] = []
    text = "\n".join(fresh.section(results, notes))
    row = next(line for line in text.splitlines() if line.startswith("| wdstream `Loader` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "1.25x (1.25–1.25)"  # tokens/s: 1e8/0.8 over 1e8
    # first batch at 0 and 2 workers, batch 16 at 2 workers, resume: times, per round
    assert cells[4] == cells[6] == cells[8] == cells[10] == "0.80x (0.80–0.80)"
    assert (
        "steady tokens/s, 0 workers, wdstream / LitData 1.25x (1.25–1.25) (goal ≥ 1.0x: met)"
        in text
    )
    assert "first batch, 2 workers, heavy script, wdstream / LitData 0.80x" in text
    assert "batch 16, 2 workers, heavy script, wdstream / LitData 0.80x" in text
    assert "batch 385 of 428" in text and notes == []
