"""Input files that change while they are packed, or between a killed pack and its rerun
(``InputFile.changed``, ``docs/PACK.md`` "Inputs that cannot be trusted").

Attacked: a file appended to, truncated mid-record, rewritten in place (same size, new mtime),
rewritten with its old mtime put back (``touch -d``), replaced by a rename (new inode, old
mtime put back) or deleted, once the pack has committed N shards (its first, a middle or its
last file: finished, being read or not yet opened); over JSONL + ``.jsonl.gz`` +
``.jsonl.zst`` (the shards built in the token pool's workers at 2 processes, the usual
pipeline at 0 workers and with 2 threads, ``--on-error skip``), Parquet beside JSONL, 40
small files, chat conversations, and ``--engine ray`` on a real ``ray.cluster_utils.Cluster``
(byte ranges of a large file); and a pack SIGKILLed after N commits whose input then changes
before the rerun (its size, its mtime, or neither: rewritten with its mtime put back). Oracles outside the code under test: the same pack (0
workers, never changed) of a frozen copy of the input before and of the input after the
change, sha256 of every output file; the CLI's stderr (one ``Error:`` line naming the file,
no traceback) and the output folder (no ``index.json`` after an error). Then the same
command again, as a user would: the output of the input as it now is, or a clear error.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from faultlib.common import Attempt

CHANGES = ("appended", "truncated", "rewritten", "mtime put back", "renamed over", "deleted")
_TOOLS = str(Path(__file__).resolve().parents[1])
# The CLI in a fresh process, with every journal commit counted: at commit N, the input is
# changed (this module's change()) and/or the pack SIGKILLs itself. For the Ray engine, a
# real Cluster (2 one-CPU nodes) is started first and its address given.
_DRIVER = """
import json, os, signal, sys
sys.path.insert(0, sys.argv[2])
args, after, change, kill, ray_nodes = json.loads(sys.argv[1])
if ray_nodes:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster
    cluster = Cluster()
    for _ in range(ray_nodes):
        cluster.add_node(num_cpus=1, object_store_memory=80 << 20, node_ip_address="127.0.0.1")
    args += ["--engine", "ray", "--ray-address", cluster.address]
from wdstream.write.journal import Journal
_commit, _n = Journal.commit, [0]
def _hooked(self, *a, **k):
    out = _commit(self, *a, **k)
    _n[0] += 1
    if _n[0] == after:
        if change is not None:
            from faultlib.changing_inputs import change as apply
            apply(*change)
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
    return out
Journal.commit = _hooked
from wdstream.cli import main
try:
    main(["pack", *args], prog_name="wdstream")
finally:
    if ray_nodes:
        cluster.shutdown()
"""


def _words(rng: random.Random, n: int) -> str:
    """``n`` made-up words: text gzip and zstd cannot squeeze much (files past 1 MiB
    compressed outgrow the reader's buffer, so a change can land mid-read)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join("".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(n))


def _jsonl(rng: random.Random, n: int, words: int = 120) -> bytes:
    return "".join(json.dumps({"text": _words(rng, words)}) + "\n" for _ in range(n)).encode()


def _encode(path: Path, data: bytes) -> bytes:
    """``data`` (JSON Lines) as ``path``'s format stores it."""
    if path.suffix == ".gz":
        return gzip.compress(data, mtime=0)
    if path.suffix == ".zst":
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    if path.suffix == ".parquet":
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        texts = [json.loads(line)["text"] for line in data.decode().splitlines() if line]
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": texts}), buf, row_group_size=500)
        return buf.getvalue()
    return data


def _decode(path: Path, stored: bytes) -> bytes:
    if path.suffix == ".gz":
        return gzip.decompress(stored)
    if path.suffix == ".zst":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(stored)
    if path.suffix == ".parquet":
        import io

        import pyarrow.parquet as pq

        texts = pq.read_table(io.BytesIO(stored)).column("text").to_pylist()
        return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    return stored


def change(path_name: str, kind: str) -> None:
    """Change the input at ``path_name`` as ``kind`` says (one of :data:`CHANGES`); called
    inside the pack process at its Nth commit, or between a killed pack and its rerun."""
    path = Path(path_name)
    st = path.stat()
    stored = path.read_bytes()
    if kind == "deleted":
        path.unlink()
        return
    if kind == "truncated":  # mid-record: compressed data cut short, or a partial line
        path.write_bytes(stored[: len(stored) * 3 // 5])
        return
    if kind == "appended" and path.suffix in (".jsonl", ".txt", ".gz", ".zst"):
        late = json.dumps({"text": "a late record appended"}).encode() + b"\n"
        with path.open("ab") as f:
            f.write(_encode(path, late))  # a new gzip member, a new zstd frame
        return
    data = _decode(path, stored)
    if kind == "appended":  # Parquet: written again with a row more
        data += json.dumps({"text": "a late record appended"}).encode() + b"\n"
    else:  # the same records, letters swapped: the same size where the format keeps it
        data = b"".join(json.dumps(_swapped(json.loads(r))).encode() + b"\n"
                        for r in data.splitlines())  # fmt: skip
    new = path.with_name(path.name + ".new") if kind == "renamed over" else path
    new.write_bytes(_encode(path, data))
    if kind in ("mtime put back", "renamed over"):
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    if new != path:
        os.replace(new, path)


def _swapped(obj: Any) -> Any:
    """A record with the vowels of its texts (``text``, chat ``content``) rotated."""
    if isinstance(obj, list):
        return [_swapped(v) for v in obj]
    if isinstance(obj, dict):
        return {k: v.translate(_VOWELS) if k in ("text", "content") and isinstance(v, str)
                else _swapped(v) for k, v in obj.items()}  # fmt: skip
    return obj


_VOWELS = str.maketrans("aeiou", "eioua")


def _inputs(root: Path, layout: str) -> list[Path]:
    """The pristine inputs of a layout, written once under ``root/pristine``."""
    rng = random.Random(layout)
    d = root / "pristine" / layout
    if d.exists():
        return sorted(p for p in d.iterdir() if not p.name.endswith(".new"))
    d.mkdir(parents=True)
    if layout == "lines":
        plan = {"a.jsonl": _jsonl(rng, 1400), "b.jsonl.gz": _jsonl(rng, 2600),
                "c.jsonl.zst": _jsonl(rng, 1500)}  # fmt: skip
    elif layout == "parquet":
        plan = {"a.parquet": _jsonl(rng, 1500), "b.jsonl": _jsonl(rng, 1200)}
    elif layout == "small":
        plan = {f"s{k:02d}.jsonl": _jsonl(rng, 25) for k in range(40)}
    elif layout == "chat":
        from faultlib.chat import conversations

        convs = conversations(400, seed=3)
        plan = {"chat.jsonl": "".join(json.dumps({"messages": m}) + "\n" for m in convs).encode()}
    else:  # ray: one file cut into byte ranges, and a small one after it
        plan = {"a.jsonl": _jsonl(rng, 900), "b.jsonl": _jsonl(rng, 100)}
    for name, data in plan.items():
        (d / name).write_bytes(_encode(d / name, data))
    return sorted(d.iterdir())


CONFIGS: dict[str, tuple[str, list[str]]] = {
    "worker shards": ("lines", ["--workers", "2"]),
    "0 workers": ("lines", ["--workers", "0"]),
    "threads, skip": ("lines", ["--workers", "2", "--pool", "threads", "--on-error", "skip"]),
    "parquet": ("parquet", ["--workers", "0"]),
    "40 small files": ("small", ["--workers", "2"]),
    "chat": ("chat", ["--workers", "0", "--chat"]),
    "ray": ("ray", ["--workers", "0"]),
}


def _sha(root: Path) -> dict[str, str] | None:
    if not (root / "index.json").exists():
        return None
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def _run(
    work: Path, files: list[Path], out: Path, opts: list[str], after: int = -1,
    change_: tuple[str, str] | None = None, kill: bool = False, ray: int = 0,
) -> tuple[int, str]:  # fmt: skip
    args = [*map(str, files), "-o", str(out), "--shard-size", "48KB", "--seq-len", "256",
            "--quiet", *opts]  # fmt: skip
    spec = json.dumps([args, after, change_, kill, ray])
    proc = subprocess.run([sys.executable, "-c", _DRIVER, spec, _TOOLS], cwd=work,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return proc.returncode, proc.stderr


def _reference(work: Path, files: list[Path], opts: list[str]) -> dict[str, str] | None:
    """The digests of a pack (0 workers, local) of ``files`` as they are now (nothing writes
    to them then), cached by their contents; None if that pack fails (a truncated .gz, a
    file gone). Packed where they lie: provenance tables hold the input paths."""
    if not all(f.exists() for f in files):
        return None
    h = hashlib.sha256(json.dumps(opts).encode())
    for f in files:
        h.update(str(f).encode() + hashlib.sha256(f.read_bytes()).digest())
    ref = work / "changing-refs" / h.hexdigest()[:20]
    if not (ref / "done").exists():
        shutil.rmtree(ref, ignore_errors=True)
        local = [o for o in opts if o not in ("--pool", "threads")]
        local[local.index("--workers") + 1] = "0"
        rc, _ = _run(work, files, ref / "out", local)
        (ref / "done").write_text(json.dumps(_sha(ref / "out") if rc == 0 else None))
    return json.loads((ref / "done").read_text())


_RAY_LOG = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+INFO ")  # Ray's own log


def _judge(rc: int, err: str, out: Path, target: Path, wants: list[dict[str, str] | None]) -> str:
    """A pack's outcome: equal to a pack of one version of the input, or one clear error."""
    if "Traceback" in err:
        return f"crash: {err.strip()[-300:]}"
    if rc == 0:
        got = _sha(out)
        return "handled" if got is not None and got in wants else "silent wrong: exit 0, other data"
    gone = "taking over the lock of a pack that is gone"  # the rerun after a kill says so
    lines = [
        line
        for line in err.strip().splitlines()
        if line.strip() and gone not in line and not _RAY_LOG.match(line)
    ]
    if (out / "index.json").exists():
        return "silent wrong: failed, yet index.json is there"
    if len(lines) != 1 or not lines[0].startswith("Error: "):
        return f"crash: not one Error: line: {err.strip()[-300:]}"
    if target.name not in lines[0]:
        return f"crash: the error does not name {target.name}: {lines[0][:300]}"
    return "clear error"


def changing_inputs(work: Path, scale: float) -> Iterator[Attempt]:
    """Each change over the configurations, targets and commit counts, drawn (seeded); then
    kills with a change before the rerun."""
    root = work / "changing-inputs"
    root.mkdir(parents=True, exist_ok=True)

    def attempt(i: int, config: str, kind: str, which: int, after: int, kill: bool) -> Attempt:
        def run() -> str:
            label = f"{config}, {kind}, file {which}, commit {after}{', killed' * kill}"
            outcome = judged()
            kind_ = outcome.split(":", 1)[0]
            return outcome if kind_ in ("clear error", "handled") else f"{outcome} [{label}]"

        def judged() -> str:
            layout, opts = CONFIGS[config]
            if config == "chat":
                from faultlib.chat import chat_tokenizer

                opts = [*opts, "--tokenizer", str(chat_tokenizer(work))]
            base = root / "now"  # one path for every attempt: the references' too
            shutil.rmtree(base, ignore_errors=True)
            shutil.copytree(root / "pristine" / layout, base / "in")
            files = sorted((base / "in").iterdir())
            target = files[(0, len(files) // 2, -1)[which]]  # first, middle, last
            before = _reference(work, files, opts)
            out = base / "out"
            ray = 2 if config == "ray" else 0
            spec = (str(target), kind)
            if kill:  # killed at commit N, the input changed, the same command again
                rc, err = _run(work, files, out, opts, after, None, True, ray)
                if rc == 0:
                    return "handled" if _sha(out) == before else "silent wrong: the kill missed"
                change(*spec)
            else:
                rc, err = _run(work, files, out, opts, after, spec, False, ray)
                outcome = _judge(rc, err, out, target, [before, _reference(work, files, opts)])
                if not outcome.startswith("clear error"):
                    return outcome
            rc, err = _run(work, files, out, opts, ray=ray)  # the same command again
            return _judge(rc, err, out, target, [_reference(work, files, opts)])

        return run

    for layout in {lay for lay, _ in CONFIGS.values()}:
        _inputs(root, layout)
    rng = random.Random(29)
    combos = [(c, k, w, a, False) for c in CONFIGS for k in CHANGES for w in (0, 1, 2)
              for a in (1, 4, 10)]  # fmt: skip
    n = max(len(CONFIGS) * 2, int(len(combos) * 0.25 * scale))
    picked = rng.sample([c for c in combos if c[0] != "ray"], n - 2)
    picked += rng.sample([c for c in combos if c[0] == "ray"], 2)
    kills = [(c, k, w, a, True) for c in ("worker shards", "parquet") for k in
             ("appended", "truncated", "rewritten", "mtime put back", "renamed over")
             for w in (0, 1) for a in (2, 6)]  # fmt: skip
    picked += rng.sample(kills, max(3, int(len(kills) * 0.5 * scale)))
    for i, combo in enumerate(picked):
        yield attempt(i, *combo)
