"""What a pack reads: input files (paths, globs, Parquet/Arrow tables) or one iterable of
records given from Python, behind one shape for :func:`wdstream.pack` and the engines.

::

    pack(["a.jsonl", "b/*.parquet"], out)   -> PackInputs.from_paths: expanded InputFiles
    pack_records(iterable, out) / Writer    -> PackInputs.from_records: one named iterable
        names (provenance), fingerprint (resume journal), peek (bpe-openai's check)
        open_reader(job, resume): DocumentReader (files) | RecordReader (records)

Files and records differ only in where documents come from; tokenising, sample building,
shards, the journal, the lock and the commit are the same code, so the same documents give
byte-identical shards either way (``tests/test_writer.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from wdstream.errors import InputError
from wdstream.inputs import DocumentReader, InputFile, expand_inputs
from wdstream.inputs.arrow import ARROW_SUFFIXES, is_arrow, require_pyarrow
from wdstream.inputs.files import INPUT_SUFFIXES
from wdstream.inputs.iterables import RECORDS_NAME, RecordReader
from wdstream.write.engine import PackJob
from wdstream.write.resume import ResumePoint

__all__ = ["PACK_SUFFIXES", "PackInputs", "open_reader"]

PACK_SUFFIXES = INPUT_SUFFIXES + ARROW_SUFFIXES  # what a folder given to pack contributes
_CHECK_BYTES = 256 << 10  # input text bpe-openai must reproduce before it is trusted
_PEEK_BLOCK_BYTES = 256 << 10
_PEEK_INPUT_BYTES = 4 << 20  # input read at most for that text


@dataclass(frozen=True)
class PackInputs:
    """The inputs of one pack: ``files``, or (``records`` not None) one iterable of records
    named by ``files[0]`` (a pseudo-file without size, ``<records>`` by default)."""

    files: list[InputFile]
    records: Iterable[Any] | None = None

    @classmethod
    def from_paths(cls, inputs: str | Sequence[str]) -> PackInputs:
        """Expand paths, folders, globs and braces (see :func:`expand_inputs`).

        Raises:
            TypeError: ``inputs`` are not paths (records go to :func:`wdstream.pack_records`).
            InputError: a missing file, an empty match, a special file.
            ImportError: a Parquet/Arrow input without pyarrow (names the extra).
        """
        paths = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) for p in paths):
            raise TypeError(
                "pack() takes input paths (a str or a list of str); to pack texts, dicts or "
                "token ids from Python (a generator, a datasets.Dataset) use "
                f"wdstream.pack_records(records, output) or wdstream.Writer; got {_what(inputs)}"
            )
        files = expand_inputs(list(paths), PACK_SUFFIXES)
        if any(is_arrow(f.path) for f in files):
            require_pyarrow()  # before the output is locked
        return cls(files)

    @classmethod
    def from_records(cls, records: Iterable[Any], name: str = RECORDS_NAME) -> PackInputs:
        """One iterable of records, named ``name`` in errors and provenance.

        Raises:
            TypeError: ``records`` is a str or bytes (one document, or a path: use
                :func:`wdstream.pack`), or not iterable.
        """
        if isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
            raise TypeError(
                f"records must be an iterable of records (texts, dicts or token ids), got "
                f"{_what(records)}; to pack files use wdstream.pack(paths, output)"
            )
        return cls([InputFile(name)], records)

    @property
    def names(self) -> list[str]:
        """The inputs' names, as provenance and messages give them."""
        return ["<stdin>" if f.path == "-" else f.path for f in self.files]

    @property
    def input_bytes(self) -> int | None:
        """The inputs' total size on disk, or None where one is unknown (stdin, records):
        what :func:`wdstream.write.sizing.choose_shard_bytes` sizes shards from."""
        if self.records is not None or any(f.size is None for f in self.files):
            return None
        return sum(f.size or 0 for f in self.files)

    def fingerprint(self) -> list[Any]:
        """What identifies the inputs in the resume journal (records: their name only)."""
        return [f.fingerprint() for f in self.files]

    def check(self, engine: str) -> None:
        """Refuse inputs the engine cannot read.

        Raises:
            ValueError: records or Parquet/Arrow inputs with ``engine="ray"``.
        """
        if engine == "local":
            return
        if self.records is not None or any(is_arrow(f.path) for f in self.files):
            raise ValueError(
                "engine='ray' reads JSON Lines and text files: records from Python and "
                "Parquet/Arrow inputs need engine='local' (or Ray Data with wdstream.ray.Sink)"
            )

    def peek(self, text_key: str, lines: bool, limit: int) -> list[str]:
        """A few hundred KB of the first input's text, to check a second tokenizer backend
        against (none from records: an iterator cannot be read twice). A line file is read
        for at most :data:`_PEEK_INPUT_BYTES` (a file of blank lines holds no text to find:
        reading it all was most of a 1 GiB newline bomb's 1,299 s)."""
        if self.records is not None or not self.files or self.files[0].path == "-":
            return []
        texts: list[str] = []
        size = read = 0
        reader = DocumentReader(
            self.files[:1], text_key, lines, on_error="skip", errors="replace",
            max_record_bytes=limit,
        )  # fmt: skip
        parser = reader.block_parser()
        try:
            if parser is None:  # Parquet/Arrow rows, a whole .txt: documents one by one
                for text, _ in reader:
                    texts.append(text[:_CHECK_BYTES])
                    size += len(text)
                    if size >= _CHECK_BYTES:
                        break
                return texts
            for block in reader.blocks(_PEEK_BLOCK_BYTES):
                for text in parser.parse(block).docs:
                    texts.append(text[:_CHECK_BYTES])
                    size += len(text)
                read += block.size
                if size >= _CHECK_BYTES or read >= _PEEK_INPUT_BYTES:
                    break
        except InputError:
            pass  # the real read reports it, at its place in the input
        return texts

    def describe(self) -> str:
        """The inputs for a message (``no non-empty documents in ...``)."""
        return ", ".join(self.names)


def open_reader(job: PackJob, resume: ResumePoint) -> DocumentReader:
    """The reader of ``job``'s inputs from ``resume`` on: its files, or its records."""
    options: dict[str, Any] = dict(
        text_key=job.text_key, lines=job.lines, on_error=job.on_error, errors=job.errors,
        start=resume.start, bad_locations=resume.bad_locations,
        max_record_bytes=job.max_record_bytes, document=job.document,
    )  # fmt: skip
    if job.records is None:
        return DocumentReader(job.files, **options)
    return RecordReader.of(job.records, job.files[0].path, **options)


def _what(value: object) -> str:
    """``value``'s kind for a TypeError."""
    if isinstance(value, (list, tuple)):
        odd = next((v for v in value if not isinstance(v, str)), None)
        return f"a {type(value).__name__} holding a {type(odd).__name__}"
    return f"a {type(value).__name__}"
