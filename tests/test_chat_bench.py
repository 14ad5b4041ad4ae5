"""The bench's chat part (tools/benchlib/chat*.py): its conversations are deterministic and
every record is a conversation pack --chat reads, and its report section states the goals
from per-round ratios (the measurement itself runs in tools/bench.py --parts chat)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from benchlib import chat, chat_corpus, corpus  # noqa: E402

from wdstream.chat.records import ConversationFields  # noqa: E402


def test_conversations_are_deterministic_and_parse(tmp_path: Path) -> None:
    files = corpus.build_corpus(tmp_path / "c", 200_000, part_bytes=100_000)["files"]
    a = chat_corpus.write_conversations(files, tmp_path / "a.jsonl", 300_000, seed=3)
    b = chat_corpus.write_conversations(files, tmp_path / "b.jsonl", 300_000, seed=3)
    assert Path(a["file"]).read_bytes() == Path(b["file"]).read_bytes()
    assert a["bytes"] >= 300_000 and a["records"] > 20
    fields = ConversationFields()
    roles = set()
    for line in Path(a["file"]).read_text().splitlines():
        record = fields(json.loads(line))
        roles |= {m["role"] for m in record.messages}
        assert record.messages[-1]["role"] == "assistant"
    assert roles == {"system", "user", "assistant", "tool"}


def test_section_states_goals_from_round_ratios() -> None:
    def rounds(*seconds: float, key: str = "seconds") -> list[dict[str, float]]:
        return [{"round": r, key: s} for r, s in enumerate(seconds)]

    res = {
        "corpus": {"records": 10, "bytes": 1e6},
        "cores": 2,
        "pack": {
            "baseline": rounds(10, 12),
            "wdstream-0": rounds(8, 9),
            "wdstream-2": rounds(2, 3),
        },
        "encode": {"wdstream": rounds(1, 1), "transformers": rounds(2, 2)},
        "read": {
            "chat": rounds(9, 9, key="tokens_per_s"),
            "pretraining": rounds(10, 10, key="tokens_per_s"),
        },  # fmt: skip
        "bytes": {
            "chat": {"shard_bytes": 100, "samples": 2, "dtype": "uint32"},
            "pretraining": {"shard_bytes": 100, "samples": 2, "dtype": "uint32"},
        },  # fmt: skip
        "check": {"kept": 9, "dropped": 1, "dropped_equal": True, "supervised_equal": True},
    }
    notes: list[str] = []
    text = "\n".join(chat.section({"chat": res}, notes))
    assert "per core 1.29x (1.25–1.33) (goal ≥ 1.5x: NOT met)" in text
    assert "all 2 cores vs wdstream on one 3.50x (3.00–4.00) (goal ≥ 1.9x: met)" in text
    assert "read vs pretraining rows 0.90x (0.90–0.90) (goal ≥ 0.9x: met)" in text
    assert "ChatEncoder 2.00x" in text and "0 with cl100k" in text
    assert notes and "per core" in notes[0] and "on all 2 cores 4.50x (4.00–5.00)" in notes[0]
