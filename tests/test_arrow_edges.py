"""Arrow and Parquet inputs at their edges (issue 33, item 6): an IPC stream cut at a message
boundary, an IPC file without its footer, columns named twice, a row over the record limit.

Oracles are pyarrow's own: the batches ``pa.ipc.open_stream`` reads in the cut bytes say
which batch is the last complete one; what a table packs equals the JSON Lines of pyarrow's
read of it, packed the same way, both decoded with tarfile + msgpack. Every pack runs as a
``wdstream`` process (an abort would show as its exit status).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.edges_support import index_stats, one_error, run_cli, stored_samples

PACK = ["--seq-len", "63", "--workers", "0", "-q"]
TEXTS = [f"document {i}: " + "alpha beta gamma " * (i % 7 + 1) for i in range(150)]


def _stream(path: Path, table: pa.Table) -> list[int]:
    """Write ``table`` as an IPC stream in batches of 50 rows; the byte offsets where each
    message ends (schema, batches, end-of-stream marker), read back by pyarrow."""
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table, max_chunksize=50)
    buf = pa.BufferReader(path.read_bytes())
    messages = pa.ipc.MessageReader.open_stream(buf)
    ends = []
    while True:
        try:
            messages.read_next_message()
        except StopIteration:
            return [*ends, buf.size()]
        ends.append(buf.tell())


def _pyarrow_batches(data: bytes) -> list[int]:
    """Row counts of the record batches pyarrow reads in a (maybe cut) IPC stream."""
    return [b.num_rows for b in pa.ipc.open_stream(pa.BufferReader(data))]


def test_stream_cut_at_every_message_boundary_is_refused_naming_its_last_batch(
    tmp_path: Path,
) -> None:
    src = tmp_path / "t.arrow"
    ends = _stream(src, pa.table({"text": TEXTS}))
    data = src.read_bytes()
    assert len(ends) == 5  # schema, 3 batches, the end-of-stream marker
    full = run_cli("pack", str(src), "-o", str(tmp_path / "whole"), *PACK)
    assert full.returncode == 0, full.stderr
    assert index_stats(tmp_path / "whole")["documents"] == 150
    for cut in ends[:-1]:  # every boundary before the marker: a valid-looking shorter table
        part = tmp_path / f"cut-{cut}.arrow"
        part.write_bytes(data[:cut])
        batches = _pyarrow_batches(data[:cut])  # pyarrow reads it silently as complete
        said = one_error(run_cli("pack", str(part), "-o", str(tmp_path / f"o{cut}"), *PACK))
        assert str(part) in said and "without its end-of-stream marker" in said
        if batches:
            rows = sum(batches)
            want = f"after record batch {len(batches)} (rows {rows - batches[-1] + 1}-{rows})"
        else:
            want = "before its first record batch"
        assert want in said, said
        assert not (tmp_path / f"o{cut}" / "index.json").exists()


def test_stream_cut_inside_a_message_or_followed_by_another_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "t.arrow"
    ends = _stream(src, pa.table({"text": TEXTS}))
    data = src.read_bytes()
    inside = tmp_path / "inside.arrow"
    inside.write_bytes(data[: ends[1] + 100])  # 100 bytes into the second batch's message
    said = one_error(run_cli("pack", str(inside), "-o", str(tmp_path / "a"), *PACK))
    assert str(inside) in said and "after record batch 1 (rows 1-50)" in said
    twice = tmp_path / "twice.arrow"
    twice.write_bytes(data + data)  # pyarrow reads the first stream only
    assert sum(_pyarrow_batches(data + data)) == 150
    said = one_error(run_cli("pack", str(twice), "-o", str(tmp_path / "b"), *PACK))
    assert str(twice) in said and "more bytes follow its end-of-stream marker" in said


def test_file_without_its_footer_is_refused_naming_its_last_batch(tmp_path: Path) -> None:
    src = tmp_path / "f.arrow"
    table = pa.table({"text": TEXTS})
    with pa.ipc.new_file(str(src), table.schema) as w:
        w.write_table(table, max_chunksize=50)
    data = src.read_bytes()
    with pa.ipc.open_file(pa.BufferReader(data)) as f:  # pyarrow: where the batches end
        assert f.num_record_batches == 3
    for cut in (len(data) - 10, len(data) - 100):  # into the footer and its length
        part = tmp_path / f"cut-{cut}.arrow"
        part.write_bytes(data[:cut])
        with pytest.raises(pa.ArrowInvalid):
            pa.ipc.open_file(pa.BufferReader(data[:cut]))
        said = one_error(run_cli("pack", str(part), "-o", str(tmp_path / f"o{cut}"), *PACK))
        assert str(part) in said and "without a readable footer" in said
        assert "after record batch 3 (rows 101-150)" in said, said


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
@pytest.mark.parametrize(
    ("names", "key", "dotted"),
    [(["text", "text"], "text", "text"), (["text", "body", "body"], "text", "body"),
     (None, "text.a", "text.a")],
)  # fmt: skip
def test_columns_named_twice_are_refused_naming_file_and_column(
    tmp_path: Path, suffix: str, names: list[str] | None, key: str, dotted: str
) -> None:
    if names is None:  # two fields of one struct named alike
        st = pa.StructArray.from_arrays([pa.array(["x", "y"]), pa.array(["p", "q"])], ["a", "a"])
        table = pa.Table.from_arrays([st], names=["text"])
    else:
        table = pa.Table.from_arrays([pa.array(["a b", "c d"]) for _ in names], names=names)
    src = tmp_path / f"dup{suffix}"
    if suffix == ".parquet":
        pq.write_table(table, src)
    else:
        with pa.ipc.new_file(str(src), table.schema) as w:
            w.write_table(table)
    for mode in ([], ["--on-error", "skip"]):
        proc = run_cli("pack", str(src), "-o", str(tmp_path / "o"), "--text-key", key, *PACK, *mode)
        said = one_error(proc)
        assert str(src) in said and f"column {dotted!r} appears more than once" in said


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_row_over_the_record_limit_is_a_bad_record(tmp_path: Path, suffix: str) -> None:
    texts = [*TEXTS[:40], "long " * 600_000, *TEXTS[40:80]]  # row 41: 3 MB of text
    table = pa.table({"text": texts})
    src = tmp_path / f"t{suffix}"
    if suffix == ".parquet":
        pq.write_table(table, src, row_group_size=30)
    else:
        with pa.ipc.new_file(str(src), table.schema) as w:
            w.write_table(table, max_chunksize=30)
    limit = ["--max-record-bytes", "1MiB"]
    said = one_error(run_cli("pack", str(src), "-o", str(tmp_path / "strict"), *PACK, *limit))
    assert f"{src}:41: record of " in said and "longer than the limit of 1,048,576" in said
    out = tmp_path / "skip"
    proc = run_cli("pack", str(src), "-o", str(out), *PACK, *limit, "--on-error", "skip")
    assert proc.returncode == 0, proc.stderr
    # The oracle: pyarrow's read of the file, less the long row, as JSON Lines packed alike.
    rows = pq.read_table(src) if suffix == ".parquet" else pa.ipc.open_file(str(src)).read_all()
    ref_in = tmp_path / "ref.jsonl"
    kept = [t for t in rows.column("text").to_pylist() if len(t) < 1 << 20]
    ref_in.write_text("".join(json.dumps({"text": t}) + "\n" for t in kept))
    assert run_cli("pack", str(ref_in), "-o", str(tmp_path / "ref"), *PACK).returncode == 0
    assert stored_samples(out) == stored_samples(tmp_path / "ref")
    stats = index_stats(out)
    assert stats["records_skipped"] == 1 and stats["skipped_locations"][0].startswith(
        f"{src}:41: record of "
    )
