"""Record inputs besides JSON text: pre-tokenized records with a loss mask, and Parquet /
Arrow IPC files.

Oracles: for pre-tokenized records, the good records' own ids and masks (``--mode docs``: a
record a sample, its ids then the EOS with bit 31, decoded with tarfile + msgpack); for
Arrow inputs, ``pyarrow``'s own read of the same bytes, written as JSON Lines and packed:
a damaged file must fail clearly, or pack what ``pyarrow`` reads in it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from faultlib.common import (
    Attempt,
    corpus_lines,
    index_stats,
    labelled,
    run_checked,
    split_mask,
    stored_samples,
)

EOS = 100257  # cl100k_base's <|endoftext|>


def _pretokenized_lines() -> dict[str, tuple[str, tuple[list[int], list[int]] | None]]:
    """Hostile lines and the document each must become (None: refused or counted)."""
    big = [i % 100_000 for i in range(2_000_000)]  # ids in cl100k's vocabulary
    d = json.dumps
    return {
        "id = n_vocab": (d({"input_ids": [1, 100277], "loss_mask": [1, 1]}), None),
        "id 2**31": (d({"input_ids": [1, 2**31], "loss_mask": [1, 1]}), None),
        "id 2**64": (d({"input_ids": [1, 2**64], "loss_mask": [1, 1]}), None),
        "5000-digit id": ('{"input_ids": [1, ' + "9" * 5000 + '], "loss_mask": [1, 1]}', None),
        "id -1": (d({"input_ids": [1, -1], "loss_mask": [1, 1]}), None),
        "id 2.0": (d({"input_ids": [1, 2.0], "loss_mask": [1, 1]}), None),
        "id NaN": ('{"input_ids": [1, NaN], "loss_mask": [1, 1]}', None),
        "ids all booleans": (d({"input_ids": [True, False], "loss_mask": [1, 1]}), None),
        "a boolean among ids": (d({"input_ids": [1, True], "loss_mask": [1, 1]}), None),
        "id a string": (d({"input_ids": [1, "2"], "loss_mask": [1, 1]}), None),
        "ids nested": (d({"input_ids": [[1, 2], [3, 4]], "loss_mask": [1, 1]}), None),
        "ids ragged": (d({"input_ids": [[1, 2], [3]], "loss_mask": [1, 1]}), None),
        "ids an object": (d({"input_ids": {"a": 1}, "loss_mask": [1]}), None),
        "mask shorter": (d({"input_ids": [1, 2, 3], "loss_mask": [1, 1]}), None),
        "mask entry 2": (d({"input_ids": [1, 2], "loss_mask": [1, 2]}), None),
        "mask entry -1": (d({"input_ids": [1, 2], "loss_mask": [1, -1]}), None),
        "mask entry 0.5": (d({"input_ids": [1, 2], "loss_mask": [1, 0.5]}), None),
        "mask a string": (d({"input_ids": [1, 2], "loss_mask": "11"}), None),
        "mask null": (d({"input_ids": [1, 2], "loss_mask": None}), None),
        "no mask": (d({"input_ids": [1, 2]}), None),
        "mask all 0": (d({"input_ids": [1, 2], "loss_mask": [0, 0]}), None),
        "empty ids": (d({"input_ids": [], "loss_mask": []}), None),
        "mask of booleans": (d({"input_ids": [7, 8], "loss_mask": [False, True]}), ([7, 8], [0, 1])),
        "2M ids": (d({"input_ids": big, "loss_mask": [1] * len(big)}), (big, [1] * len(big))),
    }  # fmt: skip


def _stored_wrong(
    out: Path, want: list[tuple[list[int], list[int]] | None], left: int
) -> str | None:
    """What differs between the pack at ``out`` and ``want`` (ids then EOS with bit 31, the
    mask; None: left out), and ``left`` records counted as skipped, refused or empty. A
    document's first token is stored without loss whatever its mask says (no BOS before it:
    nothing predicts it; docs/FORMAT.md, "loss_mask")."""
    kept = [(ids + [EOS], [0, *mask[1:], 0]) for ids, mask in filter(None, want)]
    got = [split_mask(s) for s in stored_samples(str(out))]
    if got != kept:
        return f"{len(got)} documents stored, {len(kept)} expected"
    stats = index_stats(out)
    counted = sum(stats.get(k, 0) for k in ("records_skipped", "unsupervised_documents_refused",
                                           "empty_documents_skipped"))  # fmt: skip
    return None if counted == left else f"{counted} records counted as left out, {left} were"


def masked_records(work: Path, scale: float) -> Iterator[Attempt]:
    """One hostile line among 10 good records, ``--pretokenized --mask-key``, strict and skip."""
    good = [([10 + i, 20, 30, 40 + i], [0, 0, 1, 1]) for i in range(10)]
    lines = [json.dumps({"input_ids": ids, "loss_mask": m}) for ids, m in good]
    for i, (label, (line, doc)) in enumerate(_pretokenized_lines().items()):
        src = work / f"pretok-{i}.jsonl"
        src.write_text("\n".join([*lines[:5], line, *lines[5:]]) + "\n")
        want = [*good[:5], doc, *good[5:]]
        for skip in (False, True):
            out = work / f"pretok-out-{i}-{int(skip)}"
            args = ["pack", str(src), "-o", str(out), "--pretokenized", "--mask-key", "loss_mask",
                    "--tokenizer", "cl100k_base", "--mode", "docs", "--workers", "0", "-q"]  # fmt: skip
            args += ["--on-error", "skip"] if skip else []
            # an empty document is left out and counted either way; others fail strictly
            empty = label == "empty ids"
            names = "" if skip or empty or doc is not None else f"{src}:6"
            left = 1 if doc is None and (skip or empty) else 0

            def attempt(args: list[str] = args, out: Path = out, left: int = left,
                        names: str = names, label: str = label, want: list = want) -> str:  # fmt: skip
                got = run_checked(args, 50, lambda: _stored_wrong(out, want, left), names)
                return labelled(label, got)

            yield attempt


# ---------------------------------------------------------------- Parquet / Arrow IPC


def _texts() -> list[str]:
    return [json.loads(line)["text"] for line in corpus_lines(300)]


def _arrow_files(work: Path) -> dict[str, Path]:
    """The clean inputs: Parquet with page CRCs (row groups of 50), Parquet without, Arrow IPC."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = work / "arrow-in"
    files = {"crc": d / "crc.parquet", "plain": d / "plain.parquet", "ipc": d / "t.arrow"}
    if not d.exists():
        d.mkdir()
        table = pa.table({"text": _texts()})
        pq.write_table(table, files["crc"], row_group_size=50, write_page_checksum=True)
        pq.write_table(table, files["plain"], row_group_size=50, compression="none")
        with pa.ipc.new_file(files["ipc"], table.schema) as f:
            f.write_table(table, max_chunksize=50)
    return files


def _pyarrow_rows(path: Path) -> list[object] | None:
    """The ``text`` column as pyarrow reads it (None: pyarrow cannot read the file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            return pq.read_table(path).column("text").to_pylist()
        with pa.ipc.open_file(path) as f:
            return f.read_all().column("text").to_pylist()
    except Exception:  # noqa: BLE001 - pyarrow failing is the oracle's answer
        return None


def _pack_args(src: Path, out: Path) -> list[str]:
    return ["pack", str(src), "-o", str(out), "--seq-len", "63", "--workers", "0", "-q",
            "--on-error", "skip"]  # fmt: skip


def _arrow_attempt(src: Path, tag: str, work: Path) -> str:
    """Pack ``src``; pyarrow's read of it, as JSON Lines packed the same way, is the oracle."""
    rows = _pyarrow_rows(src)
    out = work / f"arrow-out-{tag}"
    if rows is None:
        return run_checked(_pack_args(src, out), 50, lambda: "packed a file pyarrow cannot read",
                           str(src))  # fmt: skip
    ref_in, ref = work / f"arrow-ref-{tag}.jsonl", work / f"arrow-ref-{tag}"
    # bytes are no JSON: a list stands for them (not a string either: a bad record alike)
    ref_in.write_text("".join(json.dumps({"text": ["bytes"] if isinstance(r, bytes) else r}) + "\n"
                              for r in rows), encoding="utf-8")  # fmt: skip
    made = subprocess.run([sys.executable, "-m", "wdstream.cli", *_pack_args(ref_in, ref)],
                          capture_output=True, timeout=50)  # fmt: skip
    if made.returncode != 0:  # what pyarrow reads is no packable text (all bad): must fail
        return run_checked(_pack_args(src, out), 50, lambda: "packed what pyarrow reads as no text")

    def wrong() -> str | None:
        got, want = stored_samples(str(out)), stored_samples(str(ref))
        same = len(got) == len(want) and all(
            np.array_equal(a, b) for a, b in zip(got, want, strict=True)
        )
        return None if same else "other tokens than the JSON Lines of pyarrow's read"

    return run_checked(_pack_args(src, out), 50, wrong, str(src))


def arrow_inputs(work: Path, scale: float) -> Iterator[Attempt]:
    """Parquet (page CRCs or none) and Arrow IPC files flipped at a random bit or cut at a
    random byte; tables of other column types and nulls; files that are not tables."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = _arrow_files(work)
    rng = np.random.default_rng(17)
    for kind, n in (("crc", 12), ("plain", 8), ("ipc", 8)):
        data = files[kind].read_bytes()
        for j in range(max(2, int(n * scale))):
            cut = j % 4 == 3
            at = int(rng.integers(len(data) * (1 if cut else 8)))
            src = work / "arrow-in" / f"{kind}-{j}{files[kind].suffix}"

            def attempt(src: Path = src, data: bytes = data, at: int = at, cut: bool = cut,
                        tag: str = f"{kind}-{j}") -> str:  # fmt: skip
                raw = bytearray(data[:at] if cut else data)
                if not cut:
                    raw[at // 8] ^= 1 << (at % 8)
                src.write_bytes(bytes(raw))
                return _arrow_attempt(src, tag, work)

            yield attempt
    odd = {
        "ints": pa.table({"text": list(range(10))}),
        "nulls": pa.table({"text": ["a b", None, "c d"]}),
        "lists": pa.table({"text": [["a"], ["b"]]}),
        "binary": pa.table({"text": [b"\xff\xfe", b"ok"]}),
        "no text column": pa.table({"body": ["a", "b"]}),
        "struct": pa.table({"text": [{"a": 1}, {"a": 2}]}),
    }
    for name, table in odd.items():
        src = work / "arrow-in" / f"odd-{name.replace(' ', '-')}.parquet"
        pq.write_table(table, src)
        yield lambda src=src, name=name: labelled(
            name, _arrow_attempt(src, f"odd-{src.stem}", work)
        )
    for name, blob in (("JSON", b'{"text": "hi"}\n'), ("empty", b""), ("a tar", b"\0" * 1024)):
        for suffix in (".parquet", ".arrow"):
            src = work / "arrow-in" / f"not-{name.replace(' ', '-')}{suffix}"
            src.write_bytes(blob)
            yield lambda src=src: _arrow_attempt(src, f"not-{src.name}", work)
