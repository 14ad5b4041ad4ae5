"""Input files of a pack or a raw-text reader: expand paths/globs/braces, name positions.

An argument expands to files (directories recursively, globs sorted, ``{a..b}`` braces in
their own order); each file carries what identifies its content (size, mtime) for a resume
journal. An :class:`InputPosition` names where a record starts, with the reader's counters
before it, so a reader can restart exactly there.
"""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

from braceexpand import braceexpand

from wdstream.errors import InputError

__all__ = [
    "INPUT_SUFFIXES",
    "STDIN",
    "InputFile",
    "InputPosition",
    "expand_inputs",
    "open_regular",
    "special_kind",
]

INPUT_SUFFIXES = (
    ".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".json.gz", ".json.zst",
    ".txt", ".txt.gz", ".txt.zst",
)  # fmt: skip
STDIN = "-"


@dataclass(frozen=True)
class InputFile:
    """One input file (or stdin) and what identifies its content for the resume journal
    (size, mtime), plus its status-change time, which only :meth:`changed` compares: a
    journal must survive a copy of the inputs (``cp -a`` keeps the mtime, not the ctime)."""

    path: str
    size: int | None = None
    mtime_ns: int | None = None
    ctime_ns: int | None = None

    @property
    def is_text(self) -> bool:
        return self.path.removesuffix(".gz").removesuffix(".zst").endswith(".txt")

    def fingerprint(self) -> list[Any]:
        return [self.path, self.size, self.mtime_ns]

    def changed(self) -> str | None:
        """How the file on disk differs from the one the pack started on (its size and
        modification time when the inputs were expanded, and its status-change time where
        that was recorded), or None where it does not (or nothing was recorded: stdin,
        iterables). A file rewritten or appended to while it is packed yields records of
        neither version: a bad record there is the change's doing, and records read without
        error are not the file's either. The ctime catches a rewrite of the same size whose
        mtime was put back (``touch -d``, ``os.utime``, ``rsync -t``) and a file replaced by
        a rename: no call can set it back (a chmod, chown or new hard link moves it too)."""
        if self.size is None or self.mtime_ns is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            return f"{self.path} is gone while it was being packed ({exc.strerror})"
        same = (st.st_size, st.st_mtime_ns) == (self.size, self.mtime_ns)
        if same and self.ctime_ns in (None, st.st_ctime_ns):
            return None
        if st.st_size != self.size:
            sizes = f"{self.size:,} -> {st.st_size:,} bytes"
        elif not same:
            sizes = "rewritten"
        else:
            sizes = "same size and mtime, new ctime: rewritten with its mtime put back, or replaced"
        return (
            f"{self.path} changed while it was being packed ({sizes}): pack a copy that "
            "nothing writes to"
        )


class InputPosition(NamedTuple):
    """Where a record starts, plus the reader's counters before it (for exact resume)."""

    file: int  # index into the expanded input list
    record: int  # 0-based line (or document) number within the file
    offset: int  # byte offset of the record in the decompressed file
    empty: int  # empty documents skipped before this record
    bad: int  # malformed records skipped before this record
    input_bytes: int  # input bytes read before this record
    # Counted by the pack after encoding (wdstream.write.docrules), before this document:
    # supervised tokens of masked documents, and documents dropped or truncated for being
    # longer than a best-fit row, or refused for having no supervised token.
    supervised: int = 0
    long_dropped: int = 0
    long_truncated: int = 0
    unsupervised: int = 0
    # A chat pack's audit before this document (wdstream.write.chataudit: tokens per role,
    # template problems), JSON-able; None in other packs.
    audit: dict[str, Any] | None = None


_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def special_kind(mode: int) -> str | None:
    """What a file of this ``st_mode`` is when it is not a regular file, else None.

    Inputs must be regular files: opening a FIFO blocks until something writes to it, and
    a device such as ``/dev/zero`` never ends (a line that never ends would fill memory).
    """
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _SPECIAL if test(mode)), f"file type {stat.S_IFMT(mode):o}")


def _not_regular(path: str, kind: str) -> InputError:
    return InputError(
        f"{path}: not a regular file but {kind}; inputs must be regular files (pipe data in "
        "through stdin with '-' instead)"
    )


def open_regular(path: str, buffering: int = -1) -> IO[bytes]:
    """``path`` opened for reading, refusing (InputError) anything but a regular file.

    Opened with ``O_NONBLOCK`` and checked with ``fstat``, so a FIFO put in place of a file
    after :func:`expand_inputs` checked it cannot block the open; regular files ignore
    ``O_NONBLOCK``, which is cleared again before any read.

    Raises:
        OSError: the file cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        kind = special_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise _not_regular(path, kind)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def _expand_dir(path: str, suffixes: tuple[str, ...]) -> list[str]:
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        files.extend(
            os.path.join(dirpath, f)
            for f in filenames
            if not f.startswith(".") and f.endswith(suffixes)
        )
    return sorted(files)


def _expand_one(pattern: str, suffixes: tuple[str, ...]) -> list[str]:
    if pattern == STDIN:
        return [STDIN]
    found: list[str] = []
    for item in braceexpand(pattern):
        if glob.has_magic(item):
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise InputError(f"{item}: no file matches this pattern")
        else:
            matches = [item]
        for m in matches:
            found.extend(_expand_dir(m, suffixes) if os.path.isdir(m) else [m])
    return found


def expand_inputs(
    patterns: list[str] | tuple[str, ...], suffixes: tuple[str, ...] = INPUT_SUFFIXES
) -> list[InputFile]:
    """Expand paths, directories (recursively), globs and ``{a..b}`` braces into files.

    A directory contributes its files named with one of ``suffixes`` (``pack`` adds
    ``.parquet`` and ``.arrow``). Arguments keep their order; what one argument expands to is sorted (braces in their
    own numeric order), and a file named twice is read once.

    Raises:
        InputError: for a missing file, an empty pattern match, a directory with no inputs,
            or an input that is not a regular file (a FIFO, socket or device: named
            directly, matched by a glob or found in a directory), before any is opened.
    """
    files: list[InputFile] = []
    seen: set[str] = set()
    for pattern in patterns:
        expanded = _expand_one(pattern, suffixes)
        if not expanded:
            raise InputError(f"{pattern}: no input files ({', '.join(suffixes)}) found")
        for p in expanded:
            if p in seen:
                continue
            seen.add(p)
            if p == STDIN:
                files.append(InputFile(STDIN))
                continue
            try:
                st = os.stat(p)
            except OSError as exc:
                raise InputError(f"{p}: cannot read input ({exc.strerror})") from exc
            kind = special_kind(st.st_mode)
            if kind is not None:
                raise _not_regular(p, kind)
            files.append(InputFile(p, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    if not files:
        raise InputError("no input files given")
    return files
