"""SIGKILL a real process writing through wdstream.Writer: no visible half shard and no
index.json are left, and the same records written again finish byte-identical to an
uninterrupted pack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import wdstream
from tests.conftest import make_corpus
from tests.writer_support import assert_same_dataset, visible
from wdstream.testing import committed_shards
from wdstream.write.journal import COMMAND_NAME
from wdstream.write.pack import JOURNAL_NAME

ROOT = Path(__file__).resolve().parent.parent
OPTS = {"seq_len": 31, "shard_size": "8KB", "workers": 0, "batch_bytes": 2048}
SCRIPT = """
import sys, time
import wdstream
from tests.conftest import make_corpus

if __name__ == "__main__":
    out, pause = sys.argv[1], float(sys.argv[2])
    with wdstream.Writer(out, queue_size=1, progress=False, **{opts!r}) as w:
        for text in make_corpus(n_docs=150, seed=1, stdlib_files=1):
            w.write(text)
            time.sleep(pause)  # a producer slower than the pack: shards commit meanwhile
"""


def _writer(script: Path, out: Path, pause: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(script), str(out), str(pause)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)


def test_killed_writer_leaves_no_half_shard_and_resumes(tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    wdstream.pack_records(make_corpus(n_docs=150, seed=1, stdlib_files=1), str(ref), **OPTS)
    script = tmp_path / "write.py"
    script.write_text(SCRIPT.format(opts=OPTS))
    out = tmp_path / "out"

    proc = _writer(script, out, 0.01)
    deadline = time.monotonic() + 120
    while committed_shards(out) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert proc.poll() is None, "the writer finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    journal = json.loads((out / JOURNAL_NAME).read_bytes())
    committed = {n for s in journal["shards"] for n in (s["name"], s["sidecar"], s["provenance"])}
    files = visible(out)
    # Visible: committed shards only, each as the uninterrupted pack wrote it; no index.json.
    assert set(files) == committed and "index.json" not in files
    assert all(data == (ref / name).read_bytes() for name, data in files.items())
    hidden = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert all(n in (JOURNAL_NAME, COMMAND_NAME, ".wdstream-pack.lock") or n.endswith(".partial")
               for n in hidden), hidden  # fmt: skip

    rerun = _writer(script, out, 0.0)
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err.decode()
    assert_same_dataset(out, ref)  # index.json included
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
