"""``wdstream demo``: the README's main job, end to end, offline, on real text.

1. Build a corpus from this Python installation's standard-library ``.py`` sources (a few MB
   of JSON Lines, one document per file).
2. Pack it with :func:`wdstream.pack` (cl100k_base, small shards so there are several).
3. Stream shuffled ``[B, T]`` batches with :class:`wdstream.Loader`, save the cursor, and show
   that a fresh loader restored from it yields exactly the batches that followed.
"""

from __future__ import annotations

import json
import os
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["build_stdlib_corpus", "run_demo"]


def build_stdlib_corpus(path: str | os.PathLike[str], megabytes: float = 4.0) -> tuple[int, int]:
    """Write up to ``megabytes`` of stdlib ``.py`` sources as JSONL ``{"text", "path"}``.

    Files are taken in sorted order, so the corpus is the same on every run of one
    Python installation. Returns ``(documents, bytes of text)``.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    limit = int(megabytes * 1e6)
    docs = size = 0
    with open(path, "w", encoding="utf-8") as out:
        for p in sorted(stdlib.rglob("*.py")):
            if "site-packages" in p.parts:
                continue
            try:
                text = p.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            out.write(json.dumps({"text": text, "path": str(p.relative_to(stdlib))}) + "\n")
            docs += 1
            size += len(text.encode())
            if size >= limit:
                break
    return docs, size


def _documents_note(files: int, empty: int) -> str:
    """Why the packed document count can be lower than the number of corpus files."""
    if not empty:
        return f"documents: one per file, all {files} packed"
    were = "file was" if empty == 1 else "files were"
    return (
        f"documents: {files - empty} of {files} files packed: pack skips empty documents, and "
        f"{empty} {were} empty (some stdlib packages have an empty __init__.py); the index "
        "counts them in stats['empty_documents_skipped']"
    )


def run_demo(
    workdir: str | None = None, megabytes: float = 4.0, echo: Callable[[str], None] = print
) -> None:
    """Build, pack and stream; print what happened."""
    import torch

    from wdstream import Loader, pack
    from wdstream.tokenizers import index_tokenizer
    from wdstream.write.pack import describe

    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="wdstream-demo-")
        workdir = tmp.name
    try:
        os.makedirs(workdir, exist_ok=True)
        corpus = os.path.join(workdir, "stdlib.jsonl")
        root = os.path.join(workdir, "dataset")
        docs, size = build_stdlib_corpus(corpus, megabytes)
        files = "file" if docs == 1 else "files"
        echo(f"corpus: {docs} stdlib .py {files}, {size / 1e6:.1f} MB -> {corpus}")

        result = pack([corpus], root, seq_len=256, shard_size="1MB", overwrite=True, progress=False)
        echo(describe(result))
        echo(_documents_note(docs, result.index.stats["empty_documents_skipped"]))

        seq_len, batch_size = 128, 4
        loader = Loader(
            root, seq_len=seq_len, batch_size=batch_size, shuffle=True, seed=0, num_workers=0
        )
        t0 = time.perf_counter()
        batches, state = [], None
        for step, batch in enumerate(loader):
            batches.append(batch)
            if step == 2:
                state = loader.state_dict()
            if step == 5:
                break
        dt = time.perf_counter() - t0
        first = batches[0]
        echo(
            f"loader: {len(batches)} batches in {dt:.2f}s, input_ids {tuple(first['input_ids'].shape)} "
            f"{first['input_ids'].dtype}, labels {tuple(first['labels'].shape)}"
        )
        tok = index_tokenizer(result.index.tokenizer)
        preview = tok.decode(first["input_ids"][0, :48].tolist())
        echo(f"batch 0, row 0: {preview[:150]!r}")  # repr escapes a newline once: \n
        assert torch.equal(first["input_ids"][:, 1:], first["labels"][:, :-1])

        assert state is not None
        echo(f"cursor after batch 2: {len(json.dumps(state))} bytes of JSON")
        resumed = Loader(
            root, seq_len=seq_len, batch_size=batch_size, shuffle=True, seed=0, num_workers=0
        )
        resumed.load_state_dict(state)
        again = []
        for batch in resumed:
            again.append(batch)
            if len(again) == 3:
                break
        same = all(
            torch.equal(a["input_ids"], b["input_ids"])
            for a, b in zip(again, batches[3:6], strict=True)
        )
        echo(
            f"resume: batches 3..5 from a restored loader {'match' if same else 'DIFFER FROM'} the original run"
        )
        if not same:
            raise RuntimeError("resumed loader did not reproduce the original batches")
    finally:
        if tmp is not None:
            tmp.cleanup()
