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
    paths = list(_paths(state))
    path = paths[int(rng.integers(len(paths)))]
    bad = copy.deepcopy(state)
    target = bad
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _mutations(rng)
    return bad


def _cursor_attempts(root: str, order: str, n: int, seed: int) -> Iterator[Attempt]:
    """A state taken after 5 batches, one field replaced by a hostile JSON value.

    An accepted state must resume exactly at the position it names (a changed ``step`` or
    ``epoch`` may name another valid position): global order, the batches ``batch_at`` gives
    there; streams order (one stream), the batches a fresh loader reaches there.
    """
    opts = {**READ, "epochs": None, "order": order}
    loader = Loader(root, **opts)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    rng = np.random.default_rng(seed)
    for _ in range(n):
        bad = _mutated(state, rng)

        def attempt(bad: dict = bad) -> str:
            def six_batches(ld: Loader) -> np.ndarray:
                it2 = iter(ld)
                return np.concatenate([next(it2)["input_ids"].numpy() for _ in range(6)])

            try:
                ld = Loader(root, **opts)
                ld.load_state_dict(json.loads(json.dumps(bad)))
            except WdstreamError:
                return "clear error"
            if order == "global":
                at = Loader(root, **opts)
                at.load_state_dict(json.loads(json.dumps(bad)))
                k = at.state_dict()["step"]
                want = np.concatenate([at.batch_at(k + j)["input_ids"].numpy() for j in range(6)])
            else:
                # One stream: the accepted cursor names (epoch, batches); the reference walks a
                # fresh loader there (epochs of equal length in concat mode).
                cursor = ld.state_dict()["streams"][0]
                ref = Loader(root, **opts)
                skip = cursor["epoch"] * len(ref) + cursor["batches"]
                it3 = iter(ref)
                for _ in range(skip):
                    next(it3)
                want = np.concatenate([next(it3)["input_ids"].numpy() for _ in range(6)])
            return compare(lambda: six_batches(ld), want)

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


ATTACKS = [
    Attack("bit flip in sample bytes (.tar)", "1 random bit inside a sample's msgpack bytes, whole epoch read", flips("sample", 350, 1)),
    Attack("bit flip in sample bytes, 2 workers", "as above, the epoch read by 2 torch workers (each verifies the samples it copies, at the copy)", flips("sample", 100, 4, num_workers=2)),
    Attack("bit flip in sample bytes, 2 workers, document windows", "as above with `return_doc_boundaries=True` (decoded windows, verified in the read-ahead)", flips("sample", 50, 5, num_workers=2, return_doc_boundaries=True)),
    Attack("bit flip anywhere in a .tar", "1 random bit anywhere (headers, padding, data)", flips("tar", 100, 2)),
    Attack("bit flip in a sidecar (.idx)", "1 random bit anywhere in the sidecar", flips("idx", 150, 3)),
    Attack("edited index.json", "14 edits (counts, duplicates, swaps, inf/NaN, names leaving the root, ...), Loader and `verify`", index_edits),
    Attack("hostile cursor", "one field of a saved state (global and streams orders) replaced by a hostile JSON value; an accepted state must resume exactly at the position it names", cursors),
    Attack("truncated .zst input", "a .zst cut at random points (blocks flushed every 4 KB), with and without --on-error skip", truncated_zst),
    Attack("bad JSON records", "surrogate, deep nesting, huge int, not JSON, no text field; strict and --on-error skip", bad_records),
    Attack("FIFO in place of a shard", "a named pipe where a shard should be", fifo_shard),
    Attack("interrupted pack, then read", "index.json missing, journal present: Loader and `stats`", interrupted_pack),
    Attack("pack killed (SIGKILL), rerun", "killed after n shards appeared; the rerun must be byte-identical to an uninterrupted pack", killed_packs),
    Attack("shard write fails, rerun", "a directory where shard k must go: a clear error, then (removed) a byte-identical rerun", failed_shard_write),
    Attack("two packs into one output", "started together: one wins, the other is refused naming it, output identical", concurrent_packs),
    Attack("hostile HTTP servers", "1 byte / 0.5 s, 503 forever, every body cut, accept-and-never-answer, 501 on PUT", hostile_servers),
    Attack("node cache files and identity", "cached blocks copied over, swapped with or bit-flipped into one another, read with `checksums=False`; two datasets differing only by the URL's query string in one cache folder", cache_files),
    Attack("lying HTTP servers", "another shard's bytes (checksums on/off, cached or not), a short body then silence (always / once), a trickle of the shards: clear error within the documented time, or the right data", lying_servers),
    Attack("short last sample, shuffled", "every row of 2 shuffled epochs a whole packed sample (global and streams orders)", shuffled_short_sample),
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
        "--only", action="append", default=[], metavar="TEXT",
        help="Run only the attacks whose name contains TEXT (repeatable)",
    )  # fmt: skip
    args = ap.parse_args()
    rows = []
    notes: list[str] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wdstream-faults-") as tmp:
        work = Path(tmp)
        clean_dataset(work)
        for attack in [a for a in ATTACKS if not args.only or any(t in a.name for t in args.only)]:
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
