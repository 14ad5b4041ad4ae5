"""Attack wdstream with real faults and tabulate the outcomes: ``docs/RELIABILITY.md``.

Every attempt runs in a child process with a time limit and is classified as one of:

- ``clear error``: a :class:`wdstream.errors.WdstreamError`, or an ``OSError`` that names its
  file (for the CLI: a non-zero exit with an ``Error:``/``FAILED:`` message, no traceback);
- ``handled``: the data delivered equals the clean run's (the fault hit bytes nobody reads, or
  the fault was recovered from);
- ``silent wrong``: data delivered that differs from the clean run's, or exit 0 on bad input;
- ``crash``: any other exception or a traceback;
- ``hang``: the time limit ran out.

The goal is zeros in the last three columns. Usage::

    python tools/faults.py --output docs/RELIABILITY.md          # ~5 minutes on 2 cores
    python tools/faults.py --output /tmp/rel.md --scale 0.2      # a quick look
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wdstream import Loader, WdstreamError  # noqa: E402
from wdstream.format.sidecar import ShardSidecar  # noqa: E402
from wdstream.read.shards import read_index  # noqa: E402
from wdstream.storage import open_store  # noqa: E402
from wdstream.testing import write_synthetic_dataset  # noqa: E402

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


def run_cli(args: list[str], timeout: float, ok: Callable[[], bool] | None = None) -> str:
    """Outcome of a ``wdstream`` command that must fail clearly (or succeed with ``ok()``)."""
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
        return "clear error" if said.startswith(("Error:", "FAILED:")) else "crash"
    return "handled" if ok is not None and ok() else "silent wrong"


# ---------------------------------------------------------------- datasets and flips


def clean_dataset(work: Path) -> tuple[str, np.ndarray]:
    root = work / "clean"
    if not root.exists():
        write_synthetic_dataset(str(root), n_docs=30, sample_tokens=33, samples_per_shard=9)
    return str(root), read_rows(str(root))


def flipped(src: str, dst: Path, name: str, bit: int) -> str:
    shutil.copytree(src, dst)
    data = bytearray((dst / name).read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    (dst / name).write_bytes(bytes(data))
    return str(dst)


def flips(kind: str, n: int, seed: int) -> Callable[[Path, float], Iterator[Attempt]]:
    """Random single-bit flips in sample bytes of tars, anywhere in tars, or in sidecars."""

    def attempts(work: Path, scale: float) -> Iterator[Attempt]:
        root, want = clean_dataset(work)
        shards = read_index(open_store(root)).shards
        rng = np.random.default_rng([seed, n])
        for i in range(max(1, int(n * scale))):
            shard = shards[int(rng.integers(len(shards)))]
            name = shard.sidecar if kind == "idx" else shard.name
            if kind == "sample":
                sc = ShardSidecar.from_bytes((Path(root) / shard.sidecar).read_bytes())
                k = int(rng.integers(len(sc)))
                bit = int(sc.offsets[k]) * 8 + int(rng.integers(int(sc.sizes[k]) * 8))
            else:
                bit = int(rng.integers((Path(root) / name).stat().st_size * 8))
            dst = work / f"{kind}-{i}"

            def attempt(dst: Path = dst, name: str = name, bit: int = bit) -> str:
                return compare(lambda: read_rows(flipped(root, dst, name, bit)), want)

            yield attempt

    return attempts


# ---------------------------------------------------------------- index.json edits


def _edits() -> dict[str, Callable[[dict], None]]:
    def shard(i: int, key: str, value: object) -> Callable[[dict], None]:
        return lambda ix: ix["shards"][i].__setitem__(key, value)

    def swap(ix: dict) -> None:
        ix["shards"][0], ix["shards"][1] = ix["shards"][1], ix["shards"][0]

    return {
        "tokens = -1": shard(1, "tokens", -1),
        "tokens reduced": lambda ix: ix["shards"][1].__setitem__(
            "tokens", ix["shards"][1]["tokens"] - 40
        ),
        "samples = 0": shard(1, "samples", 0),
        "samples = -5": shard(1, "samples", -5),
        "shard listed twice": lambda ix: ix["shards"].__setitem__(
            2, copy.deepcopy(ix["shards"][1])
        ),
        "two shards swapped": swap,
        "tokens = inf": shard(0, "tokens", float("inf")),
        "tokens = NaN": shard(0, "tokens", float("nan")),
        "no shards key": lambda ix: ix.pop("shards"),
        "sample_tokens = 10**30": lambda ix: ix.__setitem__("sample_tokens", 10**30),
        "name ../other/x.tar": shard(1, "name", "../other/data-000001.tar"),
        "absolute sidecar name": shard(1, "sidecar", "/etc/passwd"),
        "tokens a string": shard(0, "tokens", "297"),
        "version 3": lambda ix: ix.__setitem__("version", 3),
    }


def index_edits(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    for i, (label, edit) in enumerate(_edits().items()):
        dst = work / f"index-{i}"
        shutil.copytree(root, dst)
        obj = json.loads((dst / "index.json").read_text())
        edit(obj)
        (dst / "index.json").write_text(json.dumps(obj))  # inf/NaN as JSON's Infinity/NaN

        def via_loader(dst: Path = dst) -> str:
            return compare(lambda: read_rows(str(dst)), want)

        def via_verify(dst: Path = dst) -> str:
            return run_cli(["verify", str(dst)], timeout=60)

        yield via_loader
        yield via_verify
        del label


# ---------------------------------------------------------------- hostile cursors


def _mutations(rng: np.random.Generator) -> object:
    choices: list[object] = [
        -1, 0, 1, 2, 3, 10**9, 2**70, -(2**70), 1.5, float("inf"), float("nan"), True, None,
        "0", "", [], {}, [0, 1], {"epoch": 0},
    ]  # fmt: skip
    return choices[int(rng.integers(len(choices)))]


def _paths(obj: object, prefix: tuple = ()) -> Iterator[tuple]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def cursors(work: Path, scale: float) -> Iterator[Attempt]:
    root, _ = clean_dataset(work)
    loader = Loader(root, **{**READ, "epochs": None})
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    ref = Loader(root, **{**READ, "epochs": None})
    ref.load_state_dict(state)
    ref_it = iter(ref)
    want = np.concatenate([next(ref_it)["input_ids"].numpy() for _ in range(6)])
    paths = list(_paths(state))
    rng = np.random.default_rng(11)
    for _ in range(max(1, int(200 * scale))):
        path = paths[int(rng.integers(len(paths)))]
        value = _mutations(rng)
        bad = copy.deepcopy(state)
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

        def attempt(bad: dict = bad) -> str:
            def six_batches() -> np.ndarray:
                ld = Loader(root, **{**READ, "epochs": None})
                ld.load_state_dict(json.loads(json.dumps(bad)))
                it2 = iter(ld)
                return np.concatenate([next(it2)["input_ids"].numpy() for _ in range(6)])

            return compare(six_batches, want)

        yield attempt


# ---------------------------------------------------------------- pack inputs


def _corpus_lines(n: int = 400) -> list[str]:
    rng = np.random.default_rng(5)
    words = "alpha beta gamma delta shard token sample cursor resume".split()
    return [
        json.dumps({"text": " ".join(rng.choice(words, size=int(rng.integers(5, 200))))})
        for _ in range(n)
    ]


def truncated_zst(work: Path, scale: float) -> Iterator[Attempt]:
    text = ("\n".join(_corpus_lines()) + "\n").encode()
    cctx = zstandard.ZstdCompressor(level=3)
    co = cctx.compressobj()
    blob = (
        b"".join(
            co.compress(text[i : i + 4096]) + co.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
            for i in range(0, len(text), 4096)
        )
        + co.flush()
    )
    rng = np.random.default_rng(3)
    cuts = sorted({int(c) for c in rng.integers(16, len(blob) - 1, size=max(2, int(20 * scale)))})
    for i, cut in enumerate(cuts):
        src = work / f"trunc-{i}.jsonl.zst"
        src.write_bytes(blob[:cut])
        for skip in (False, True):
            out = work / f"trunc-out-{i}-{int(skip)}"
            args = ["pack", str(src), "-o", str(out), "--seq-len", "63", "--workers", "0", "-q"]
            args += ["--on-error", "skip"] if skip else []

            def attempt(args: list[str] = args) -> str:
                return run_cli(args, timeout=120)

            yield attempt


def bad_records(work: Path, scale: float) -> Iterator[Attempt]:
    good = _corpus_lines(20)
    bad = {
        "lone surrogate": '{"text": "x\\ud800y"}',
        "100k nested [": "[" * 100_000,
        "5001-digit integer": '{"text": "a", "n": ' + "9" * 5001 + "}",
        "not JSON": "{text: nope",
        "no text field": '{"body": "x"}',
    }
    for label, line in bad.items():
        src = work / f"bad-{len(label)}-{abs(hash(label)) % 997}.jsonl"
        src.write_text("\n".join(good[:10] + [line] + good[10:]) + "\n")
        out = work / f"bad-out-{src.stem}"

        def strict(src: Path = src, out: Path = out) -> str:
            return run_cli(["pack", str(src), "-o", str(out), "--workers", "0", "-q"], 120)

        def skipping(src: Path = src, out: Path = out) -> str:
            out2 = Path(str(out) + "-skip")

            def ok() -> bool:
                stats = read_index(open_store(str(out2))).stats
                return stats["records_skipped"] == 1 and stats["documents"] == 20

            args = ["pack", str(src), "-o", str(out2), "--workers", "0", "-q", "--on-error", "skip"]
            return run_cli(args, 120, ok)

        yield strict
        yield skipping


# ---------------------------------------------------------------- storage


def fifo_shard(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    dst = work / "fifo"
    shutil.copytree(root, dst)
    (dst / "data-000001.tar").unlink()
    os.mkfifo(dst / "data-000001.tar")
    yield lambda: compare(lambda: read_rows(str(dst)), want)


def interrupted_pack(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    dst = work / "interrupted"
    shutil.copytree(root, dst)
    (dst / "index.json").unlink()
    (dst / ".wdstream-pack.json").write_text("{}")
    yield lambda: compare(lambda: read_rows(str(dst)), want)
    yield lambda: run_cli(["stats", str(dst)], timeout=60)


ATTACKS = [
    Attack("bit flip in sample bytes (.tar)", "1 random bit inside a sample's msgpack bytes, whole epoch read", flips("sample", 350, 1)),
    Attack("bit flip anywhere in a .tar", "1 random bit anywhere (headers, padding, data)", flips("tar", 100, 2)),
    Attack("bit flip in a sidecar (.idx)", "1 random bit anywhere in the sidecar", flips("idx", 150, 3)),
    Attack("edited index.json", "14 edits (counts, duplicates, swaps, inf/NaN, names leaving the root, ...), Loader and `verify`", index_edits),
    Attack("hostile cursor", "one field of a saved state replaced by a hostile JSON value", cursors),
    Attack("truncated .zst input", "a .zst cut at random points (blocks flushed every 4 KB), with and without --on-error skip", truncated_zst),
    Attack("bad JSON records", "surrogate, deep nesting, huge int, not JSON, no text field; strict and --on-error skip", bad_records),
    Attack("FIFO in place of a shard", "a named pipe where a shard should be", fifo_shard),
    Attack("interrupted pack, then read", "index.json missing, journal present: Loader and `stats`", interrupted_pack),
]  # fmt: skip


def _child(attempt: Attempt, conn: object) -> None:
    try:
        outcome = attempt()
    except Exception as exc:  # noqa: BLE001 - classify, never propagate
        outcome = f"crash: {type(exc).__name__}: {exc}"[:300]
    conn.send(outcome)  # type: ignore[attr-defined]


def run_attempt(attempt: Attempt, timeout: float) -> str:
    """Run one attempt in a forked child; a child still running at ``timeout`` is a hang."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(attempt, child))
    proc.start()
    child.close()
    if parent.poll(timeout):
        outcome = parent.recv()
        proc.join(10)
        return outcome
    proc.kill()
    proc.join()
    return "hang"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "--output", required=True, help="Markdown file to write (e.g. docs/RELIABILITY.md)"
    )
    ap.add_argument(
        "--scale", type=float, default=1.0, help="Fraction of the random attempts to make"
    )
    ap.add_argument(
        "--timeout", type=float, default=60.0, help="Seconds before an attempt is a hang"
    )
    args = ap.parse_args()
    rows = []
    notes: list[str] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wdstream-faults-") as tmp:
        work = Path(tmp)
        clean_dataset(work)
        for attack in ATTACKS:
            counts: Counter[str] = Counter()
            for attempt in attack.attempts(work, args.scale):
                outcome = run_attempt(attempt, args.timeout)
                kind = outcome.split(":", 1)[0]
                counts[kind if kind in OUTCOMES else "crash"] += 1
                if kind not in ("clear error", "handled"):
                    notes.append(f"- {attack.name}: {outcome}")
            rows.append((attack, counts))
            print(f"{attack.name}: {dict(counts)}", flush=True)
    write_report(Path(args.output), rows, notes, time.monotonic() - start)


def write_report(
    path: Path, rows: list[tuple[Attack, Counter[str]]], notes: list[str], secs: float
) -> None:
    lines = [
        "# Reliability: attacks and outcomes",
        "",
        "Generated by `python tools/faults.py --output docs/RELIABILITY.md` "
        f"({secs:.0f} s on this machine). Each attempt runs in its own process with a time "
        "limit. *clear error*: a `WdstreamError` or an `OSError` naming its file (CLI: non-zero "
        "exit, an `Error:`/`FAILED:` message, no traceback); *handled*: the data delivered equals the clean run's (the fault hit bytes "
        "nobody reads, or was recovered from); *silent wrong*: other data delivered, or exit 0 "
        "on bad input; *crash*: any other exception or a traceback; *hang*: out of time.",
        "",
        "| attack | how | attempts | " + " | ".join(OUTCOMES) + " |",
        "|---|---|---|" + "---|" * len(OUTCOMES),
    ]
    for attack, counts in rows:
        cells = " | ".join(str(counts.get(o, 0)) for o in OUTCOMES)
        lines.append(f"| {attack.name} | {attack.how} | {sum(counts.values())} | {cells} |")
    total = Counter()
    for _, c in rows:
        total.update(c)
    cells = " | ".join(f"**{total.get(o, 0)}**" for o in OUTCOMES)
    lines.append(f"| **all** | | **{sum(total.values())}** | {cells} |")
    lines += ["", "## Not clear or not handled", ""] + (notes or ["None."])
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
