"""``pack --holdout`` at its edges (hostile fractions, a server failing the held-out index,
every reader pointed at the pair) and the shard size chosen from the input's size (inputs
that change size under a resume, compressed inputs, tiny and huge files, no bytes).

Oracles outside wdstream: the split computed from ``docs/PACK.md``'s rule on documents
decoded with tarfile + msgpack (``holdout.split_wrong``), the uninterrupted pack's bytes,
the size rule computed here from ``os.path.getsize``, and json of ``index.json``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np

from faultlib.common import Attempt, corpus_lines, index_stats, labelled, test_servers
from faultlib.holdout import cli, holdout_args, holdout_input, reference, split_wrong
from faultlib.packs import same_tree
from wdstream import Loader, WdstreamError, Writer, pack

FRACTIONS: list[object] = [
    0, 1, -0.0, 1e-300, 5e-324, 0.999999, 1 - 2**-53, float("nan"), float("inf"),
    float("-inf"), "0.01", True, False, np.float64(0.25), np.float32(0.25), Fraction(1, 4),
    Decimal("0.25"), 2**64, [0.25], 0.5,
]  # fmt: skip


def _api(value: object, via_writer: bool, out: Path, texts: list[str]) -> str:
    """Pack ``texts`` (docs mode) with ``holdout=value``: refused naming holdout, a clear
    error, or a pair split by the rule computed here."""
    try:
        if via_writer:
            with Writer(str(out), seq_len=31, mode="docs", workers=0, progress=False,
                        holdout=value) as w:  # fmt: skip
                for text in texts:
                    w.write(text)
        else:
            pack([str(out.parent / "in.jsonl")], str(out), seq_len=31, mode="docs", workers=0,
                 holdout=value)  # type: ignore[arg-type]  # fmt: skip
    except (TypeError, ValueError) as exc:
        return "clear error" if "holdout" in str(exc) else f"crash: {exc}"
    except WdstreamError as exc:
        return "clear error" if str(exc) else "crash"
    if (out / "holdout" / "index.json").exists() != (out / "index.json").exists():
        return "silent wrong: one dataset of the pair published"
    fraction = float(value)  # type: ignore[arg-type]
    wrong = split_wrong(out, fraction)
    return f"silent wrong: {wrong}" if wrong else "handled"


def holdout_fractions(work: Path, scale: float) -> Iterator[Attempt]:
    """``pack(holdout=F)`` and ``Writer(holdout=F)`` for F at and past the edges."""
    texts = [json.loads(line)["text"] for line in corpus_lines(120)]
    folder = work / "hfrac"
    folder.mkdir(exist_ok=True)
    (folder / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    for i, value in enumerate(FRACTIONS):
        for via_writer in (False, True):

            def attempt(i: int = i, value: object = value, via_writer: bool = via_writer) -> str:
                out = folder / f"out-{i}-{int(via_writer)}"
                return labelled(repr(value), _api(value, via_writer, out, texts))

            yield attempt


def holdout_remote(work: Path, scale: float) -> Iterator[Attempt]:
    """An HTTP output (PUT) whose server cannot store the held-out ``index.json`` (or the
    training one): the pack fails clearly, publishing no training ``index.json``; fixed,
    the same command resumes to the local pack's bytes for both datasets."""
    file_server, _ = test_servers()
    src = holdout_input(work)
    for blocked in ("holdout/index.json", "index.json", "holdout/index.shards"):

        def attempt(blocked: str = blocked) -> str:
            ref = reference(work, "concat")
            root = work / f"hremote-{blocked.replace('/', '-')}"
            (root / "out" / blocked).mkdir(parents=True)  # the server's PUT there fails
            with file_server(root) as server:
                args = holdout_args(src, f"{server.base_url}/out", "concat")
                code, said = cli(args)
                if code == 0 or not _clear(said):
                    return labelled(blocked, f"crash: the failed PUT: {said.strip()}"[:300])
                if (root / "out" / "index.json").is_file():
                    return labelled(blocked, "silent wrong: training index.json published")
                (root / "out" / blocked).rmdir()
                code, said = cli(args)
                if code != 0:
                    return labelled(blocked, f"crash: the rerun: {said.strip()}"[:300])
            got = root / "out"
            for junk in got.rglob(".put-*"):  # the test server's own temporary files of the
                junk.unlink()  # PUTs it failed (its os.replace onto a folder), not wdstream's
            for lock in got.rglob(".wdstream-pack.lock"):
                return labelled(blocked, f"silent wrong: {lock} left behind")
            return "handled" if same_tree(got, ref) else labelled(blocked, "silent wrong: differs")

        yield attempt


def _rows(root: str) -> list[tuple[int, ...]]:
    """Every row of one ordered epoch of ``root`` (a dataset or a shard glob)."""
    loader = Loader(root, seq_len=31, batch_size=1, epochs=1, shuffle=False, num_workers=0)
    return [tuple(b["input_ids"][0].tolist()) for b in loader]


def _stripped(ref: Path, work: Path) -> Path:
    """A copy of the training dataset alone (no ``holdout/``)."""
    alone = work / "hread-alone"
    if not alone.exists():
        shutil.copytree(ref, alone, ignore=shutil.ignore_patterns("holdout"))
    return alone


def holdout_readers(work: Path, scale: float) -> Iterator[Attempt]:
    """The Loader at OUTPUT (root and ``*.tar`` glob) reads exactly the training dataset
    alone; a mixture of both reads rows of either; verify/stats/inspect/explain on both
    sides answer without a traceback, verify counting what index.json says."""
    checks: dict[str, Callable[[Path, Path], str | None]] = {
        "root": lambda ref, alone: None if _rows(str(ref)) == _rows(str(alone)) else "rows",
        "glob": lambda ref, alone: (
            None if _rows(f"{ref}/*.tar") == _rows(f"{alone}/*.tar") else "glob rows"
        ),
        "mixture": _mixture_rows,
    }
    for name, check in checks.items():

        def attempt(name: str = name, check: Callable[[Path, Path], str | None] = check) -> str:
            ref = reference(work, "concat")
            try:
                wrong = check(ref, _stripped(ref, work))
            except WdstreamError as exc:
                return "clear error" if str(exc) else "crash"
            return labelled(name, f"silent wrong: {wrong}") if wrong else "handled"

        yield attempt
    for command in ("verify", "stats", "inspect", "explain"):
        for sub in ("", "holdout"):

            def cli_attempt(command: str = command, sub: str = sub) -> str:
                root = reference(work, "concat") / sub
                extra = ["--step", "0", "--batch-size", "2"] if command == "explain" else []
                code, said = cli([command, str(root), *extra])
                if code != 0 or "Traceback" in said:
                    return labelled(f"{command} {sub}", f"crash: {said.strip()[-200:]}")
                index = json.loads((root / "index.json").read_text())
                if command == "verify" and f"{len(index['shards'])} shards" not in said:
                    return labelled(sub, f"silent wrong: verify said {said.strip()}")
                if command == "explain" and "holdout-in.jsonl:" not in said:
                    return labelled(sub, f"silent wrong: explain names no input: {said[:200]}")
                return "handled"

            yield cli_attempt


def _mixture_rows(ref: Path, alone: Path) -> str | None:
    train, held = set(_rows(str(alone))), set(_rows(str(ref / "holdout")))
    mix = Loader({"train": str(ref), "held": str(ref / "holdout")},
                 weights={"train": 0.5, "held": 0.5}, seq_len=31, batch_size=2,
                 num_workers=0)  # fmt: skip
    for step, batch in zip(range(20), mix, strict=False):
        for row in batch["input_ids"].tolist():
            if tuple(row) not in train | held:
                return f"mixture row at step {step} is no row of either dataset"
    return None


def _clear(said: str) -> bool:
    """A failed command's output is one ``Error:`` line at its end (after any notices, such as
    taking over a dead pack's lock), with no traceback."""
    lines = said.strip().splitlines()
    return "Traceback" not in said and bool(lines) and lines[-1].startswith("Error:")


def _want_bytes(input_bytes: int | None) -> int:
    """docs/PACK.md's size rule, computed here."""
    if input_bytes is None:
        return 256_000_000
    return min(max(math.ceil(input_bytes / 128), 1_000_000), 256_000_000)


def _big_text(path: Path, mb: float) -> None:
    lines = corpus_lines(400)
    reps = int(mb * 1e6 / sum(len(x) + 1 for x in lines)) + 1
    path.write_text("\n".join(lines * reps) + "\n")


def shard_sizing(work: Path, scale: float) -> Iterator[Attempt]:
    """Shard size from the input's size: recorded as the rule computed here says (plain,
    gzip, a glob of tiny and huge files, stdin; the held-out one from its share); a pack
    killed after its first shard, then its input grown or cut, is refused on rerun (never
    silently re-sized); restored, it resumes to the uninterrupted bytes; an empty input is
    a clear error."""
    folder = work / "hsize"
    folder.mkdir(exist_ok=True)
    big = folder / "big.jsonl"
    if not big.exists():
        _big_text(big, 3.2)
        (folder / "tiny.jsonl").write_text("\n".join(corpus_lines(40)) + "\n")
        with gzip.open(folder / "big.jsonl.gz", "wb") as gz:
            gz.write(big.read_bytes())
        (folder / "empty.jsonl").write_bytes(b"")
    base = ["--seq-len", "255", "--workers", "0", "-q"]

    def recorded(inputs: list[str], expect: int | None, holdout: bool = False) -> str:
        out = folder / f"rec-{len(list(folder.iterdir()))}"
        extra = ["--holdout", "0.25"] if holdout else []
        code, said = cli(["pack", *inputs, "-o", str(out), *base, *extra])
        if code != 0:
            return "clear error" if _clear(said) else f"crash: {said.strip()}"[:300]
        got = index_stats(out)["shard_bytes"]
        if got != _want_bytes(expect):
            return f"silent wrong: shard_bytes {got}, the rule says {_want_bytes(expect)}"
        if holdout:
            held = index_stats(out / "holdout")["shard_bytes"]
            share = _want_bytes(int(expect * 0.25)) if expect is not None else _want_bytes(None)
            if held != share:
                return f"silent wrong: held-out shard_bytes {held}, the rule says {share}"
        return "handled"

    size = lambda *names: sum((folder / n).stat().st_size for n in names)  # noqa: E731
    yield lambda: recorded([str(big)], size("big.jsonl"))
    yield lambda: recorded([str(folder / "big.jsonl.gz")], size("big.jsonl.gz"))
    yield lambda: recorded(
        [str(folder / "*.jsonl")], size("big.jsonl", "tiny.jsonl", "empty.jsonl")
    )
    yield lambda: recorded([str(big)], size("big.jsonl"), holdout=True)
    yield lambda: recorded([str(folder / "tiny.jsonl")], size("tiny.jsonl"), holdout=True)

    def empty() -> str:
        code, said = cli(["pack", str(folder / "empty.jsonl"), "-o", str(folder / "e0"), *base])
        return "clear error" if code != 0 and _clear(said) else f"crash: {said}"

    yield empty
    for change in ("grow", "cut", "same-size"):

        def resized(change: str = change) -> str:
            return _resized_resume(folder, big, base, change)

        yield resized


def _resized_resume(folder: Path, big: Path, base: list[str], change: str) -> str:
    """Kill after the first shard, change the input, rerun: refused (or, same size and
    content, resumed); then restored: the uninterrupted bytes."""
    src, out, ref = (
        folder / f"rs-{change}.jsonl",
        folder / f"rs-{change}",
        folder / f"rs-{change}-ref",
    )
    shutil.copy(big, src)
    args = ["pack", str(src), "-o", str(out), *base]
    cli(["pack", str(src), "-o", str(ref), *base])  # the uninterrupted pack of the same file
    proc = subprocess.Popen([sys.executable, "-m", "wdstream.cli", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if (out / ".wdstream-pack.json").exists():
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    data = src.read_bytes()
    mtime = src.stat().st_mtime_ns
    changed = {"grow": data + data[:50_000], "cut": data[: len(data) * 2 // 3],
               "same-size": data.replace(b"alpha", b"omega", 1)}[change]  # fmt: skip
    src.write_bytes(changed)
    code, said = cli(args)
    if code == 0:
        return "silent wrong: a resume after the input changed was accepted"
    if not _clear(said):
        return f"crash: {said.strip()}"[:300]
    src.write_bytes(data)
    os.utime(src, ns=(mtime, mtime))
    code, said = cli(args)
    if code != 0:
        return "clear error"  # the restored input is still refused: clear, not wrong
    names = sorted(p.name for p in ref.iterdir())
    if names != sorted(p.name for p in out.iterdir()):
        return "silent wrong: the resumed pack's files differ"
    for n in names:
        if (ref / n).read_bytes() != (out / n).read_bytes():
            return f"silent wrong: {n} differs from the uninterrupted pack's"
    return "handled"
