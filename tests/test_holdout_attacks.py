"""Regressions of the attacks on ``pack --holdout`` (``tools/faultlib/holdout.py``).

``OUTPUT/holdout`` is where the held-out dataset goes, and ``--overwrite`` clears an
earlier pack's there. Found by the leftovers attack: a symbolic link at ``OUTPUT/holdout``
was followed, so ``--overwrite`` deleted (and ``--holdout`` overwrote) another folder's
dataset outside the output; and ``--overwrite`` of a pack without ``--holdout`` deleted a
dataset of its own that merely lived at ``OUTPUT/holdout``. Oracle: the files' bytes,
compared before and after (nothing of wdstream's reader).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import wdstream

TEXTS = [f"document {i} " + "alpha beta gamma " * (i % 7 + 1) for i in range(60)]
OPTS: dict[str, Any] = dict(seq_len=31, mode="docs", workers=0, progress=False)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


def test_symlinked_holdout_folder_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "other"
    wdstream.pack_records(TEXTS, str(victim), holdout=0.3, **OPTS)  # another pack's pair
    before = _tree(victim)
    out = tmp_path / "out"
    out.mkdir()
    (out / "holdout").symlink_to(victim / "holdout")
    for holdout in (0.3, None):
        with pytest.raises(wdstream.WdstreamError, match=r"holdout is a symbolic link"):
            wdstream.pack_records(TEXTS, str(out), holdout=holdout, overwrite=True, **OPTS)
    with pytest.raises(wdstream.WdstreamError, match=r"holdout is a symbolic link"):
        wdstream.pack_records(TEXTS, str(out), holdout=0.3, **OPTS)
    assert _tree(victim) == before
    # A pack without --holdout and without --overwrite never looks there.
    wdstream.pack_records(TEXTS, str(out), **OPTS)
    assert (out / "index.json").exists() and _tree(victim) == before


def test_overwrite_without_holdout_leaves_a_dataset_that_is_no_held_out_one(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    wdstream.pack_records(TEXTS[:20], str(out / "holdout"), **OPTS)  # a dataset of its own
    mine = _tree(out / "holdout")
    wdstream.pack_records(TEXTS, str(out), overwrite=True, **OPTS)
    assert _tree(out / "holdout") == mine
    # An earlier pack's held-out dataset (stats.holdout.split) is cleared, complete...
    wdstream.pack_records(TEXTS, str(tmp_path / "pair"), holdout=0.3, **OPTS)
    split = json.loads((tmp_path / "pair" / "holdout" / "index.json").read_text())
    assert split["stats"]["holdout"]["split"] == "holdout"
    wdstream.pack_records(TEXTS, str(tmp_path / "pair"), overwrite=True, **OPTS)
    assert not [p for p in (tmp_path / "pair" / "holdout").iterdir()]
    # ... and so are loose shards with neither index nor journal (a pack killed before its
    # held-out dataset's first commit).
    shard = (out / "holdout" / "data-000000.tar").read_bytes()
    (tmp_path / "pair" / "holdout" / "data-000000.tar").write_bytes(shard)
    wdstream.pack_records(TEXTS, str(tmp_path / "pair"), overwrite=True, **OPTS)
    assert not [p for p in (tmp_path / "pair" / "holdout").iterdir()]


def test_a_file_named_holdout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "holdout").write_text("notes\n")
    with pytest.raises(wdstream.WdstreamError, match=r"holdout is not a folder"):
        wdstream.pack_records(TEXTS, str(out), holdout=0.3, **OPTS)
    wdstream.pack_records(TEXTS, str(out), overwrite=True, **OPTS)  # not ours: left alone
    assert (out / "holdout").read_text() == "notes\n" and (out / "index.json").exists()
