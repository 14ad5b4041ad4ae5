"""Per-shard provenance table ``NAME-NNNNNN.prov``: where every document and sample came from.

Documents are numbered dataset-wide in pack order (document ``d`` of shard ``i`` is
``sum(documents of shards < i) + d``, counting the documents that *start* in a shard). The
table of shard ``i`` holds, for each document that starts there, its input file and its
1-based line (the record number: a JSON Lines or ``--lines`` line, ``1`` for a whole ``.txt``
file), and for each sample the document its first piece belongs to and the token offset
inside that document where the piece begins. The other pieces of a sample are the next
documents, each from its token 0, so a sample's pieces are located without reading any
other sample::

    docs     D7 = 40 tokens (a.jsonl:12)   D8 = 9 (a.jsonl:13)   D9 = 30 (a.jsonl:15)
    samples  [.. D7 0-16] [D7 16-32] [D7 32-40, D8, D9 0-3] [D9 3-19] ...
    table    sample_doc    7          7            7           9
             sample_offset 0          16           32          3

A msgpack map; integer arrays are ``[width, bin]`` pairs of little-endian unsigned integers of
``width`` bytes (1, 2, 4 or 8: the smallest that holds the largest value)::

    {"version": 1, "first_doc": D, "documents": n_docs, "samples": n_samples,
     "files": [name, ...],          # input files of the documents starting here, in order
     "file_docs": [w, bin],         # documents per file (files are read in order, so a
                                    # shard's documents form one run per file)
     "file_first_line": [w, bin],   # line of each file's first document here
     "line_steps": [w, bin],        # per document: line minus the previous one's (0 for
                                    # the first of its file)
     "sample_doc": [w, bin],        # per sample: global document of its first piece - D + 1
     "sample_offset": [w, bin]}     # per sample: that piece's first token in its document

``sample_doc`` is relative (``0`` is the document begun in an earlier shard), so the table
holds about 1-2 bytes per document and 3-6 per sample (measured in ``docs/FORMAT.md``).

Documents are numbered in the order they start in the samples. In concat and docs modes that
is input order; a best-fit row (``--mode bestfit``) holds documents of one block out of
input order, so a run of one file's documents may go back in lines, and a file may come back
after another. ``files``/``file_docs`` are therefore *runs* (a name may repeat), and a table
whose lines go back inside a run is written as version 2, with ``"lines": [w, bin]`` (each
document's line) in place of ``file_first_line`` and ``line_steps``. Version 1 is written
whenever it can be (every concat and docs pack), so those tables are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgpack
import numpy as np

__all__ = ["PROVENANCE_SUFFIX", "PROVENANCE_VERSION", "ShardProvenance", "provenance_name"]

PROVENANCE_VERSION = 1  # the writer's baseline layout (version 2 only for lines that go back)
_LINES_VERSION = 2  # per-document lines: a best-fit table whose lines go back inside a run
PROVENANCE_SUFFIX = ".prov"
_WIDTHS = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def provenance_name(tar_name: str) -> str:
    """The provenance object of shard ``tar_name``: ``x-000001.tar`` -> ``x-000001.prov``."""
    return tar_name.removesuffix(".tar") + PROVENANCE_SUFFIX


def _pack_uints(values: np.ndarray) -> list[int | bytes]:
    top = int(values.max()) if len(values) else 0
    width = next(w for w in _WIDTHS if top < 1 << (8 * w))
    return [width, np.asarray(values).astype(_WIDTHS[width]).tobytes()]


def _unpack_uints(obj: object, key: str) -> np.ndarray:
    if not (isinstance(obj, list) and len(obj) == 2 and obj[0] in _WIDTHS):
        raise ValueError(f"{key}: expected [width, bytes] with width 1, 2, 4 or 8")
    width, data = obj
    if not isinstance(data, bytes) or len(data) % width:
        raise ValueError(f"{key}: {type(data).__name__} is not a whole number of {width}-byte ints")
    return np.frombuffer(data, dtype=_WIDTHS[width]).astype(np.int64)


@dataclass(frozen=True)
class ShardProvenance:
    """The provenance of one shard (see the module docstring)."""

    first_doc: int  # global number of the first document that starts in this shard
    files: tuple[str, ...]  # per run of documents from one input file: the file, in order
    file_docs: np.ndarray  # int64 per run: its documents
    lines: np.ndarray  # int64 per document starting here: 1-based line (record)
    sample_doc: np.ndarray  # int64 per sample: global document of its first piece
    sample_offset: np.ndarray  # int64 per sample: that piece's first token in the document

    @property
    def documents(self) -> int:
        return len(self.lines)

    def source(self, doc: int) -> tuple[str, int]:
        """``(input file, line)`` of global document ``doc``, which must start in this shard.

        Raises:
            IndexError: for a document that does not start in this shard.
        """
        i = doc - self.first_doc
        if not 0 <= i < self.documents:
            raise IndexError(
                f"document {doc} does not start in this shard (documents {self.first_doc} to "
                f"{self.first_doc + self.documents - 1})"
            )
        f = int(np.searchsorted(np.cumsum(self.file_docs), i, side="right"))
        return self.files[f], int(self.lines[i])

    def to_bytes(self) -> bytes:
        starts = np.concatenate([[0], np.cumsum(self.file_docs)[:-1]]).astype(np.int64)
        steps = np.diff(self.lines, prepend=0) if len(self.lines) else self.lines
        if len(self.lines):
            steps = steps.copy()
            steps[starts[self.file_docs > 0]] = 0
        first_line = self.lines[starts] if len(self.lines) else np.zeros(0, np.int64)
        rel = self.sample_doc - self.first_doc + 1
        lines: dict[str, list[int | bytes]] = (
            {"file_first_line": _pack_uints(first_line), "line_steps": _pack_uints(steps)}
            if not len(steps) or int(steps.min()) >= 0
            else {"lines": _pack_uints(self.lines)}
        )
        return msgpack.packb(
            {
                "version": PROVENANCE_VERSION if "line_steps" in lines else _LINES_VERSION,
                "first_doc": self.first_doc,
                "documents": self.documents,
                "samples": len(self.sample_doc),
                "files": list(self.files),
                "file_docs": _pack_uints(self.file_docs),
                **lines,
                "sample_doc": _pack_uints(rel),
                "sample_offset": _pack_uints(self.sample_offset),
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardProvenance:
        """Parse a ``.prov`` table.

        Raises:
            ValueError: if the bytes are not a consistent provenance table of version 1 or 2.
        """
        try:
            obj = msgpack.unpackb(data, raw=False)
            version = obj.get("version") if isinstance(obj, dict) else type(obj).__name__
            if version not in (PROVENANCE_VERSION, _LINES_VERSION):
                raise ValueError(
                    f"version {version!r}, this wdstream reads {PROVENANCE_VERSION} and "
                    f"{_LINES_VERSION}"
                )
            first, n_docs, n_samples = obj["first_doc"], obj["documents"], obj["samples"]
            files = tuple(obj["files"])
            by_steps = ("file_first_line", "line_steps")
            line_keys = ("lines",) if version == _LINES_VERSION else by_steps
            arrays = {
                k: _unpack_uints(obj[k], k)
                for k in ("file_docs", *line_keys, "sample_doc", "sample_offset")
            }
        except (msgpack.UnpackException, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a wdstream provenance table: {exc}") from exc
        file_docs = arrays["file_docs"]
        lines = arrays["lines"] if version == _LINES_VERSION else arrays["line_steps"]
        if not all(isinstance(f, str) for f in files) or not (
            len(files) == len(file_docs)
            and (version == _LINES_VERSION or len(arrays["file_first_line"]) == len(files))
            and int(file_docs.sum()) == len(lines) == n_docs
            and len(arrays["sample_doc"]) == len(arrays["sample_offset"]) == n_samples
        ):
            raise ValueError("not a wdstream provenance table: array lengths disagree")
        if version == PROVENANCE_VERSION:
            cum = np.cumsum(lines)
            starts = np.concatenate([[0], np.cumsum(file_docs)[:-1]]).astype(np.int64)
            used = file_docs > 0
            base = np.repeat(cum[starts[used]] if n_docs else cum[:0], file_docs[used])
            lines = cum - base + np.repeat(arrays["file_first_line"][used], file_docs[used])
        return cls(
            first_doc=int(first),
            files=files,
            file_docs=file_docs,
            lines=lines,
            sample_doc=arrays["sample_doc"] + int(first) - 1,
            sample_offset=arrays["sample_offset"],
        )

    @classmethod
    def build(
        cls,
        first_doc: int,
        names: Sequence[str],
        doc_files: Sequence[int],
        doc_lines: Sequence[int],
        sample_doc: Sequence[int],
        sample_offset: Sequence[int],
    ) -> ShardProvenance:
        """The table from per-document ``(file index into names, line)`` lists, in the order
        the documents start in the samples (runs of one file become one ``files`` entry)."""
        files = np.asarray(doc_files, dtype=np.int64)
        cut = np.flatnonzero(np.diff(files)) + 1 if len(files) else np.zeros(0, np.int64)
        run_starts = np.concatenate([[0], cut]).astype(np.int64) if len(files) else cut
        counts = np.diff(np.concatenate([run_starts, [len(files)]])) if len(files) else cut
        return cls(
            first_doc=first_doc,
            files=tuple(names[int(f)] for f in files[run_starts]),
            file_docs=counts.astype(np.int64),
            lines=np.asarray(doc_lines, dtype=np.int64),
            sample_doc=np.asarray(sample_doc, dtype=np.int64),
            sample_offset=np.asarray(sample_offset, dtype=np.int64),
        )
