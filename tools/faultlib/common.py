"""What every attack shares: outcomes, the clean dataset and its rows, the CLI run,
the input corpus."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wdstream import Loader, WdstreamError
from wdstream.testing import write_synthetic_dataset

OUTCOMES = ("clear error", "handled", "silent wrong", "crash", "hang")
READ = dict(seq_len=32, batch_size=2, num_workers=0, shuffle=True, seed=3, epochs=1)
Attempt = Callable[[], str]  # runs in the child; returns an outcome


@dataclass
class Attack:
    """One row of the table: what is attacked, how, and the attempts to make."""

    name: str
    how: str
    attempts: Callable[[Path, float], Iterator[Attempt]]


def read_rows(root: str, state: dict | None = None, **kw: object) -> np.ndarray:
    """Every row of one epoch (input_ids plus the last label), after ``state`` if given."""
    loader = Loader(root, **{**READ, **kw})
    if state is not None:
        loader.load_state_dict(state)
    batches = [np.concatenate([b["input_ids"], b["labels"][:, -1:]], axis=1) for b in loader]
    return np.concatenate(batches) if batches else np.zeros((0, 33), dtype=np.int64)


def compare(fn: Callable[[], np.ndarray], want: np.ndarray) -> str:
    """Outcome of reading: clear error, handled (same data) or silent wrong."""
    try:
        got = fn()
    except WdstreamError as exc:
        return "clear error" if str(exc) else "crash"
    except OSError as exc:
        if exc.filename is None:  # an OS error that does not say which file is not clear
            raise
        return "clear error"
    same = got.shape == want.shape and np.array_equal(got, want)
    return "handled" if same else "silent wrong"


def run_cli(
    args: list[str], timeout: float, ok: Callable[[], bool] | None = None, names: str = ""
) -> str:
    """Outcome of a ``wdstream`` command that must fail clearly (or succeed with ``ok()``);
    a failure is clear only if its message names ``names`` (a ``file:line``, a file)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "wdstream.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return "hang"
    if "Traceback" in proc.stderr:
        return "crash"
    if proc.returncode != 0:
        said = (proc.stderr + proc.stdout).strip()
        if not said.startswith(("Error:", "FAILED:")):
            return "crash"
        return (
            "clear error"
            if names in said
            else f"crash: the error does not name {names}: {said}"[:300]
        )
    return "handled" if ok is not None and ok() else "silent wrong"


def clean_dataset(work: Path) -> tuple[str, np.ndarray]:
    """The synthetic dataset every read attack damages a copy of, and its clean rows."""
    root = work / "clean"
    if not root.exists():
        write_synthetic_dataset(str(root), n_docs=30, sample_tokens=33, samples_per_shard=9)
    return str(root), read_rows(str(root))


def flipped(src: str, dst: Path, name: str, bit: int) -> str:
    """A copy of dataset ``src`` at ``dst`` with bit ``bit`` of file ``name`` flipped."""
    shutil.copytree(src, dst)
    data = bytearray((dst / name).read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    (dst / name).write_bytes(bytes(data))
    return str(dst)


def corpus_lines(n: int = 400) -> list[str]:
    """``n`` JSON lines of text (5-200 words each), the same on every call."""
    rng = np.random.default_rng(5)
    words = "alpha beta gamma delta shard token sample cursor resume".split()
    return [
        json.dumps({"text": " ".join(rng.choice(words, size=int(rng.integers(5, 200))))})
        for _ in range(n)
    ]


def test_servers() -> tuple[type, type]:
    """The storage tests' real HTTP servers (``tests/servers.py``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from servers import FileServer, SilentServer  # the storage tests' real servers

    return FileServer, SilentServer


def stored_samples(root: str) -> list[np.ndarray]:
    """Every sample's stored tokens (bit 31 kept: a masked dataset's no-loss flag), in shard
    and sample order, decoded with tarfile + msgpack (not wdstream's reader)."""
    import tarfile

    import msgpack

    docs = []
    for shard in json.loads((Path(root) / "index.json").read_text())["shards"]:
        with tarfile.open(Path(root) / shard["name"]) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m) if m.name.endswith((".mp", ".msgpack")) else None
                if f is not None:
                    x = msgpack.unpackb(f.read())
                    dt = {"uint16": "<u2", "uint32": "<u4"}[x["dtype"]]
                    docs.append(np.frombuffer(x["tokens"], dtype=dt).astype(np.int64))
    return docs


def split_mask(stored: np.ndarray) -> tuple[list[int], list[int]]:
    """Stored tokens of a masked dataset as (ids, mask): bit 31 cleared, 1 where it was clear
    (the token carries loss), by ``docs/FORMAT.md``'s rule, not wdstream's code."""
    return [int(x) & 0x7FFFFFFF for x in stored], [int(not x >> 31) for x in stored]


def index_stats(root: Path) -> dict:
    """``index.json``'s ``stats``, read with json."""
    return json.loads((root / "index.json").read_text())["stats"]


def run_checked(
    args: list[str], timeout: float, wrong: Callable[[], str | None], names: str = ""
) -> str:
    """:func:`run_cli`, where a command that succeeds is handled when ``wrong()`` (run after
    it, against an independent oracle) finds nothing, else ``silent wrong: what``."""
    found: list[str] = []

    def ok() -> bool:
        said = wrong()
        found.extend([said] if said else [])
        return said is None

    outcome = run_cli(args, timeout, ok, names)
    return f"silent wrong: {found[0]}"[:300] if outcome == "silent wrong" and found else outcome


def labelled(label: str, outcome: str) -> str:
    """``outcome`` with ``label`` (the hostile input) named when it is neither clear nor
    handled, so the report's notes say which input it was."""
    kind, _, rest = outcome.partition(": ")
    return outcome if kind in ("clear error", "handled") else f"{kind}: {label}: {rest or kind}"
