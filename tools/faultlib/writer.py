"""The Python writer (``wdstream.Writer``, ``pack_records``): the caller's iterable raising
mid-way, a writing process killed, objects that are no records.

Oracle: ``pack_records`` of the same good records, uninterrupted, in a process of its own:
a stopped pack resumed with the same records must end byte-identical to it (every file,
``index.json`` included), and records refused or skipped must leave exactly its samples.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from faultlib.common import Attempt, corpus_lines, labelled, stored_samples
from faultlib.packs import same_tree
from wdstream import WdstreamError, Writer, pack_records
from wdstream.testing import committed_shards

OPTS = {"seq_len": 31, "shard_size": "8KB", "workers": 0, "progress": False}
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys, time
import wdstream

out, pause = sys.argv[1], float(sys.argv[2])
texts = [json.loads(line)["text"] for line in open(sys.argv[3])]
with wdstream.Writer(out, queue_size=1, **{opts!r}) as w:
    for text in texts:
        w.write(text)
        time.sleep(pause)  # slower than the pack: shards commit meanwhile
"""


def _texts() -> list[str]:
    return [json.loads(line)["text"] for line in corpus_lines(200)]


def _reference(work: Path) -> Path:
    ref = work / "writer-ref"
    if not ref.exists():
        pack_records(_texts(), str(ref), **OPTS)
    return ref


class CallerBug(Exception):
    """What the caller's iterable raises: it must come back to the caller unchanged."""


def _raising(texts: list[str], at: int) -> Iterator[str]:
    for i, text in enumerate(texts):
        if i == at:
            raise CallerBug(f"record {i}")
        yield text


def caller_raises(work: Path, at: int, via_writer: bool) -> str:
    """The records stop with the caller's exception at record ``at``; then the same records
    again, whole: the dataset must equal the uninterrupted pack's."""
    ref, out = _reference(work), work / f"writer-raise-{at}-{int(via_writer)}"
    try:
        if via_writer:
            with Writer(str(out), **OPTS) as w:
                for text in _raising(_texts(), at):
                    w.write(text)
        else:
            pack_records(_raising(_texts(), at), str(out), **OPTS)
        return "silent wrong: the caller's exception did not come back"
    except CallerBug as exc:
        if str(exc) != f"record {at}":
            return f"crash: another exception came back ({exc})"
    if (out / "index.json").exists():
        return "silent wrong: a stopped pack published index.json"
    pack_records(_texts(), str(out), **OPTS)
    return "handled" if same_tree(out, ref) else "silent wrong: the resumed dataset differs"


def killed_writer(work: Path, shards: int, i: int) -> str:
    """A process writing through ``Writer``, SIGKILLed once ``shards`` are committed; the
    same script again must finish byte-identical to the uninterrupted pack."""
    ref, out = _reference(work), work / f"writer-killed-{i}"
    script, texts = work / "writer-script.py", work / "writer-texts.jsonl"
    script.write_text(SCRIPT.format(opts=OPTS))
    texts.write_text("\n".join(corpus_lines(200)) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(pause: float) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, str(script), str(out), str(pause), str(texts)]
        return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)

    proc = run(0.004)
    deadline = time.monotonic() + 40
    while committed_shards(out) < shards and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rerun = run(0.0)
    _, err = rerun.communicate(timeout=50)
    if rerun.returncode != 0:
        said = (err.decode().strip().splitlines() or [""])[-1]
        return f"crash: the rerun failed ({said[:200]})"
    return "handled" if same_tree(out, ref) else "silent wrong: the resumed dataset differs"


BAD = {"object()": object(), "None": None, "3.5": 3.5, "bytes": b"xx", "7": 7,
       "set": {"a"}, "dict without text": {"body": "x"}, "text a number": {"text": 5},
       "list of str": ["a", "b"], "lone surrogate": "a\ud800b", "text a dict": {"text": {"a": 1}}}  # fmt: skip


def non_records(work: Path, label: str, skip: bool) -> str:
    """One object that is no record written among 20 texts: refused naming ``<records>:11``
    (and raised by ``write`` or ``close``), or skipped, counted, and the rest packed as the
    20 texts alone are."""
    texts = _texts()[:20]
    ref = work / "writer-20"
    if not ref.exists():
        pack_records(texts, str(ref), **OPTS)
    out = work / f"writer-bad-{abs(hash(label)) % 10**6}-{int(skip)}"
    try:
        with Writer(str(out), **OPTS, on_error="skip" if skip else "raise") as w:
            for r in [*texts[:10], BAD[label], *texts[10:]]:
                w.write(r)
    except WdstreamError as exc:
        if skip:
            return f"crash: skipping, the writer raised {exc}"
        return "clear error" if "<records>:11" in str(exc) else f"crash: unnamed: {exc}"
    if not skip:
        return "silent wrong: accepted"
    stats = json.loads((out / "index.json").read_text())["stats"]
    got, want = stored_samples(str(out)), stored_samples(str(ref))
    same = len(got) == len(want) and all((a == b).all() for a, b in zip(got, want, strict=True))
    return "handled" if same and stats["records_skipped"] == 1 else "silent wrong"


def python_writer(work: Path, scale: float) -> Iterator[Attempt]:
    """See the module docstring."""
    for at in (0, 37, 150):
        for via_writer in (False, True):
            yield lambda at=at, w=via_writer: caller_raises(work, at, w)
    for i, shards in enumerate((1, 3, 5)[: max(2, int(3 * scale))]):
        yield lambda shards=shards, i=i: killed_writer(work, shards, i)
    for label in BAD:
        for skip in (False, True):
            yield lambda label=label, skip=skip: labelled(label, non_records(work, label, skip))
