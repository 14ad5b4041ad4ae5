"""Lines of an input read with a bound on their length, so no record can exhaust memory.

A 33 KB ``.zst`` can hold a 1 GiB line (a decompression bomb), and a plain file or stdin
can hold a line that never ends; ``readline()`` without a limit would try to hold it all.
Every reader of input records (the pack's :class:`~wdstream.inputs.DocumentReader`, the
Ray engine's byte ranges, the raw-text reader) reads lines through :func:`bounded_lines`:
a line of at most ``limit`` bytes (its line end included) comes out as bytes, a longer one
as a :class:`LongLine` that holds its size only, so the caller refuses or skips it by its
line number without the line ever being in memory beyond ``limit`` bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, NamedTuple

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "LongLine",
    "bounded_lines",
    "check_limit",
    "read_bounded",
    "skip_line",
    "too_long",
]

DEFAULT_MAX_RECORD_BYTES = 256 << 20  # far above any real document, far below a bomb
_CHUNK = 1 << 20  # bytes read at a time past the first MiB of a line


class LongLine(NamedTuple):
    """A line longer than the limit, not kept: its size in bytes.

    ``complete`` is False when the line was not read to its end (the reader stops at the
    first one when it refuses it), and then ``size`` is only a lower bound.
    """

    size: int
    complete: bool


def check_limit(limit: int) -> int:
    """``limit`` if it is a usable record limit (bytes, at least 1), else a ValueError."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_record_bytes must be a positive number of bytes, got {limit!r}")
    return limit


def too_long(line: LongLine | int, limit: int) -> str:
    """Why a record of this size is refused, and what to do (for a ``where: why`` message)."""
    exact = isinstance(line, int) or line.complete
    size = line if isinstance(line, int) else line.size
    what = f"record of {size:,} bytes is longer" if exact else "record longer"
    return (
        f"{what} than the limit of {limit:,} bytes (max_record_bytes / --max-record-bytes: "
        "raise it for such records, or skip them with on_error='skip' / --on-error skip)"
    )


def skip_line(fh: IO[bytes]) -> int:
    """Read past the rest of the current line in chunks; the bytes read (newline included)."""
    size = 0
    while True:
        part = fh.readline(_CHUNK)
        size += len(part)
        if not part or part.endswith(b"\n"):
            return size


def _read_line(fh: IO[bytes], limit: int) -> bytes | LongLine:
    """The next line, or, past ``limit`` bytes, a :class:`LongLine` of what was read of it."""
    first = fh.readline(min(limit + 1, _CHUNK))
    if len(first) > limit:
        return LongLine(len(first), first.endswith(b"\n"))
    if len(first) < _CHUNK or first.endswith(b"\n"):
        return first
    parts, size = [first], len(first)  # a line over a MiB: gathered a chunk at a time
    while True:
        part = fh.readline(min(_CHUNK, limit + 1 - size))
        size += len(part)
        if size > limit:
            return LongLine(size, part.endswith(b"\n"))
        parts.append(part)
        if not part or part.endswith(b"\n"):
            return b"".join(parts)


def bounded_lines(fh: IO[bytes], limit: int, read_long: bool) -> Iterator[bytes | LongLine]:
    """The lines of ``fh``; one longer than ``limit`` bytes comes as a :class:`LongLine`.

    With ``read_long`` a long line is read to its end (chunk by chunk, never held) so the
    lines after it follow; without, the iteration stops after yielding it (the caller
    refuses the input there, and reading on to the end of a bomb would only cost time).
    """
    while True:
        line = _read_line(fh, limit)
        if isinstance(line, bytes):
            if not line:
                return
            yield line
        elif not read_long:
            yield line
            return
        else:
            yield LongLine(line.size + (0 if line.complete else skip_line(fh)), True)


def read_bounded(fh: IO[bytes], limit: int, read_long: bool) -> bytes | LongLine:
    """All of ``fh`` (one whole-file document), or, past ``limit`` bytes, a :class:`LongLine`.

    Over the limit, with ``read_long`` the rest is read in chunks only to count it (for
    the input byte counters of a pack that skips it); nothing past ``limit + 1`` bytes is
    held.
    """
    data = fh.read(limit + 1)
    if len(data) <= limit:
        return data
    size = len(data)
    del data
    if not read_long:
        return LongLine(size, False)
    while part := fh.read(_CHUNK):
        size += len(part)
    return LongLine(size, True)
