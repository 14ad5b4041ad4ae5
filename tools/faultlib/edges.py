"""Issue 33's edges: Arrow inputs cut short or ambiguous, the Python writer's arguments and
bounds, checkpoint states that are no state, reader options and ``--plot`` paths that harm,
blank-line bombs, and a dataset whose every sample is corrupt under ``on_corrupt="mask"``.

Oracles, each outside the code attacked: pyarrow's own read (and the uncut file's rows); the
good records packed alone (tarfile + msgpack); the Loader's own refusal of an option value;
the bytes of every file before and after; the clean uninterrupted run; the documented
quarantine limit's arithmetic. An argument error is clear when it is a TypeError,
ValueError or WdstreamError naming the argument, raised before anything is written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from faultlib.common import Attempt, clean_dataset, labelled, run_checked, run_cli, stored_samples

TEXTS = [f"document {i}: " + "alpha beta gamma " * (i % 7 + 1) for i in range(150)]
PACK = ["--seq-len", "63", "--workers", "0", "-q"]


def _same(a: str | Path, b: str | Path) -> bool:
    x, y = stored_samples(str(a)), stored_samples(str(b))
    return len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y, strict=True))


def _ref(work: Path, tag: str, texts: list[str]) -> Path:
    """``texts`` as JSON Lines packed with :data:`PACK`: the oracle of a table's pack."""
    src, out = work / f"edge-ref-{tag}.jsonl", work / f"edge-ref-{tag}"
    if (out / "index.json").exists():  # made by an earlier attempt
        return out
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cmd = [sys.executable, "-m", "wdstream.cli", "pack", str(src), "-o", str(out), *PACK]
    subprocess.run(cmd, capture_output=True, timeout=50, check=True)
    return out


# ---------------------------------------------------------------- Arrow inputs


def _stream_bytes(work: Path) -> tuple[bytes, list[int], bytes]:
    """A 150-row IPC stream (batches of 50), where each message ends, and the file format."""
    import pyarrow as pa

    table = pa.table({"text": TEXTS})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=50)
    data = sink.getvalue().to_pybytes()
    buf = pa.BufferReader(data)
    messages, ends = pa.ipc.MessageReader.open_stream(buf), []
    while True:
        try:
            messages.read_next_message()
        except StopIteration:
            break
        ends.append(buf.tell())
    ends.append(len(data))  # after the end-of-stream marker
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=50)
    return data, ends, sink.getvalue().to_pybytes()


def _cut_table(work: Path, name: str, data: bytes) -> str:
    """A cut IPC file must fail naming it: pyarrow reads the cut stream as fewer rows than
    the 150 written (the oracle), so packing them is silent loss."""
    src = work / "edge-arrow" / name
    src.write_bytes(data)
    out = work / f"edge-out-{name}"
    return run_checked(["pack", str(src), "-o", str(out), *PACK], 50,
                       lambda: "packed a cut table as if whole", str(src))  # fmt: skip


def _duplicate(work: Path, label: str, suffix: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if label == "struct":
        st = pa.StructArray.from_arrays([pa.array(["x", "y"]), pa.array(["p", "q"])], ["a", "a"])
        table, key = pa.Table.from_arrays([st], names=["text"]), "text.a"
    else:
        names = ["text", "text"] if label == "top" else ["text", "body", "body"]
        table, key = pa.Table.from_arrays([pa.array(["a b", "c d"]) for _ in names], names), "text"
    src = work / "edge-arrow" / f"dup-{label}{suffix}"
    if suffix == ".parquet":
        pq.write_table(table, src)
    else:
        with pa.ipc.new_file(str(src), table.schema) as w:
            w.write_table(table)
    args = ["pack", str(src), "-o", str(work / f"edge-dup-{label}{suffix}"), "--text-key", key]
    return run_checked([*args, *PACK], 50, lambda: "packed an ambiguous table", str(src))


def _long_row(work: Path, suffix: str, skip: bool) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [*TEXTS[:40], "long " * 600_000, *TEXTS[40:80]]  # row 41: 3 MB
    src = work / "edge-arrow" / f"long{suffix}"
    table = pa.table({"text": texts})
    if suffix == ".parquet":
        pq.write_table(table, src, row_group_size=30)
    else:
        with pa.ipc.new_file(str(src), table.schema) as w:
            w.write_table(table, max_chunksize=30)
    out = work / f"edge-long{suffix}-{int(skip)}"
    args = ["pack", str(src), "-o", str(out), *PACK, "--max-record-bytes", "1MiB"]
    if not skip:
        return run_checked(args, 50, lambda: "packed a row over the limit", f"{src}:41")
    ref = _ref(work, f"long{suffix}", [t for t in texts if len(t) < 1 << 20])
    return run_checked([*args, "--on-error", "skip"], 50,
                       lambda: None if _same(out, ref) else "other rows than pyarrow's, less row 41")  # fmt: skip


def arrow_edges(work: Path, scale: float) -> Iterator[Attempt]:
    """IPC streams cut at every message boundary, in a message and concatenated; an IPC
    file cut in its footer; columns named twice; a row over ``--max-record-bytes``."""
    (work / "edge-arrow").mkdir(exist_ok=True)
    data, ends, file_bytes = _stream_bytes(work)
    for k, cut in enumerate(ends[:-1]):
        yield lambda cut=cut, k=k: _cut_table(work, f"cut-{k}.arrow", data[:cut])
    yield lambda: _cut_table(work, "inside.arrow", data[: ends[1] + 100])
    yield lambda: _cut_table(work, "twice.arrow", data + data)
    for k, cut in enumerate((len(file_bytes) - 10, len(file_bytes) - 100)):
        yield lambda cut=cut, k=k: _cut_table(work, f"file-{k}.arrow", file_bytes[:cut])
    for label in ("top", "other", "struct"):
        for suffix in (".parquet", ".arrow"):
            yield lambda label=label, suffix=suffix: labelled(
                label, _duplicate(work, label, suffix)
            )
    for suffix in (".parquet", ".arrow"):
        for skip in (False, True):
            yield lambda suffix=suffix, skip=skip: _long_row(work, suffix, skip)


# ---------------------------------------------------------------- the Python writer


def _refused(make: Callable[[], object], names: str, out: Path) -> str:
    """A call that must raise a clear error naming ``names`` and write nothing at ``out``."""
    from wdstream import WdstreamError

    try:
        made = make()
    except (TypeError, ValueError, WdstreamError) as exc:
        if names not in str(exc):
            return f"crash: {type(exc).__name__} not naming {names}: {exc}"[:300]
        return "silent wrong: wrote an index" if (out / "index.json").exists() else "clear error"
    close = getattr(made, "abort", None)
    if close is not None:
        close()
    return f"silent wrong: accepted ({names})"


def _long_text(work: Path, record: Any, skip: bool, tag: str) -> str:
    from wdstream import InputError, Writer, pack_records

    opts = {"seq_len": 31, "workers": 0, "progress": False}
    out = work / f"edge-writer-{tag}-{int(skip)}"
    records = [*TEXTS[:10], record, *TEXTS[10:30]]
    try:
        with Writer(str(out), max_record_bytes="1MiB", on_error="skip" if skip else "raise",
                    **opts) as w:  # fmt: skip
            for r in records:
                w.write(r)
    except InputError as exc:
        return "clear error" if not skip and "<records>:11" in str(exc) else f"crash: {exc}"[:300]
    if not skip:
        return "silent wrong: a text over the limit was packed"
    ref = work / "edge-writer-ref"
    if not ref.exists():
        pack_records(TEXTS[:30], str(ref), **opts)
    return "handled" if _same(out, ref) else "silent wrong: other samples than the good texts'"


def writer_edges(work: Path, scale: float) -> Iterator[Attempt]:
    """``Writer`` / ``pack_records`` arguments that are no path, key or row length; a mask
    key that is the ids key; a text over ``max_record_bytes`` (strict, skip)."""
    from wdstream import Writer, pack_records

    opts = {"seq_len": 31, "workers": 0, "progress": False}
    out = work / "edge-writer-args"
    cases: list[tuple[str, dict[str, Any], str]] = [
        *((f"output={o!r}", {"output": o}, "output") for o in (None, 5, "", b"x")),
        *((f"text_key={k!r}", {"text_key": k}, "text_key") for k in (5, None, "")),
        *((f"source={v!r}", {"source": v}, "source") for v in (5, None)),
        *((f"seq_len={n!r}", {"seq_len": n}, "seq_len") for n in (2**40, 2**31 - 1, 0, -1, True, 2.5)),
        ("mask_key == ids_key", {"pretokenized": True, "mask_key": "input_ids", "mode": "docs"},
         "mask_key and ids_key"),
    ]  # fmt: skip
    for label, kw, names in cases:
        target = kw.pop("output", str(out))
        for via in (Writer, pack_records):

            def attempt(via: Any = via, target: Any = target, kw: dict = kw, names: str = names,
                        label: str = label) -> str:  # fmt: skip
                if via is Writer:
                    make = lambda: Writer(target, **{**opts, **kw})  # noqa: E731
                else:
                    make = lambda: pack_records(TEXTS[:5], target, **{**opts, **kw})  # noqa: E731
                return labelled(label, _refused(make, names, out))

            yield attempt
    longs = {"3 MB ASCII": "x" * (3 << 20), "2 MB of é": "é" * (1 << 20),
             "a dict of 2 MB": {"text": "y" * (2 << 20)}}  # fmt: skip
    for tag, record in longs.items():
        for skip in (False, True):
            yield lambda r=record, s=skip, t=tag: labelled(t, _long_text(work, r, s, t[:2]))


# ---------------------------------------------------------------- checkpoint states

HOSTILE_STATES = {
    "null": b"null", "5": b"5", "NaN": b"NaN", "a list": b"[1]", "NaN inside": b'{"a": NaN}',
    "-Infinity inside": b'{"a": -Infinity}', "not UTF-8": b'{"a": "\xff"}', "not JSON": b"{",
    "60 KB deep": b"[" * 60_000 + b"]" * 60_000, "60 KB deep, unclosed": b"{" * 60_000,
    "40 deep in an object": b'{"c": ' + b'{"a": ' * 40 + b"1" + b"}" * 41,
}  # fmt: skip


def _state_attempt(work: Path, label: str, how: str) -> str:
    import torch

    from wdstream import Loader, StateMismatchError
    from wdstream.integrations.dcp import LoaderState
    from wdstream.integrations.hf import LOADER_STATE_FILE, load_loader_state

    root, _ = clean_dataset(work)
    loader = Loader(root, seq_len=32, batch_size=2, num_workers=0, seed=3)
    raw = HOSTILE_STATES[label]
    folder = work / f"edge-ckpt-{list(HOSTILE_STATES).index(label)}"
    names = str(folder / LOADER_STATE_FILE) if how == "hf" else "LoaderState json"
    try:
        if how == "hf":
            folder.mkdir(exist_ok=True)
            (folder / LOADER_STATE_FILE).write_bytes(raw)
            loader.load_state_dict(load_loader_state(str(folder), 0))
        else:
            padded = raw.ljust(130_000)
            tensor = torch.frombuffer(bytearray(padded), dtype=torch.uint8)
            LoaderState(loader, capacity=len(padded)).load_state_dict({"json": tensor})
    except StateMismatchError as exc:
        return "clear error" if names in str(exc) else f"crash: unnamed: {exc}"[:300]
    return f"silent wrong: a state {label} was loaded ({names})"


def state_edges(work: Path, scale: float) -> Iterator[Attempt]:
    """A Hugging Face checkpoint's state file and a DCP ``LoaderState`` tensor holding JSON
    that is no loader state (null, a number, NaN, not UTF-8, 60 KB of nesting, ...)."""
    for label in HOSTILE_STATES:
        for how in ("hf", "dcp"):
            yield lambda label=label, how=how: labelled(label, _state_attempt(work, label, how))


# ---------------------------------------------------------------- options and plot paths

BAD_OPTIONS = [("--seq-len", "0", "seq_len"), ("--seq-len", "-1", "seq_len"),
               ("--shuffle-window", "0", "shuffle_window"), ("--shuffle-lanes", "0", "shuffle_lanes"),
               ("--batch-size", "0", "batch_size"), ("--seed", "-1", "seed"),
               ("--world-size", "0", "world_size")]  # fmt: skip


def _option_attempt(work: Path, option: str, value: str, name: str) -> str:
    from wdstream import Loader

    root, _ = clean_dataset(work)
    try:  # the oracle: the Loader refuses the value
        Loader(root, **{"seq_len": 32, "batch_size": 2, "num_workers": 0, name: int(value)})
        return f"silent wrong: the Loader took {name}={value}: no oracle"
    except ValueError:
        pass
    args = ["explain", root, "--step", "0", "--batch-size", "2", option, value]
    return labelled(f"{option} {value}", run_cli(args, 50, None, name))


def _plot_attempt(work: Path, label: str) -> str:
    root, _ = clean_dataset(work)
    scratch = work / f"edge-plot-{label.replace(' ', '-')}"
    scratch.mkdir(exist_ok=True)
    victim = scratch / "notes.txt"
    victim.write_text("keep me")
    spec = scratch / "mix.json"
    spec.write_text(json.dumps({"sources": {"a": root}, "weights": {"a": 1.0}}))
    target = {"index.json": Path(root) / "index.json", "a shard": Path(root) / "data-000000.tar",
              "a sidecar": Path(root) / "data-000000.idx", "a text file": victim,
              "the mixture spec": spec}.get(label)  # fmt: skip
    if label.startswith("a symlink"):
        target = scratch / "link.png"
        dest = Path(root) / "index.json" if "index" in label else victim
        target.symlink_to(dest)
    assert target is not None
    files = [*Path(root).iterdir(), victim, spec]
    before = {p: p.read_bytes() for p in files}
    args = ["stats", str(spec if "spec" in label else root), "--plot", str(target)]
    if "spec" in label:
        args += ["--steps", "4", "--batch-size", "2", "--seq-len", "32"]
    asked = run_cli([*args, "--overwrite-plot"], 50) if label != "a text file" else "clear error"
    outcome = run_cli(args, 50, None, "--plot")
    changed = [p.name for p in files if p.read_bytes() != before[p]]
    if changed:
        return f"silent wrong: {label}: {changed[0]} overwritten"
    if label == "a text file":  # outside any dataset: asked, it becomes a picture
        made = run_cli(
            [*args, "--overwrite-plot"], 50, lambda: victim.read_bytes()[:4] == b"\x89PNG"
        )
        return outcome if made == "handled" else f"silent wrong: {label}: {made}"
    return outcome if asked.startswith("clear") else f"silent wrong: {label}: asked, {asked}"


def option_edges(work: Path, scale: float) -> Iterator[Attempt]:
    """``explain`` with option values the Loader refuses; ``stats --plot`` at a dataset's
    index, shard, sidecar, the mixture spec, a symlink, a file that is no picture."""
    for option, value, name in BAD_OPTIONS:
        yield lambda o=option, v=value, n=name: _option_attempt(work, o, v, n)
    for label in ("index.json", "a shard", "a sidecar", "the mixture spec", "a text file",
                  "a symlink to a file", "a symlink to index.json"):  # fmt: skip
        yield lambda label=label: _plot_attempt(work, label)


# ---------------------------------------------------------------- blank lines, quarantine


def _blank_bomb(work: Path, blank: bytes, mib: int, suffix: str) -> str:
    import zstandard

    src = work / f"edge-blank-{blank.hex()}-{mib}{suffix}"
    with src.open("wb") as f, zstandard.ZstdCompressor(level=19).stream_writer(f) as w:
        for _ in range(mib // 16):
            w.write(blank * ((16 << 20) // len(blank)))
    args = ["pack", str(src), "-o", str(work / f"edge-blank-out-{src.name}"), "--workers", "0",
            "-q", *(["--lines"] if suffix.startswith(".txt") else [])]  # fmt: skip
    return run_cli(args, 55, None, "no non-empty documents")


def _blank_among(work: Path, k: int) -> str:
    rng = np.random.default_rng(k)
    lines = []
    for t in TEXTS:
        lines += [
            rng.choice(["", " ", "\t\r", "\x0b\x0c", "\x1c"])
            for _ in range(int(rng.integers(0, 400)))
        ]
        lines.append(json.dumps({"text": t}))
    src, out = work / f"edge-among-{k}.jsonl", work / f"edge-among-out-{k}"
    src.write_text("\n".join(lines) + "\n")
    ref = _ref(work, "among", TEXTS)  # the records without a blank line between them
    return run_checked(["pack", str(src), "-o", str(out), *PACK], 50,
                       lambda: None if _same(out, ref) else "other samples than the records'")  # fmt: skip


def _all_corrupt(work: Path, every: int) -> str:
    from wdstream import Loader, QuarantineLimitError

    root, _ = clean_dataset(work)
    dst = work / f"edge-corrupt-{every}"
    shutil.copytree(root, dst)
    for shard in sorted(dst.glob("*.tar")):  # one byte flipped in every every-th sample
        with tarfile.open(shard) as tar:
            spots = [m.offset_data + m.size // 2 for m in tar.getmembers()
                     if m.name.endswith(".mp")][::every]  # fmt: skip
        data = bytearray(shard.read_bytes())
        for at in spots:
            data[at] ^= 0x40
        shard.write_bytes(bytes(data))
    opts = {"seq_len": 32, "batch_size": 4, "num_workers": 0, "seed": 3, "epochs": 3}
    loader = Loader(str(dst), on_corrupt="mask", **opts)  # no max_quarantined
    got: list[Any] = []
    try:
        for batch in loader:
            got.append(batch)
    except QuarantineLimitError as exc:  # the default: at most 16 rows (0.1 % of rows above)
        masked = sum(int((b["labels"] == -100).all(dim=1).sum()) for b in got)
        return (
            "clear error" if "default limit" in str(exc) and masked <= 16 else f"crash: {exc}"[:300]
        )
    return f"silent wrong: {len(got)} batches, {len(loader.quarantined)} masked rows, no error"


def bound_edges(work: Path, scale: float) -> Iterator[Attempt]:
    """``.zst`` bombs of blank lines (newlines, CRLF, spaces, tabs; JSON Lines and ``.txt
    --lines``); blank lines of every kind among records; every sample (or every other one)
    corrupt, read with ``on_corrupt="mask"`` and the default limit."""
    for blank, suffix in ((b"\n", ".jsonl.zst"), (b"\r\n", ".jsonl.zst"), (b" \t\n", ".jsonl.zst"),
                          (b"\n", ".txt.zst")):  # fmt: skip
        yield lambda b=blank, s=suffix: _blank_bomb(work, b, 256, s)
    for k in range(max(1, int(2 * scale))):
        yield lambda k=k: _blank_among(work, k)
    for every in (1, 2):
        yield lambda every=every: _all_corrupt(work, every)
