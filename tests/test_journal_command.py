"""The pack journal's command object: the fingerprint (every input file) and the inputs'
ctimes are written once beside the live journal, which names them by sha256, so that a
commit's journal write does not grow with the number of input files; a journal of the
versions before (fingerprint inside) still resumes, and a command object that is gone or
not the one named is refused with the journal's name."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import wdstream
from tests.conftest import make_corpus
from tests.test_pack_resume import _interrupted_writer
from wdstream.storage import LocalStore
from wdstream.write import journal
from wdstream.write.journal import COMMAND_NAME, JOURNAL_NAME, journal_fingerprint, segment_name

KW: dict[str, Any] = dict(seq_len=31, shard_size="8KB", workers=0, progress=False)


def _inputs(root: Path, n: int) -> list[str]:
    """``n`` JSONL files of a few documents each (the pack's inputs)."""
    root.mkdir()
    texts = make_corpus(n_docs=3 * n, seed=3)
    paths = []
    for i in range(n):
        path = root / f"part-{i:04d}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[3 * i : 3 * i + 3]))
        paths.append(str(path))
    return paths


def _interrupt(inputs: list[str], out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(LocalStore, "writer", _interrupted_writer("data-000004.tar"))
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack(inputs, str(out), **KW)


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file() and p.name[0] != "."
    }


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[str, bytes]]:
    """120 input files and the uninterrupted pack of them."""
    root = tmp_path_factory.mktemp("journal_command")
    inputs = _inputs(root / "in", 120)
    wdstream.pack(inputs, str(root / "ref"), **KW)
    return inputs, _files(root / "ref")


def test_the_live_journal_names_the_command_and_does_not_grow_with_the_inputs(
    tmp_path: Path, packed: tuple[list[str], dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs, expected = packed
    out = tmp_path / "out"
    _interrupt(inputs, out, monkeypatch)
    raw = (out / JOURNAL_NAME).read_bytes()
    live = json.loads(raw)
    command_raw = (out / COMMAND_NAME).read_bytes()
    command = json.loads(command_raw)
    assert live["version"] == 3 and live["command"] == hashlib.sha256(command_raw).hexdigest()
    assert "fingerprint" not in live and "input_ctimes" not in live
    assert [f[0] for f in command["fingerprint"]["inputs"]] == inputs
    assert len(command["input_ctimes"]) == len(inputs)
    assert not any(p.encode() in raw for p in inputs)  # what a commit rewrites names no input
    res = wdstream.pack(inputs, str(out), **KW)
    assert res.resumed_shards == 4 and _files(out) == expected
    assert not [p.name for p in out.iterdir() if p.name.startswith(".wdstream-pack")]


def test_a_journal_with_the_fingerprint_inside_still_resumes(
    tmp_path: Path, packed: tuple[list[str], dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack interrupted by the version before (journal version 2: the fingerprint and
    ctimes in every live journal, no command object) resumes byte-identical."""
    inputs, expected = packed
    out = tmp_path / "out"
    _interrupt(inputs, out, monkeypatch)
    live = json.loads((out / JOURNAL_NAME).read_text())
    command = json.loads((out / COMMAND_NAME).read_text())
    del live["command"]
    (out / JOURNAL_NAME).write_text(json.dumps({**live, **command, "version": 2}))
    (out / COMMAND_NAME).unlink()
    res = wdstream.pack(inputs, str(out), **KW)
    assert res.resumed_shards == 4 and _files(out) == expected
    again = tmp_path / "again"  # and its fingerprint is compared, not skipped
    _interrupt(inputs, again, monkeypatch)
    live = json.loads((again / JOURNAL_NAME).read_text())
    fingerprint = json.loads((again / COMMAND_NAME).read_text())["fingerprint"]
    old = {**live, "version": 2, "fingerprint": {**fingerprint, "seq_len": 63}}
    (again / JOURNAL_NAME).write_text(json.dumps(old))
    with pytest.raises(wdstream.WdstreamError, match=r"differs in: seq_len"):
        wdstream.pack(inputs, str(again), **KW)


@pytest.mark.parametrize("damage", ["gone", "other", "not an object"])
def test_a_command_object_gone_or_not_the_one_named_is_refused(
    tmp_path: Path,
    packed: tuple[list[str], dict[str, bytes]],
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:
    inputs, expected = packed
    out = tmp_path / "out"
    _interrupt(inputs, out, monkeypatch)
    command = out / COMMAND_NAME
    if damage == "gone":
        command.unlink()
    elif damage == "other":
        command.write_text(command.read_text().replace('"seq_len": 31', '"seq_len": 63'))
    else:
        live = json.loads((out / JOURNAL_NAME).read_text())
        command.write_text("[1, 2]")
        live["command"] = hashlib.sha256(b"[1, 2]").hexdigest()
        (out / JOURNAL_NAME).write_text(json.dumps(live))
    with pytest.raises(
        wdstream.WdstreamError, match=r"\.wdstream-pack\.json: unreadable pack journal"
    ):
        wdstream.pack(inputs, str(out), **KW)
    res = wdstream.pack(inputs, str(out), overwrite=True, **KW)
    assert res.resumed_shards == 0 and _files(out) == expected
    assert not [p.name for p in out.iterdir() if p.name.startswith(".wdstream-pack")]


def _named(out: Path, data: bytes) -> None:
    """Replace the command object with ``data`` and name it in the live journal."""
    (out / COMMAND_NAME).write_bytes(data)
    live = json.loads((out / JOURNAL_NAME).read_text())
    live["command"] = hashlib.sha256(data).hexdigest()
    (out / JOURNAL_NAME).write_text(json.dumps(live))


@pytest.mark.parametrize(
    "damage",
    ["fingerprint a list", "fingerprint a string", "no fingerprint", "deep", "deep live"],
)
def test_a_named_command_object_without_a_fingerprint_object_is_refused(
    tmp_path: Path,
    packed: tuple[list[str], dict[str, bytes]],
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:
    """A command object that the live journal names but that holds no fingerprint object
    (or JSON nested past the parser's depth, in it or in the live journal) is refused as
    an unreadable journal: it was an AttributeError or RecursionError (a traceback)."""
    inputs, expected = packed
    out = tmp_path / "out"
    _interrupt(inputs, out, monkeypatch)
    deep = b"[" * 100_000 + b"]" * 100_000
    bodies = {"fingerprint a list": b'{"fingerprint": [1, 2]}',
              "fingerprint a string": b'{"fingerprint": "abc"}',
              "no fingerprint": b'{"input_ctimes": []}', "deep": deep}  # fmt: skip
    if damage == "deep live":
        (out / JOURNAL_NAME).write_bytes(deep)
    else:
        _named(out, bodies[damage])
    with pytest.raises(
        wdstream.WdstreamError, match=r"\.wdstream-pack\.json: unreadable pack journal"
    ):
        wdstream.pack(inputs, str(out), **KW)
    with pytest.raises(ValueError):  # what the chat pack's `now` and the holdout's check catch
        journal_fingerprint(LocalStore(str(out)))
    res = wdstream.pack(inputs, str(out), overwrite=True, **KW)
    assert res.resumed_shards == 0 and _files(out) == expected


@pytest.mark.parametrize("holdout", [None, 0.25])
def test_a_pack_stopped_while_removing_its_journal_leaves_nothing_after_the_rerun(
    tmp_path: Path,
    packed: tuple[list[str], dict[str, bytes]],
    monkeypatch: pytest.MonkeyPatch,
    holdout: float | None,
) -> None:
    """Stopped after index.json and the live journal's removal, before its segments and
    command object went (and, with a holdout, before the held-out dataset's journal went):
    the rerun refuses the complete dataset as before, and removes those leftovers (nothing
    else ever did but --overwrite)."""
    inputs, expected = packed
    out, ref = tmp_path / "out", tmp_path / "ref"
    kw = {**KW, "holdout": holdout}
    if holdout is not None:
        wdstream.pack(inputs, str(ref), **kw)
        expected = _files(ref)
    real = LocalStore.delete

    def delete(self: LocalStore, name: str) -> None:
        if name == COMMAND_NAME and not (Path(self.root) / JOURNAL_NAME).exists():
            raise KeyboardInterrupt
        real(self, name)

    with monkeypatch.context() as patch:
        patch.setattr(journal, "SEGMENT", 4)
        patch.setattr(LocalStore, "delete", delete)
        with pytest.raises(KeyboardInterrupt):
            wdstream.pack(inputs, str(out), **kw)
        (out / segment_name(0)).write_text("{}")  # as if stopped before the segments went
    assert _files(out) == expected and (out / COMMAND_NAME).exists()
    if holdout is not None:
        assert (out / "holdout" / JOURNAL_NAME).exists() and _files(out / "holdout")
    with pytest.raises(wdstream.WdstreamError, match="already holds a complete dataset"):
        wdstream.pack(inputs, str(out), **kw)
    assert _files(out) == expected
    if holdout is not None:
        assert _files(out / "holdout") == _files(ref / "holdout")
    assert not [p for p in out.rglob(".wdstream-pack*")]
