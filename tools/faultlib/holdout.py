"""``pack --holdout``: the pack killed at every commit step and in either dataset's shard
writes, leftovers at ``OUTPUT/holdout``, hostile fractions, a remote output whose server
fails the held-out index, and every reader pointed at the pair.

Oracles outside wdstream: the uninterrupted pack (every file of both datasets, byte for
byte), and the split computed here from ``docs/PACK.md``'s rule (blake2b, digest 8, read
little-endian, of each document's ids as little-endian uint32 without bit 31, below
``floor(F * 2**64)``) on documents decoded with tarfile + msgpack.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from fractions import Fraction
from hashlib import blake2b
from pathlib import Path

import numpy as np

from faultlib.common import Attempt, corpus_lines, labelled, stored_samples
from faultlib.packs import same_tree

FRACTION = 0.25
MODES = ("concat", "docs", "bestfit")
COMPLETE = "already holds a complete dataset"
# Runs `wdstream ARGS` and SIGKILLs itself at the n-th call of a commit step: a real kill at
# an exact point (between the two index.json writes, between the two journal removals).
KILLER = """
import os, signal, sys
import wdstream.write.commit as commit
from wdstream.write.journal import Journal
where, n, calls = sys.argv[1], int(sys.argv[2]), [0]
def hit():
    calls[0] += 1
    if calls[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
if where == "index":
    real_index = commit.write_index
    commit.write_index = lambda store, index: (hit(), real_index(store, index))[1]
else:
    real_remove = Journal.remove
    Journal.remove = lambda self: (hit(), real_remove(self))[1]
from wdstream.cli import main
sys.argv = ["wdstream", *sys.argv[3:]]
main()
"""


def holdout_input(work: Path) -> Path:
    """JSON Lines with exact duplicates: every 7th document again, one document 30 times."""
    src = work / "holdout-in.jsonl"
    if not src.exists():
        lines = corpus_lines(200)
        src.write_text("\n".join(lines + lines[::7] + [lines[3]] * 30) + "\n")
    return src


def pack_args(src: Path, out: Path | str, mode: str, *extra: str) -> list[str]:
    return ["pack", str(src), "-o", str(out), "--seq-len", "31", "--shard-size", "8KB",
            "--workers", "0", "-q", "--mode", mode, *extra]  # fmt: skip


def holdout_args(src: Path, out: Path | str, mode: str, *extra: str) -> list[str]:
    return pack_args(src, out, mode, "--holdout", str(FRACTION), *extra)


def cli(args: list[str], script: str | None = None) -> tuple[int, str]:
    """Exit status and stderr+stdout of ``wdstream ARGS`` (or of ``script ARGS``)."""
    head = ["-c", script] if script is not None else ["-m", "wdstream.cli"]
    proc = subprocess.run([sys.executable, *head, *args], capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)  # fmt: skip
    return proc.returncode, proc.stderr + proc.stdout


def reference(work: Path, mode: str, holdout: bool = True) -> Path:
    """The uninterrupted pack every attempt's result must equal."""
    ref = work / f"holdout-ref-{mode}-{int(holdout)}"
    if not ref.exists():
        src = holdout_input(work)
        args = holdout_args(src, ref, mode) if holdout else pack_args(src, ref, mode)
        code, said = cli(args)
        if code != 0:
            raise RuntimeError(f"the reference pack failed: {said}")
    return ref


def side(ids: np.ndarray, fraction: float = FRACTION) -> bool:
    """True when docs/PACK.md's rule holds the document out (computed here)."""
    data = (ids.astype(np.int64) & 0x7FFFFFFF).astype("<u4").tobytes()
    value = int.from_bytes(blake2b(data, digest_size=8).digest(), "little")
    return value < int(Fraction(fraction) * 2**64)


def split_wrong(root: Path, fraction: float = FRACTION) -> str | None:
    """What is wrong with a docs-mode pair at ``root``: a document on the wrong side by the
    rule, or content in both datasets; None when nothing is."""
    train = stored_samples(str(root))
    held = stored_samples(str(root / "holdout"))
    if any(side(d, fraction) for d in train) or not all(side(d, fraction) for d in held):
        return "a document on the wrong side of the hash rule"
    if {d.tobytes() for d in train} & {d.tobytes() for d in held}:
        return "a document in both datasets"
    return None


def _finish(out: Path, ref: Path, args: list[str], killed_said: str = "") -> str:
    """Rerun ``args`` after a kill; then the pair must equal ``ref``. A rerun refused as
    complete is fine only where the training index.json is there; the leftover held-out
    journal it may leave must then go with --overwrite, to the same bytes."""
    code, said = cli(args)
    if "Traceback" in said:
        return f"crash: the rerun: {said.strip().splitlines()[-1]}"[:300]
    if code != 0:
        if COMPLETE not in said or not (out / "index.json").exists():
            return f"crash: the rerun failed: {said.strip()}"[:300]
        if not same_tree(out, ref):  # complete: the same bytes, but a leftover journal
            extra = out / "holdout" / ".wdstream-pack.json"
            extra.unlink(missing_ok=True)
            if not same_tree(out, ref):
                return "silent wrong: a pack refused as complete differs from the reference"
            code, said = cli([*args, "--overwrite"])
            if code != 0:
                return f"crash: --overwrite after a complete pack failed: {said.strip()}"[:300]
    if not same_tree(out, ref):
        return f"silent wrong: the resumed pair differs from the uninterrupted one{killed_said}"
    return "handled"


def holdout_kills(work: Path, scale: float) -> Iterator[Attempt]:
    """SIGKILL at each commit step (held-out index, training index, training journal removed,
    held-out journal removed) and after n shards appeared in either dataset; then the same
    command again: both datasets must equal the uninterrupted pack's bytes."""
    src = holdout_input(work)
    steps = [("index", 1), ("index", 2), ("remove", 1), ("remove", 2)]
    for mode in MODES:
        for where, n in steps:

            def at_commit(mode: str = mode, where: str = where, n: int = n) -> str:
                ref, out = reference(work, mode), work / f"hkill-{mode}-{where}{n}"
                code, said = cli([where, str(n), *holdout_args(src, out, mode)], KILLER)
                if code != -signal.SIGKILL:
                    return f"crash: the pack was not killed at {where} {n}: {said}"[:300]
                return _finish(out, ref, holdout_args(src, out, mode), f" ({where} {n})")

            yield at_commit
        for folder in ("", "holdout"):
            for at in (1, 3)[: max(1, round(2 * scale))]:

                def in_shards(mode: str = mode, folder: str = folder, at: int = at) -> str:
                    ref = reference(work, mode)
                    out = work / f"hkill-{mode}-{folder or 'train'}-{at}"
                    args = holdout_args(src, out, mode)
                    cmd = [sys.executable, "-m", "wdstream.cli", *args]
                    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)  # fmt: skip
                    deadline = time.monotonic() + 90
                    while proc.poll() is None and time.monotonic() < deadline:
                        if len(list((out / folder).glob("*.tar"))) >= at:
                            proc.send_signal(signal.SIGKILL)
                            break
                        time.sleep(0.005)
                    proc.wait()
                    return _finish(out, ref, args, f" (killed at {folder or 'train'} {at})")

                yield in_shards
        if mode == "docs":

            def docs_split(mode: str = mode) -> str:
                wrong = split_wrong(reference(work, mode))
                return f"silent wrong: {wrong}" if wrong else "handled"

            yield docs_split


def _leftover(kind: str, work: Path, out: Path) -> Path | None:
    """Put ``kind`` at ``out/holdout``; the other folder it points into, if any."""
    target = out / "holdout"
    out.mkdir(parents=True)
    src = holdout_input(work)
    if kind == "file":
        target.write_text("not a dataset\n")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        victim = work / f"victim-{out.name}"
        shutil.copytree(reference(work, "concat") / "holdout", victim)
        target.symlink_to(victim)
        return victim
    elif kind.startswith(("complete", "partial")):  # another pack's held-out dataset
        other = work / f"other-{out.name}"
        extra = ["--holdout", "0.5"] if kind.endswith("fraction") else ["--holdout", "0.25",
                                                                         "--bos"]  # fmt: skip
        if kind.startswith("partial"):  # killed before either index.json
            cli(["index", "1", *pack_args(src, other, "concat", *extra)], KILLER)
        else:
            cli(pack_args(src, other, "concat", *extra))
        shutil.copytree(other / "holdout", target)
    elif kind == "unrelated":  # a dataset of its own that happens to be named holdout
        code, said = cli(pack_args(src, target, "docs"))
        if code != 0:
            raise RuntimeError(said)
    return None


LEFTOVERS = ("file", "fifo", "symlink", "complete-fraction", "complete-bos", "partial-fraction",
             "partial-bos", "unrelated")  # fmt: skip


def holdout_leftovers(work: Path, scale: float) -> Iterator[Attempt]:
    """A leftover ``OUTPUT/holdout`` (file, FIFO, symlink to another dataset, another pack's
    complete or interrupted held-out dataset, a dataset of its own) under a pack with and
    without --holdout, with and without --overwrite: a clear error naming it, or the pair
    equal to the uninterrupted pack's; a folder a symlink points to is never changed, and a
    pack without --holdout leaves what is no held-out dataset alone."""
    src = holdout_input(work)
    for kind in LEFTOVERS:
        for holdout in (True, False):
            for overwrite in (False, True):

                def attempt(kind: str = kind, holdout: bool = holdout, ow: bool = overwrite) -> str:
                    out = work / f"hleft-{kind}-{int(holdout)}{int(ow)}"
                    ref = reference(work, "concat", holdout)
                    victim = _leftover(kind, work, out)
                    before = out / "holdout"
                    kept = sorted(p.name for p in before.iterdir()) if before.is_dir() else None
                    args = (holdout_args if holdout else pack_args)(src, out, "concat")
                    code, said = cli([*args, *(["--overwrite"] if ow else [])])
                    held_ref = reference(work, "concat") / "holdout"  # the victim's bytes
                    if victim is not None and not same_tree(victim, held_ref):
                        return labelled(kind, "silent wrong: a folder outside OUTPUT changed")
                    if "Traceback" in said:
                        return labelled(kind, f"crash: {said.strip().splitlines()[-1]}")
                    if code != 0:
                        clear = said.startswith("Error:") and (
                            "holdout" in said or str(out) in said
                        )
                        return "clear error" if clear else labelled(kind, f"crash: {said}")
                    if holdout:
                        return (
                            "handled"
                            if same_tree(out, ref)
                            else labelled(kind, "silent wrong: the pair differs from the reference")
                        )
                    train = {p.name for p in out.iterdir() if p.name != "holdout"}
                    want = {p.name for p in ref.iterdir()}
                    if train != want or not all((out / n).read_bytes() == (ref / n).read_bytes()
                                                for n in want if (ref / n).is_file()):  # fmt: skip
                        return labelled(kind, "silent wrong: the training dataset differs")
                    if kind == "unrelated" and sorted(os.listdir(before)) != kept:
                        return labelled(kind, "silent wrong: --overwrite cleared a dataset "
                                        "that is no held-out one")  # fmt: skip
                    return "handled"

                yield attempt
