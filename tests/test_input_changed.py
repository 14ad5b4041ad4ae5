"""An input file that changes while it is packed (appended to by a writer still running, or
rewritten, as a script without ``if __name__ == "__main__":`` does when each pack worker
imports it again) is refused with one clear error, never packed as a mix of two versions.

The oracle is the test itself: it changes the file at a known point and expects the error
to name the file and the change; an unchanged file reads to its end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wdstream.errors import InputError
from wdstream.format.index import JOURNAL_NAME
from wdstream.inputs import DocumentReader, expand_inputs


def _lines(path: Path, n: int, word: str = "alpha") -> Path:
    path.write_text("".join(json.dumps({"text": f"{word} {i}"}) + "\n" for i in range(n)))
    return path


def _read_changing(path: Path, change, on_error: str = "raise") -> list[str]:
    """The documents read from ``path``, ``change(path)`` run after the first."""
    reader = DocumentReader(expand_inputs([str(path)]), on_error=on_error)
    texts = []
    for text, _pos in reader:
        texts.append(text)
        if len(texts) == 1:
            change(path)
    return texts


def test_an_unchanged_file_reads_to_its_end(tmp_path: Path) -> None:
    src = _lines(tmp_path / "a.jsonl", 50)
    assert _read_changing(src, lambda p: None) == [f"alpha {i}" for i in range(50)]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_file_appended_to_while_it_is_read_is_refused(tmp_path: Path, on_error: str) -> None:
    src = _lines(tmp_path / "a.jsonl", 50)
    before = src.stat().st_size

    def append(p: Path) -> None:
        with p.open("a") as f:
            f.write(json.dumps({"text": "late"}) + "\n")

    with pytest.raises(InputError) as err:  # skipping bad records does not hide it
        _read_changing(src, append, on_error)
    msg = str(err.value)
    assert msg.startswith(f"{src} changed while it was being packed ({before:,} -> ")
    assert "pack a copy that nothing writes to" in msg


def test_a_bad_record_the_change_made_says_so(tmp_path: Path) -> None:
    """Rewritten in place with longer records: the reader's next line starts mid-record, a
    bad record of neither version; its error names the line and the change."""
    src = _lines(tmp_path / "a.jsonl", 2000)

    def rewrite(p: Path) -> None:
        _lines(p, 3000, word="a much longer replacement word")

    with pytest.raises(InputError, match=r"a\.jsonl:\d+: malformed JSON .*; .*a\.jsonl changed "
                       r"while it was being packed \([\d,]+ -> [\d,]+ bytes\)"):  # fmt: skip
        _read_changing(src, rewrite)


def test_the_same_size_rewritten_is_seen_by_its_time(tmp_path: Path) -> None:
    src = _lines(tmp_path / "a.jsonl", 50)

    def rewrite(p: Path) -> None:
        data = p.read_bytes().replace(b"alpha", b"gamma")
        st = p.stat()
        p.write_bytes(data)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse clocks

    with pytest.raises(InputError, match=r"changed while it was being packed \(rewritten\)"):
        _read_changing(src, rewrite)


def test_pack_stops_with_one_error_line_when_its_input_grows(tmp_path: Path) -> None:
    """The CLI, a real pack process: the input is appended to once the first shard is
    written (the pack has then read 3 MiB of its 6.5 MB: three 1 MiB blocks ahead of the
    encoder); the pack exits 1 with one ``Error:`` line naming the file, and no
    ``index.json`` is published."""
    src = tmp_path / "in.jsonl"
    words = " ".join(f"w{i % 97}" for i in range(2000))
    src.write_text("".join(json.dumps({"text": f"{i} {words}"}) + "\n" for i in range(830)))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "wdstream.cli", "pack", str(src), "-o", str(out),
           "--workers", "0", "--shard-size", "1MB"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "data-000000.idx").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no first shard within 60 s"
            time.sleep(0.005)
        with src.open("a") as f:
            f.write(json.dumps({"text": "late"}) + "\n")
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"Error: {src} changed while it was being packed"
    )
    assert not (out / "index.json").exists()


@pytest.mark.parametrize("how", ["in place", "renamed over"])
def test_the_same_size_with_its_time_put_back_is_seen_by_its_ctime(
    tmp_path: Path, how: str
) -> None:
    """Rewritten to the same size with the old mtime put back (``touch -d``), in place or
    as a new file renamed over it: size and mtime match, the ctime (which no call sets
    back) does not."""
    src = _lines(tmp_path / "a.jsonl", 50)

    def rewrite(p: Path) -> None:
        st = p.stat()
        time.sleep(0.05)  # past the clock's tick, which ctimes are taken from
        data = p.read_bytes().replace(b"alpha", b"gamma")
        new = p if how == "in place" else p.with_suffix(".new")
        new.write_bytes(data)
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
        if new != p:
            os.replace(new, p)
        assert (p.stat().st_size, p.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)

    with pytest.raises(InputError, match=r"a\.jsonl changed while it was being packed \(same "
                       r"size and mtime, new ctime"):  # fmt: skip
        _read_changing(src, rewrite)


def test_a_ray_range_of_a_rewritten_file_is_refused(tmp_path: Path) -> None:
    """The Ray engine reads a large line file as byte ranges, each opened on its own: a
    range read after the file was rewritten holds the new version, the ones before the old;
    each range checks the file once read (``wdstream.ray.pieces.read_piece``)."""
    from wdstream.ray.pieces import read_piece, split_pieces

    src = _lines(tmp_path / "a.jsonl", 200)
    files = expand_inputs([str(src)])
    pieces = split_pieces(files, 1000, False, None)
    assert len(pieces) > 2 and not pieces[1].whole
    args = ("text", False, "raise", "strict", 1 << 20)
    texts, docs = read_piece(files, pieces[0], *args)
    assert docs.error is None and texts[0] == "alpha 0"
    src.write_bytes(src.read_bytes().replace(b"alpha", b"gamma"))
    os.utime(src, ns=(files[0].mtime_ns + 1_000_000,) * 2)  # coarse clocks
    _, docs = read_piece(files, pieces[1], *args)
    assert docs.error == f"{src} changed while it was being packed (rewritten): pack a copy " \
        "that nothing writes to"  # fmt: skip


def test_the_rerun_after_an_input_changed_names_it(tmp_path: Path) -> None:
    """A pack stopped (here by a bad record at its end) leaves its journal; the input then
    grows, and the same command again is refused naming that file, not just "inputs"."""
    import wdstream

    src = _lines(tmp_path / "a.jsonl", 400)
    other = _lines(tmp_path / "b.jsonl", 10)
    with src.open("a") as f:
        f.write("{not json\n")
    opts = dict(seq_len=16, shard_size="1KB", workers=0, progress=False, batch_bytes=256)
    with pytest.raises(InputError, match=r"a\.jsonl:401: malformed JSON"):
        wdstream.pack([str(src), str(other)], str(tmp_path / "out"), **opts)
    assert (tmp_path / "out" / JOURNAL_NAME).exists()
    with src.open("a") as f:
        f.write(json.dumps({"text": "late"}) + "\n")
    with pytest.raises(wdstream.WdstreamError) as err:
        wdstream.pack([str(src), str(other)], str(tmp_path / "out"), **opts)
    assert f"(differs in: inputs): {src} changed since it (size or mtime); pack into" in str(
        err.value
    )


def test_the_rerun_refuses_an_input_rewritten_with_its_mtime_put_back(tmp_path: Path) -> None:
    """The journal keeps the inputs' ctimes beside its fingerprint: an input rewritten to the
    same size with its mtime put back after the pack stopped (or while it ran, the pack
    refusing it) is refused by the rerun, which resumed over the new bytes before."""
    import wdstream

    src = _lines(tmp_path / "a.jsonl", 400)
    with src.open("a") as f:
        f.write("{not json\n")
    opts = dict(seq_len=16, shard_size="1KB", workers=0, progress=False, batch_bytes=256)
    with pytest.raises(InputError, match=r"a\.jsonl:401: malformed JSON"):
        wdstream.pack([str(src)], str(tmp_path / "out"), **opts)
    st = src.stat()
    time.sleep(0.05)  # past the clock's tick, which ctimes are taken from
    src.write_bytes(src.read_bytes().replace(b"alpha", b"gamma").replace(b"{not json", b" " * 9))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(wdstream.WdstreamError, match=r"holds an interrupted pack of .*a\.jsonl, "
                       r"changed since it \(same size and mtime, new ctime"):  # fmt: skip
        wdstream.pack([str(src)], str(tmp_path / "out"), **opts)
    wdstream.pack([str(src)], str(tmp_path / "out"), overwrite=True, **opts)
