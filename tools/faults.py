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
    python tools/faults.py --output /tmp/rel.md --only cursor    # attacks named *cursor*
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

from wdstream import Loader, TokenDataset, WdstreamError  # noqa: E402
from wdstream.format.sidecar import ShardSidecar  # noqa: E402
from wdstream.read.sources.shards import read_index  # noqa: E402
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


def flips(
    kind: str, n: int, seed: int, **read: object
) -> Callable[[Path, float], Iterator[Attempt]]:
    """Random single-bit flips in sample bytes of tars, anywhere in tars, or in sidecars;
    the epoch read with ``read``'s Loader options on top of ``READ`` (e.g. 2 workers, which
    verify the samples they copy)."""

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
            dst = work / f"{kind}-{seed}-{i}"  # one folder per attempt of every attack

            def attempt(dst: Path = dst, name: str = name, bit: int = bit) -> str:
                return compare(lambda: read_rows(flipped(root, dst, name, bit), **read), want)

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


def _mutated(state: dict, rng: np.random.Generator) -> dict:
    """``state`` with one field (at any depth) replaced by a hostile value; the edit is
    named under the key ``_edit`` (taken out before loading)."""
    paths = list(_paths(state))
    path = paths[int(rng.integers(len(paths)))]
    bad = copy.deepcopy(state)
    target = bad
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _mutations(rng)
    bad["_edit"] = f"{'.'.join(map(str, path))} = {str(target[path[-1]])[:40]}"
    return bad


def _run_batches(make: Callable[[], Loader], n: int) -> list[np.ndarray]:
    """The first ``n`` batches' ``input_ids`` of an uninterrupted run."""
    it = iter(make())
    return [next(it)["input_ids"].numpy().copy() for _ in range(n)]


def landing(got: list[np.ndarray], run: list[np.ndarray]) -> int | None:
    """The step of the uninterrupted ``run`` from which ``got`` follows it exactly, or None."""
    for k in range(len(run) - len(got) + 1):
        if all(np.array_equal(g, run[k + j]) for j, g in enumerate(got)):
            return k
    return None


def resumed_outcome(
    make: Callable[[], Loader],
    bad: dict,
    run: list[np.ndarray],
    far: Callable[[dict], list[np.ndarray]] | None = None,
) -> str:
    """Load ``bad`` into a fresh loader: refused (clear error), or its next batches must be
    the uninterrupted run's from some step (handled, saying which), else silent wrong.

    ``run`` is the uninterrupted run recorded once, never anything computed from ``bad``.
    ``far(said)`` gives the uninterrupted run's 4 batches at the position an accepted state
    says it is at, when that lies past the recording, from a reader that never saw ``bad``
    (random access for the global order, iteration from the epoch's start for streams).
    """
    bad = dict(bad)
    edit = bad.pop("_edit", "")
    ld = make()
    try:
        ld.load_state_dict(json.loads(json.dumps(bad)))
        said = ld.state_dict()
        it = iter(ld)
        got = [next(it)["input_ids"].numpy() for _ in range(4)]
    except WdstreamError as exc:
        return "clear error" if str(exc) else "crash"
    k = landing(got, run)
    if k is not None:
        return f"handled: lands at step {k} of the uninterrupted run"
    want = far(said) if far is not None else None
    if want is not None and all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)):
        return "handled: lands past the recording, where the uninterrupted run is"
    return f"silent wrong: {edit or 'an edit'} accepted, and the next batches are no run's"


def _cursor_attempts(root: str, order: str, n: int, seed: int) -> Iterator[Attempt]:
    """A state taken after 5 batches, one field replaced by a hostile JSON value.

    Oracle: the uninterrupted run, 4 epochs recorded once; an accepted state must continue
    it from some step (past the recording: see :func:`resumed_outcome`).
    """
    opts = {**READ, "epochs": None, "order": order}

    def make() -> Loader:
        return Loader(root, **opts)

    loader = make()
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    per_epoch = len(loader)
    run = _run_batches(make, 4 * per_epoch + 10)
    clean = make()

    def far(said: dict) -> list[np.ndarray]:
        if order == "global":
            return [clean.batch_at(said["step"] + j)["input_ids"].numpy() for j in range(4)]
        c = said["streams"][0]  # one stream: the run's batch c["batches"] of epoch c["epoch"]
        ds = TokenDataset(root, READ["seq_len"], READ["batch_size"], order="streams",
                          shuffle=True, seed=READ["seed"], epochs=1)  # fmt: skip
        ds.set_epoch(c["epoch"])
        rows = [b["input_ids"].numpy() for b, _ in zip(ds, range(c["batches"] + 4), strict=False)]
        return rows[c["batches"] :]

    rng = np.random.default_rng(seed)
    for _ in range(n):
        bad = _mutated(state, rng)

        def attempt(bad: dict = bad) -> str:
            return resumed_outcome(make, bad, run, far)

        yield attempt


def cursors(work: Path, scale: float) -> Iterator[Attempt]:
    root, _ = clean_dataset(work)
    n = max(1, int(100 * scale))
    yield from _cursor_attempts(root, "global", n, 11)
    yield from _cursor_attempts(root, "streams", n, 12)


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


# ---------------------------------------------------------------- the writer


def _pack_args(src: Path, out: Path | str) -> list[str]:
    return ["pack", str(src), "-o", str(out), "--seq-len", "63", "--shard-size", "16KB",
            "--workers", "0", "-q"]  # fmt: skip


def _pack_input(work: Path) -> tuple[Path, Path]:
    """A JSONL input and its uninterrupted pack (the reference every rerun must equal)."""
    src, ref = work / "pack-in.jsonl", work / "pack-ref"
    if not ref.exists():
        src.write_text("\n".join(_corpus_lines(300)) + "\n")
        subprocess.run([sys.executable, "-m", "wdstream.cli", *_pack_args(src, ref)], check=True)
    return src, ref


def _rerun(src: Path, out: Path) -> str | None:
    """Rerun the same pack command; None when it exits 0 with no traceback, else what went
    wrong (its exit status and last line)."""
    cmd = [sys.executable, "-m", "wdstream.cli", *_pack_args(src, out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode == 0 and "Traceback" not in proc.stderr:
        return None
    said = (proc.stderr.strip().splitlines() or [""])[-1]
    return f"{'traceback' if 'Traceback' in proc.stderr else 'exit'} {proc.returncode}: {said}"


def _same_tree(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    other = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files == other and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def killed_packs(work: Path, scale: float) -> Iterator[Attempt]:
    src, ref = _pack_input(work)
    shards = len(read_index(open_store(str(ref))).shards)
    for i, at in enumerate(np.linspace(1, shards - 1, max(2, int(6 * scale))).astype(int)):
        out = work / f"killed-{i}"

        def attempt(out: Path = out, at: int = int(at)) -> str:
            cmd = [sys.executable, "-m", "wdstream.cli", *_pack_args(src, out)]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if len(list(out.glob("*.tar"))) >= at:
                    proc.kill()
                    break
                time.sleep(0.005)
            proc.wait()
            failed = _rerun(src, out)
            # Killed once it had finished (index.json published, journal removed), it left a
            # complete dataset, which the rerun refuses to overwrite and says so: fine.
            finished = (
                failed is not None
                and failed.startswith("exit")
                and ("already holds a complete dataset" in failed)
            )
            if failed is not None and not finished:
                return f"crash: the rerun failed ({failed})"
            return "handled" if _same_tree(out, ref) else "silent wrong"

        yield attempt


def special_inputs(work: Path, scale: float) -> Iterator[Attempt]:
    """A FIFO (named, in a folder, matched by a glob), /dev/zero and a socket as pack inputs:
    each must be refused naming it, before any work, not block or fill memory."""
    import socket

    d = work / "special-in"
    d.mkdir()
    (d / "a.jsonl").write_text("\n".join(_corpus_lines(20)) + "\n")
    os.mkfifo(d / "b.jsonl")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(work / "special.jsonl"))
    given = [
        [str(d / "a.jsonl"), str(d / "b.jsonl")],
        [str(d)],
        [str(d / "*.jsonl")],
        [str(d / "a.jsonl"), "/dev/zero"],
        [str(work / "special.jsonl")],
    ]
    for i, inputs in enumerate(given):
        out = work / f"special-out-{i}"

        def attempt(inputs: list[str] = inputs, out: Path = out) -> str:
            return run_cli(["pack", *inputs, "-o", str(out), "--workers", "0", "-q"], 60)

        yield attempt


def record_bombs(work: Path, scale: float) -> Iterator[Attempt]:
    """One line of 64 MiB in a few KB of .zst/.gz (and plain, and a whole .txt) under a
    1 MiB --max-record-bytes: refused naming file and line, or skipped and counted."""
    import gzip

    good = [ln.encode() + b"\n" for ln in _corpus_lines(20)]
    long_line = b'{"text": "' + b"z" * (64 << 20) + b'"}\n'
    comp = zstandard.ZstdCompressor(level=3)
    blobs = {
        "bomb.jsonl.zst": lambda data: comp.compress(data),
        "bomb.jsonl.gz": lambda data: gzip.compress(data, compresslevel=1),
        "bomb.jsonl": lambda data: data,
        "bomb.txt.zst": lambda data: comp.compress(data),
    }
    for name, encode in blobs.items():
        src = work / name
        src.write_bytes(encode(b"".join(good[:10]) + long_line + b"".join(good[10:])))
        for skip in (False, True):
            out = work / f"bomb-out-{name}-{int(skip)}"
            args = ["pack", str(src), "-o", str(out), "--workers", "0", "-q"]
            args += ["--max-record-bytes", "1MiB"] + (["--on-error", "skip"] if skip else [])
            whole_txt = name.endswith(".txt.zst")

            def ok(out: Path = out) -> bool:
                stats = read_index(open_store(str(out))).stats
                return stats["records_skipped"] == 1 and stats["documents"] == 20

            def attempt(args: list[str] = args, skip: bool = skip, whole: bool = whole_txt) -> str:
                if skip and whole:  # the only document skipped: nothing to pack, a clear error
                    return run_cli(args, 120)
                return run_cli(args, 120, ok if skip else None)

            yield attempt


def failed_shard_write(work: Path, scale: float) -> Iterator[Attempt]:
    src, ref = _pack_input(work)
    for i, k in enumerate((1, 2)):
        out = work / f"failwrite-{i}"

        def attempt(out: Path = out, k: int = k) -> str:
            blocker = out / f"data-{k:06d}.tar"
            blocker.mkdir(parents=True)  # a directory where the shard must go: its write fails
            first = run_cli(_pack_args(src, out), 120)
            blocker.rmdir()
            if first != "clear error":
                return first
            failed = _rerun(src, out)
            if failed is not None:
                return f"crash: the rerun failed ({failed})"
            return "handled" if _same_tree(out, ref) else "silent wrong"

        yield attempt


def concurrent_packs(work: Path, scale: float) -> Iterator[Attempt]:
    src, ref = _pack_input(work)
    for i in range(max(1, int(3 * scale))):
        out = work / f"concurrent-{i}"

        def attempt(out: Path = out) -> str:
            cmd = [sys.executable, "-m", "wdstream.cli", *_pack_args(src, out)]
            procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True) for _ in range(2)]  # fmt: skip
            codes = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in procs]
            ok = [c for c, _ in codes if c == 0]
            refused = [e for c, e in codes if c != 0]
            if any("Traceback" in e for e in refused):
                return "crash"
            if not ok or any("another pack" not in e for e in refused):
                return "crash"
            return "handled" if _same_tree(out, ref) else "silent wrong"

        yield attempt


# ---------------------------------------------------------------- hostile servers


def hostile_servers(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from servers import FileServer, SilentServer  # the storage tests' real servers

    limits = {"retries": 1, "timeout": 1.0, "deadline": 2.0, "budget": 3.0}

    def read_http(knobs: dict[str, object]) -> str:
        with FileServer(root) as server:
            server.faults.reset(**knobs)
            return compare(lambda: read_rows(server.base_url, **limits), want)

    yield lambda: read_http({"trickle": 0.5})
    yield lambda: read_http({"fail_first": 1000, "fail_status": 503})
    yield lambda: read_http({"cut_every": 1, "cut_at": 100})

    def silent() -> str:
        server = SilentServer()
        try:
            return compare(lambda: read_rows(server.base_url + "/ds", **limits), want)
        finally:
            server.stop()

    yield silent

    def put_501() -> str:
        with FileServer(work / "put-root") as server:
            server.faults.reset(fail_first=1000, fail_status=501, methods=("PUT",))
            src, _ = _pack_input(work)
            out = run_cli([*_pack_args(src, server.base_url + "/ds"), "--retries", "5"], 60)
            puts = [r for r in server.faults.requests if r[0] == "PUT"]
            return out if len(puts) <= 2 else "crash"  # a 501 is not retried

    yield put_501


# ---------------------------------------------------------------- node cache and lying servers


def _servers() -> tuple[type, type]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from servers import FileServer, SilentServer  # the storage tests' real servers

    return FileServer, SilentServer


def cache_files(work: Path, scale: float) -> Iterator[Attempt]:
    """Blocks of the node cache copied over, swapped with or damaged into one another, read
    back with ``checksums=False``; and two datasets that differ only by their URL's query
    string sharing one cache folder. Every read must equal the dataset's own local read."""
    from wdstream.read.sources.packed import ShardSource

    root, want = clean_dataset(work)
    file_server, _ = _servers()
    for i in range(max(3, int(30 * scale))):

        def attempt(i: int = i) -> str:
            rng = np.random.default_rng(i)
            with file_server(root) as server, tempfile.TemporaryDirectory() as cache:

                def rows() -> np.ndarray:
                    return read_rows(ShardSource(server.base_url, checksums=False, cache_dir=cache))  # type: ignore[arg-type]

                rows()  # fill the cache
                blocks = sorted(Path(cache).rglob("*.blk"))
                a, b = (Path(p) for p in rng.choice([str(p) for p in blocks], 2, replace=False))
                if i % 3 == 0:
                    shutil.copyfile(a, b)  # one block copied over another
                elif i % 3 == 1:
                    data_a, data_b = a.read_bytes(), b.read_bytes()
                    a.write_bytes(data_b)
                    b.write_bytes(data_a)  # two blocks swapped
                else:
                    raw = bytearray(b.read_bytes())
                    raw[int(rng.integers(len(raw)))] ^= 1 << int(rng.integers(8))
                    b.write_bytes(bytes(raw))  # a bit flipped anywhere in a block
                return compare(rows, want)

        yield attempt

    def by_query() -> str:
        other = work / "cache-code"
        if not other.exists():
            write_synthetic_dataset(str(other), n_docs=30, sample_tokens=33,
                                    samples_per_shard=9, dtype="uint16")  # fmt: skip
        with file_server(work) as server, tempfile.TemporaryDirectory() as cache:
            swap = {
                f"ds/{f.name}?ds={tag}": os.path.relpath(f, work)
                for tag, src in (("web", root), ("code", other))
                for f in Path(src).iterdir()
            }
            server.faults.reset(swap=swap)
            outcomes = []
            for tag, src in (("web", root), ("code", str(other)), ("web", root)):
                url = f"{server.base_url}/ds/?ds={tag}"
                local = read_rows(src)
                outcomes.append(compare(lambda u=url: read_rows(u, cache_dir=cache), local))
            return next((o for o in outcomes if o != "handled"), "handled")

    yield by_query


def lying_servers(work: Path, scale: float) -> Iterator[Attempt]:
    """A server that answers with another shard's bytes (checksums on and off, with and
    without the node cache), one that promises more bytes than it sends and goes silent
    (forever, or only the first time), and one that trickles the shards a byte per 0.05 s:
    a clear error within ``budget + read timeout`` (plus slack) or the right data."""
    from wdstream.read.sources.packed import ShardSource

    root, want = clean_dataset(work)
    file_server, _ = _servers()
    tars = sorted(p.name for p in Path(root).glob("*.tar"))
    limits = {"retries": 3, "timeout": (1.0, 0.5), "deadline": 1.0, "budget": 2.0}
    give_up = 2 * (2.0 + 0.5) + 3.0  # generous: the documented budget + read timeout, twice

    def read_http(knobs: dict[str, object], checksums: bool = True, cached: bool = False) -> str:
        with file_server(root) as server, tempfile.TemporaryDirectory() as cache:
            server.faults.reset(**knobs)
            extra = {"cache_dir": cache} if cached else {}
            t0 = time.monotonic()
            src = ShardSource(server.base_url, checksums=checksums, **limits, **extra)
            out = compare(lambda: read_rows(src), want)  # type: ignore[arg-type]
            took = time.monotonic() - t0
            return (
                out if took <= give_up or out == "handled" else f"hang: gave up after {took:.1f}s"
            )

    for k in range(max(4, int(8 * scale))):
        a, b = tars[k % len(tars)], tars[(k + 1) % len(tars)]
        yield lambda a=a, b=b, k=k: read_http(
            {"swap": {a: b}}, checksums=k % 2 == 0, cached=k % 4 >= 2
        )
    for cut_at in (0, 100, 1000):
        yield lambda c=cut_at: read_http(
            {"cut_every": 1, "cut_at": c, "stall": True, "only": ".tar"}
        )
    yield lambda: read_http({"cut_first": 1, "cut_at": 100, "stall": True, "only": ".tar"})
    yield lambda: read_http({"trickle": 0.05, "only": ".tar"})
    yield lambda: read_http({"trickle": 0.05, "only": ".tar"}, cached=True)


# ---------------------------------------------------------------- rows


def shard_url_openings(work: Path, scale: float) -> Iterator[Attempt]:
    """A best-fit pack opened by its root, a brace pattern, a glob and a list must give the
    same rows and targets (padding and document ends masked: the index beside the shards
    says so); a stray shard, one of another pack, or folders with and without an index
    must be refused, never read under a guessed meaning."""
    packs = work / "url-openings"
    if not packs.exists():
        packs.mkdir()
        src = packs / "in.jsonl"
        src.write_text("\n".join(_corpus_lines(120)) + "\n")
        for name in ("bf", "other"):
            args = ["pack", str(src), "-o", str(packs / name), "--mode", "bestfit",
                    "--seq-len", "63", "--shard-size", "8KB", "--workers", "0", "-q"]  # fmt: skip
            if name == "other":
                args[1] = str(packs / "in2.jsonl")
                (packs / "in2.jsonl").write_text("\n".join(_corpus_lines(121)[1:]) + "\n")
            subprocess.run([sys.executable, "-m", "wdstream.cli", *args], check=True)
    root, other = packs / "bf", packs / "other"
    names = sorted(p.name for p in root.glob("*.tar"))
    opts = dict(seq_len=63, batch_size=2, num_workers=0, seed=1, epochs=1)

    def targets(source: object) -> np.ndarray:
        return np.concatenate([b["labels"].numpy() for b in Loader(source, **opts)])

    want = targets(str(root))
    n = len(names)
    for opening in (str(root / f"data-{{000000..{n - 1:06d}}}.tar"), str(root / "*.tar"),
                    [str(root / x) for x in names]):  # fmt: skip
        yield lambda opening=opening: compare(lambda: targets(opening), want)

    def refused(setup: Callable[[Path], object]) -> Attempt:
        def attempt() -> str:
            d = Path(tempfile.mkdtemp(dir=work))
            shutil.copytree(root, d / "bf")
            source = setup(d)
            return compare(lambda: targets(source), np.zeros(0))  # any data is wrong here

        return attempt

    def stray(d: Path) -> object:
        for suffix in ("tar", "idx"):
            shutil.copy(other / f"data-000000.{suffix}", d / "bf" / f"stray-000000.{suffix}")
        return str(d / "bf" / "*.tar")

    def same_name(d: Path) -> object:
        for suffix in ("tar", "idx"):
            shutil.copy(other / f"data-000001.{suffix}", d / "bf" / f"data-000001.{suffix}")
        return str(d / "bf" / "data-00000{0,1}.tar")

    def mixed_folders(d: Path) -> object:
        (d / "bare").mkdir()
        for suffix in ("tar", "idx"):
            shutil.copy(root / f"data-000000.{suffix}", d / "bare" / f"data-000000.{suffix}")
        return [str(d / "bf" / "data-000001.tar"), str(d / "bare" / "data-000000.tar")]

    for setup in (stray, same_name, mixed_folders):
        yield refused(setup)


def shuffled_short_sample(work: Path, scale: float) -> Iterator[Attempt]:
    """The dataset's short last sample must never splice two samples into one row."""
    root = work / "short-last"
    if not root.exists():
        write_synthetic_dataset(str(root), n_docs=30, sample_tokens=33, samples_per_shard=4)
    for seed in range(max(2, int(8 * scale))):
        for order in ("global", "streams"):

            def attempt(seed: int = seed, order: str = order) -> str:
                rows = read_rows(str(root), seed=seed, order=order, epochs=2)
                whole = (rows[:, 0] % 33 == 0) & (np.diff(rows, axis=1) == 1).all(axis=1)
                return "handled" if whole.all() else "silent wrong"

            yield attempt


# ---------------------------------------------------------------- trust at the edges (issue 23)


def _text_parts(work: Path) -> str:
    """Four JSONL files of raw text (the issue's ``parts/p*.jsonl``)."""
    d = work / "parts"
    if not d.exists():
        d.mkdir()
        lines = _corpus_lines(240)
        for i in range(4):
            (d / f"p{i}.jsonl").write_text("\n".join(lines[i * 60 : (i + 1) * 60]) + "\n")
    return str(d)


def text_cursors(work: Path, scale: float) -> Iterator[Attempt]:
    """Every field of both raw-text cursors moved by -2, -1, +1, +2, then hostile values."""
    parts = _text_parts(work)

    def make() -> Loader:
        return Loader(f"{parts}/p*.jsonl", tokenizer="cl100k_base", seq_len=32, batch_size=4,
                      streams=2, shuffle_window=8, num_workers=0, seed=0)  # fmt: skip

    loader = make()
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    run = _run_batches(make, 60)
    edits: list[dict] = []
    for t in range(2):
        for key in state["streams"][t]:
            if key == "check":
                continue
            for delta in (-2, -1, 1, 2):
                bad = copy.deepcopy(state)
                bad["streams"][t][key] += delta
                bad["_edit"] = f"streams.{t}.{key} {delta:+d}"
                edits.append(bad)
    rng = np.random.default_rng(13)
    edits += [_mutated(state, rng) for _ in range(max(1, int(40 * scale)))]
    for bad in edits:

        def attempt(bad: dict = bad) -> str:
            return resumed_outcome(make, bad, run)

        yield attempt


def _mixture_roots(work: Path) -> tuple[str, str]:
    a, b = work / "mix-a", work / "mix-b"
    if not a.exists():
        write_synthetic_dataset(str(a), n_docs=30, sample_tokens=33, samples_per_shard=9)
        write_synthetic_dataset(str(b), n_docs=20, sample_tokens=33, samples_per_shard=9, seed=1)
    return str(a), str(b)


STEPS: list[object] = [
    -1, 0, 7, 2**40, 2**62 - 1, 2**62, 2**63 - 1, 2**63, -(2**63), 2**64, 10**30, 1.5, True,
    False, "3", None, float("nan"), float("inf"), np.int64(9), np.float64(2.0), [1],
]  # fmt: skip


def _step_outcome(call: Callable[[], dict]) -> tuple[str, object]:
    """``("refused", message)`` for the documented TypeError/ValueError naming the step,
    ``("rows", batch)`` for a batch, or a crash outcome."""
    try:
        return "rows", call()
    except (TypeError, ValueError) as exc:
        if "step" in str(exc):
            return "refused", f"{type(exc).__name__}: {exc}"
        return f"crash: {type(exc).__name__}: {exc}"[:200], None
    except Exception as exc:  # noqa: BLE001 - an OverflowError, IndexError, ... is the finding
        return f"crash: {type(exc).__name__}: {exc}"[:200], None


def mixture_steps(work: Path, scale: float) -> Iterator[Attempt]:
    """``batch_at`` of a mixture and of one dataset at hostile steps: both refuse the same
    step with the same clear error, or both give rows of the data (synthetic tokens are
    consecutive, so a read row is a run of consecutive ids); then schedule steps."""
    a, b = _mixture_roots(work)
    opts = dict(seq_len=32, batch_size=2, num_workers=0)
    for step in STEPS:

        def attempt(step: object = step) -> str:
            one = _step_outcome(lambda: Loader(a, order="global", **opts).batch_at(step))
            mix = _step_outcome(
                lambda: Loader({"a": a, "b": b}, weights={"a": 0.7, "b": 0.3}, **opts).batch_at(
                    step
                )
            )
            for kind, _ in (one, mix):
                if kind.startswith("crash"):
                    return kind
            if one[0] != mix[0]:
                return f"silent wrong: one dataset {one[0]}, mixture {mix[0]} at step {step!r}"
            if one[0] == "refused":
                return "clear error" if one[1] == mix[1] else "silent wrong: different errors"
            rows = [x["input_ids"].numpy() for x in (one[1], mix[1])]  # type: ignore[index]
            ok = all((np.diff(r, axis=1) == 1).all() for r in rows)
            return "handled" if ok else "silent wrong: rows that are no rows of the data"

        yield attempt
    for step in (2**70, 2**63, 2**62, True, 1.5, -5, "9"):

        def schedule(step: object = step) -> str:
            weights = [(0, {"a": 1, "b": 1}), (step, {"a": 1, "b": 0})]
            try:
                ld = Loader({"a": a, "b": b}, weights=weights, **opts)
            except ValueError as exc:
                return "clear error" if "schedule piece 1" in str(exc) else f"crash: {exc}"
            kind, _ = _step_outcome(lambda: next(iter(ld)))
            return "silent wrong: an unreachable piece accepted" if kind == "rows" else kind

        yield schedule


def _spec_texts(a: str, b: str) -> dict[str, str]:
    src = {"a": a, "b": b}
    return {
        "deep.json": "[" * 100_000,
        "deep-weights.json": json.dumps({"sources": src})[:-1] + ', "weights": {"a": '
        + "[" * 50_000 + "]" * 50_000 + "}}",
        "deep.toml": "a = " + "[" * 100_000,
        "deep-arrays.toml": "a = " + "[" * 5000 + "]" * 5000,
        "deep-tables.toml": "a = " + "{b = " * 5000 + "1" + "}" * 5000,
        "huge.json": " " * (2 << 20) + json.dumps({"sources": src, "weights": {"a": 1, "b": 1}}),
        "step-2-70.json": json.dumps({"sources": src, "schedule": [
            {"step": 0, "weights": {"a": 1, "b": 1}}, {"step": 2**70, "weights": {"a": 1, "b": 0}}]}),
        "step-true.json": json.dumps({"sources": src, "schedule": [
            {"step": 0, "weights": {"a": 1, "b": 1}}, {"step": True, "weights": {"a": 1, "b": 0}}]}),
        "step-float.json": json.dumps({"sources": src, "schedule": [
            {"step": 0, "weights": {"a": 1, "b": 1}}, {"step": 1.5, "weights": {"a": 1, "b": 0}}]}),
        "nan-weight.json": json.dumps({"sources": src, "weights": {"a": float("nan"), "b": 1}}),
        "not-a-table.toml": "sources = 3",
        "no-sources.json": "{}",
    }  # fmt: skip


def spec_files(work: Path, scale: float) -> Iterator[Attempt]:
    """Hostile mixture spec files: deep nesting (JSON, TOML), too large, unreachable or
    non-integer schedule steps, NaN weights, wrong shapes; each must be a ValueError naming
    the file or the piece (clear error), never a RecursionError or a first-batch failure."""
    a, b = _mixture_roots(work)
    d = work / "specs"
    d.mkdir(exist_ok=True)
    for name, text in _spec_texts(a, b).items():
        (d / name).write_text(text)

        def attempt(path: str = str(d / name)) -> str:
            try:
                ld = Loader(path, seq_len=32, batch_size=2, num_workers=0)
                next(iter(ld))
            except (ValueError, TypeError) as exc:
                said = str(exc)
                clear = path in said or "schedule piece" in said or "weight" in said
                return "clear error" if clear else f"crash: {type(exc).__name__}: {said}"[:200]
            except WdstreamError:
                return "clear error"
            return "silent wrong: a hostile spec file was read"

        yield attempt


def _decoded_docs(root: str) -> list[np.ndarray]:
    """Every sample's tokens with tarfile + msgpack (not wdstream's reader)."""
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


def bucketed_tokens(work: Path, scale: float) -> Iterator[Attempt]:
    """``max_tokens`` batches of a docs-mode pack with documents longer than ``seq_len``:
    every row served at 1-3 ranks, plus the rows ``epoch_stats`` counts as left out, must be
    every piece of every document (decoded with tarfile + msgpack) exactly once."""
    root = work / "docs-pack"
    if not root.exists():
        src = work / "docs-in.jsonl"
        src.write_text("\n".join(_corpus_lines(150)) + "\n")
        subprocess.run([sys.executable, "-m", "wdstream.cli", "pack", str(src), "-o", str(root),
                        "--mode", "docs", "--workers", "0", "-q"], check=True)  # fmt: skip
    cases = [(seq, w, seed) for seq in (16, 64) for w in (1, 2, 3) for seed in (0, 1)]
    for seq, world, seed in cases[: max(2, int(len(cases) * scale))]:

        def attempt(seq: int = seq, world: int = world, seed: int = seed) -> str:
            want: Counter = Counter()
            for d in _decoded_docs(str(root)):
                for k in range(0, len(d) - 1, seq):
                    want[tuple(d[k : k + seq + 1].tolist())] += 1
            got: Counter = Counter()
            left = 0
            for rank in range(world):
                ld = Loader(str(root), seq_len=seq, max_tokens=4 * seq, seed=seed, rank=rank,
                            world_size=world, epochs=1)  # fmt: skip
                left = ld.epoch_stats(0)["left_out_rows"]
                for bt in ld:
                    for r in range(len(bt["input_ids"])):
                        n = int(bt["attention_mask"][r].sum())
                        got[
                            tuple(bt["input_ids"][r, :n].tolist() + [int(bt["labels"][r, n - 1])])
                        ] += 1
            missing = want - got
            if got - want or sum(missing.values()) != left:
                return f"silent wrong: {sum((got - want).values())} rows extra, {sum(missing.values())} missing, {left} counted"
            return "handled"

        yield attempt


# ---------------------------------------------------------------- quarantine


def _masked_outcome(got: list[dict], events: list, want: list[dict], sample_of: Callable) -> str:
    """``handled`` when every row of ``got`` is the clean row of ``want`` or, recorded in
    ``events``, masked whole (``input_ids`` 0, ``labels`` -100) and holding a token of a
    sample an event names (clean token ``t`` is of sample ``t // 33``); else what is wrong."""
    if len(got) != len(want):
        return f"silent wrong: {len(got)} batches, the clean run has {len(want)}"
    named: dict[tuple[int, int], set[int]] = {}
    for e in events:
        named.setdefault((e.step, e.row), set()).add(sample_of(e))
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        rows = np.concatenate([w["input_ids"], w["labels"][:, -1:]], axis=1)
        for r, row in enumerate(rows):
            masked = bool((g["input_ids"][r] == 0).all() and (g["labels"][r] == -100).all())
            if (step, r) in named:
                if not masked or not named[(step, r)] <= set((row // 33).tolist()):
                    return f"silent wrong: step {step} row {r} recorded but not masked as named"
            elif not (np.array_equal(g["input_ids"][r], w["input_ids"][r])
                      and np.array_equal(g["labels"][r], w["labels"][r])):  # fmt: skip
                return f"silent wrong: step {step} row {r} differs from the clean run, unrecorded"
    return "handled"


def quarantined_rows(work: Path, scale: float) -> Iterator[Attempt]:
    """Bit flips in samples, anywhere in a tar, in a sidecar, and shards cut at a random byte,
    read with ``on_corrupt="mask"`` at 0 and 2 workers and rows of 21 tokens (across samples)."""
    root, _ = clean_dataset(work)
    opts = {**READ, "seq_len": 20}
    want = list(Loader(root, **opts))
    shards = read_index(open_store(root)).shards
    names = [s.name for s in shards]
    firsts = np.cumsum([0] + [s.samples for s in shards]).tolist()

    def sample_of(e: object) -> int:
        return firsts[names.index(e.shard.rsplit("/", 1)[1])] + e.sample  # type: ignore[attr-defined]

    rng = np.random.default_rng(11)
    for i in range(max(4, int(60 * scale))):
        kind, workers = ("sample", "tar", "idx", "cut")[i % 4], 2 * ((i // 4) % 2)
        shard = shards[int(rng.integers(len(shards)))]
        name = shard.sidecar if kind == "idx" else shard.name
        sc = ShardSidecar.from_bytes((Path(root) / shard.sidecar).read_bytes())
        k = int(rng.integers(len(sc)))
        size = (Path(root) / name).stat().st_size
        at = (int(sc.offsets[k]) * 8 + int(rng.integers(int(sc.sizes[k]) * 8)) if kind == "sample"
              else int(rng.integers(size * 8)))  # fmt: skip
        dst = work / f"quarantine-{i}"

        def attempt(dst: Path = dst, name: str = name, at: int = at, kind: str = kind,
                    workers: int = workers) -> str:  # fmt: skip
            if kind == "cut":
                shutil.copytree(root, dst)
                (dst / name).write_bytes((dst / name).read_bytes()[: at // 8])
            else:
                flipped(root, dst, name, at)
            loader = Loader(str(dst), **{**opts, "num_workers": workers}, on_corrupt="mask")
            try:
                got = list(loader)
            except WdstreamError as exc:
                return "clear error" if str(exc) else "crash"
            return _masked_outcome(got, loader.quarantined, want, sample_of)

        yield attempt


ATTACKS = [
    Attack("bit flip in sample bytes (.tar)", "1 random bit inside a sample's msgpack bytes, whole epoch read", flips("sample", 350, 1)),
    Attack("bit flip in sample bytes, 2 workers", "as above, the epoch read by 2 torch workers (each verifies the samples it copies, at the copy)", flips("sample", 100, 4, num_workers=2)),
    Attack("bit flip in sample bytes, 2 workers, document windows", "as above with `return_doc_boundaries=True` (decoded windows, verified in the read-ahead)", flips("sample", 50, 5, num_workers=2, return_doc_boundaries=True)),
    Attack("bit flip anywhere in a .tar", "1 random bit anywhere (headers, padding, data)", flips("tar", 100, 2)),
    Attack("bit flip in a sidecar (.idx)", "1 random bit anywhere in the sidecar", flips("idx", 150, 3)),
    Attack("edited index.json", "14 edits (counts, duplicates, swaps, inf/NaN, names leaving the root, ...), Loader and `verify`", index_edits),
    Attack("hostile cursor", "one field of a saved state (global and streams orders) replaced by a hostile JSON value; an accepted state must continue the uninterrupted run (recorded once; past the recording, the global order's random access of a loader that never saw the edit) from some step", cursors),
    Attack("truncated .zst input", "a .zst cut at random points (blocks flushed every 4 KB), with and without --on-error skip", truncated_zst),
    Attack("bad JSON records", "surrogate, deep nesting, huge int, not JSON, no text field; strict and --on-error skip", bad_records),
    Attack("FIFO in place of a shard", "a named pipe where a shard should be", fifo_shard),
    Attack("interrupted pack, then read", "index.json missing, journal present: Loader and `stats`", interrupted_pack),
    Attack("pack killed (SIGKILL), rerun", "killed after n shards appeared; the rerun must be byte-identical to an uninterrupted pack", killed_packs),
    Attack("special files as pack inputs", "a FIFO named, in a folder, matched by a glob; /dev/zero; a Unix socket: refused naming the path before any work", special_inputs),
    Attack("record bombs in pack inputs", "one 64 MiB line in a few KB of .zst/.gz, plain, and a whole .txt.zst, under --max-record-bytes 1MiB; strict and --on-error skip", record_bombs),
    Attack("shard write fails, rerun", "a directory where shard k must go: a clear error, then (removed) a byte-identical rerun", failed_shard_write),
    Attack("two packs into one output", "started together: one wins, the other is refused naming it, output identical", concurrent_packs),
    Attack("hostile HTTP servers", "1 byte / 0.5 s, 503 forever, every body cut, accept-and-never-answer, 501 on PUT", hostile_servers),
    Attack("raw-text cursor edits", "every field of both raw-text cursors (saved after 7 batches, 2 streams) moved by -2..+2, then 40 hostile values; accepted only if the next batches are the recorded uninterrupted run's from some step", text_cursors),
    Attack("mixture and one-dataset steps", "batch_at at hostile steps (bool, float, str, -1, 2**62, 2**63, 10**30, ...): the same clear error for one dataset and a mixture, or rows of the data; schedule pieces at unreachable or non-integer steps", mixture_steps),
    Attack("hostile mixture spec files", "deep nesting (JSON, TOML), 2 MB file, schedule steps 2**70 / true / 1.5, NaN weight, wrong shapes", spec_files),
    Attack("bucketed batches, long documents", "max_tokens batches at 1-3 ranks: served rows plus the counted left-out rows equal every piece of every document (tarfile + msgpack) exactly once", bucketed_tokens),
    Attack("node cache files and identity", "cached blocks copied over, swapped with or bit-flipped into one another, read with `checksums=False`; two datasets differing only by the URL's query string in one cache folder", cache_files),
    Attack("lying HTTP servers", "another shard's bytes (checksums on/off, cached or not), a short body then silence (always / once), a trickle of the shards: clear error within the documented time, or the right data", lying_servers),
    Attack("shards opened by URL", "a best-fit pack read by brace pattern, glob and list: targets equal the root's (padding masked); a stray shard, one of another pack, folders with and without index.json: refused", shard_url_openings),
    Attack("short last sample, shuffled", "every row of 2 shuffled epochs a whole packed sample (global and streams orders)", shuffled_short_sample),
    Attack("quarantined rows", "`on_corrupt='mask'`, 0 and 2 workers, rows across samples: 1 random bit in a sample, anywhere in a .tar or in a sidecar, or a .tar cut at a random byte; handled = every row the clean run's, or masked whole (input_ids 0, labels -100) and recorded naming a sample it holds", quarantined_rows),
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
    ap.add_argument(
        "--only", action="append", default=[], metavar="NAME",
        help="Run only the attacks whose name contains NAME (repeatable); the report then "
        "covers those only and must not replace docs/RELIABILITY.md",
    )  # fmt: skip
    args = ap.parse_args()
    attacks = [a for a in ATTACKS if not args.only or any(o in a.name for o in args.only)]
    if not attacks:
        ap.error(f"--only {args.only} matches none of: {', '.join(a.name for a in ATTACKS)}")
    rows = []
    notes: list[str] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wdstream-faults-") as tmp:
        work = Path(tmp)
        clean_dataset(work)
        for attack in attacks:
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
