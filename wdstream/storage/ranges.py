"""What an answer to a ranged GET promises, checked against what was asked (HTTP and S3).

A ``206`` must say which bytes it holds (``Content-Range``), start at the asked byte and
agree with its ``Content-Length``; anything else is not the asked bytes and fails the read
with a :class:`RemoteReadError` naming the URL and the offset, instead of landing in the
buffer at the wrong place (tests/test_storage_hostile_body.py). A range that stops short of
both the asked end and the object's end (a server or CDN that caps ranges) promises the bytes
up to there, so its body ends short and the read resumes after it, instead of ending as if
the object did.
"""

from __future__ import annotations

from wdstream.errors import RemoteReadError

__all__ = ["bad_answer", "content_range", "decimal", "promised_by_range"]


def decimal(value: str | None) -> int | None:
    """The number that ``value``, ASCII digits only, spells, else None.

    Not ``str.isdigit``: a header is decoded as Latin-1, where ``"\xb2"`` (superscript two)
    is a digit to ``isdigit`` but not to ``int``, and an answer's ``Content-Length: ²`` was
    a bare ValueError that no retry or message named (tools/faultlib/http_heads.py)."""
    if value is None:
        return None
    return int(value) if value.isascii() and value.isdigit() else None


def content_range(value: str) -> tuple[int | None, int | None]:
    """``"bytes 10-19/100"`` -> ``(10, 19)``; anything else -> ``(None, None)``."""
    unit, _, rest = value.partition(" ")
    span = rest.partition("/")[0]
    first, _, last = span.partition("-")
    return (None, None) if unit != "bytes" else (decimal(first), decimal(last))


def bad_answer(url: str, start: int, why: str) -> RemoteReadError:
    """The error for an answer to a ranged GET that cannot be the asked bytes."""
    return RemoteReadError(
        f"{url}: the answer to a GET from byte {start} is not the asked bytes: {why}",
        url, why, start,
    )  # fmt: skip


def promised_by_range(
    url: str, start: int, end: int | None, value: str | None, length: int | None
) -> int:
    """The bytes a partial answer with ``Content-Range`` ``value`` and ``Content-Length``
    ``length`` (None: not sent) promises to a GET of ``[start, end)``.

    Raises:
        RemoteReadError: the answer is not the asked bytes (see the module's text).
    """
    first, last = content_range(value or "")
    total = decimal((value or "").rpartition("/")[2])
    if first is None or last is None or last < first:
        raise bad_answer(url, start, f"a range answered with Content-Range {value!r}")
    if first != start:
        raise bad_answer(url, start, f"Content-Range starting at {first}")
    if length is not None and length != last - first + 1:
        raise bad_answer(url, start, f"Content-Length {length} for Content-Range {value}")
    limit = [end] if end is not None else []
    if total is not None:
        limit.append(total)
    if limit and last + 1 < min(limit):
        return min(limit) - start  # the body ends at ``last``: the read resumes there
    return last + 1 - start
