"""The bench's raw-text part: its children write a state and resume exactly from it, and its
section reads per-round ratios, goals and exactness from the results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from benchlib import rawtext  # noqa: E402


def _runs(first: list[float], exact: bool | None) -> list[dict]:
    return [{"round": r, "construct_s": 0.5, "first_s": f, "first_cpu_s": f / 2, "n_s": 2 * f,
             "exact": exact, "load": 1.0} for r, f in enumerate(first)]  # fmt: skip


def test_section_gives_per_round_ratio_goals_and_exactness() -> None:
    res = {"before_rev": "abc1234", "state/0": {"at": 90, "epoch_batches": 100},
           "runs": {"after/fresh/0": _runs([1.0, 3.0, 4.0], None),
                    "after/resume/0": _runs([2.0, 1.0, 4.0], True),
                    "before/fresh/0": _runs([30.0, 40.0, 50.0], None),
                    "before/resume/0": _runs([10.0, 10.0, 10.0], False)}}  # fmt: skip
    text = "\n".join(rawtext.section({"rawtext": res, "args": {"repeats": 3}}, []))
    rows = [ln for ln in text.splitlines() if ln.startswith("| 0 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["before", "after"]
    # per-round resumed / fresh: 2.0, 0.33, 1.0 -> median 1.0, not a ratio of medians
    assert "1.00x (0.33–2.00)" in rows[1] and "| yes |" in rows[1]
    assert "| NO {False} |" in rows[0]
    assert "raw text, 0 workers, first batch 3.00 s (1.00–4.00) (goal ≤ 2.0 s: NOT met)" in text
    assert "(goal ≤ 1.5x: met)" in text and "`abc1234`" in text


def test_children_resume_exactly_from_the_state_they_wrote(tmp_path: Path) -> None:
    src = tmp_path / "c"
    src.mkdir()
    words = "alpha beta gamma delta epsilon".split()
    for f in range(3):  # ~45 batches of 8 x 2049 tokens
        lines = [json.dumps({"text": " ".join(words[(i + j) % 5] for j in range(1800))})
                 for i in range(140)]  # fmt: skip
        (src / f"p-{f}.jsonl").write_text("\n".join(lines) + "\n")
    out = str(tmp_path / "state.json")
    tok = rawtext.cl100k_tokenizer_json(tmp_path / "tok")
    info = rawtext.child_state(str(src / "*.jsonl"), tok, 0, out)
    assert info["at"] == int(0.9 * info["epoch_batches"])
    got = rawtext.child_rawtext(str(src / "*.jsonl"), tok, 0, out, None)
    assert got["exact"] is True and 0 < got["first_s"] <= got["n_s"]
