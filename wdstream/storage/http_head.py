"""An answer's status line and headers, read without ``email``'s parser where that is exact.

``http.client`` reads an answer's header lines itself and then hands them to
``email.parser`` (a ``FeedParser`` building an ``HTTPMessage``), whose ``get`` runs each
value through the ``email`` policy again; urllib3 then copies the headers into its own
dict. On loopback that is ~20 % of the CPU of a ranged GET (profiled, issue 35: 105 GETs an
epoch of the bench dataset from nginx). :func:`begin` does what ``HTTPResponse.begin``
does, but where every header line is a plain ``Name: value`` line it builds the
``HTTPMessage`` directly: the same names, values, order and defects (none) ``email`` would
give. Any other line (a folded continuation, a name ``email`` would not take, a bare
``\\r``, an empty name, a ``From `` line) or a ``multipart/`` or ``message/`` content type
(whose empty body ``email`` would parse) goes to ``email``'s parser, as before.
"""

from __future__ import annotations

import email.parser
import http.client
import re
from typing import Any

__all__ = ["FastMessage", "begin", "codings", "parse_head"]

# A header line ``email``'s feedparser takes as one ``name: value`` header: a name of the
# characters it allows (not empty, no ``From `` line), the rest of the line without CR or LF.
_PLAIN = re.compile(rb"[\x21-\x39\x3b-\x7e]+:[^\r\n]*\r?\n")


class FastMessage(http.client.HTTPMessage):
    """An ``HTTPMessage`` whose ``get`` skips the policy's per-value parse for plain ASCII
    values (which it returns unchanged anyway)."""

    def get(self, name: str, failobj: Any = None) -> Any:
        """The first value of header ``name`` (any case), else ``failobj``."""
        name = name.lower()
        for k, v in self._headers:  # type: ignore[attr-defined]
            if k.lower() == name:
                if type(v) is str and v.isascii():
                    return v
                return self.policy.header_fetch_parse(k, v)
        return failobj


def parse_head(lines: list[bytes]) -> http.client.HTTPMessage:
    """The headers of ``lines`` (as ``http.client._read_headers`` returns them, the blank
    line that ends them last): built directly where each is a plain line (see the module's
    text), else by ``email``."""
    pairs = []
    end = len(lines) - 1 if lines and lines[-1] in (b"\r\n", b"\n", b"") else len(lines)
    for line in lines[:end]:
        if _PLAIN.fullmatch(line) is None or line.startswith(b"From "):
            return _by_email(lines)
        name, _, value = line.decode("iso-8859-1").partition(":")
        pairs.append((name, value.lstrip(" \t").rstrip("\r\n")))
    msg = FastMessage()
    msg._headers = pairs  # type: ignore[attr-defined]
    msg.set_payload("")  # email's: the (empty) text after the headers
    # email strips every blank str.strip knows (\x0b, \x1c, \xa0, ...) from the type.
    kind = msg.get("content-type", "").strip().lower()
    if kind.startswith(("multipart/", "message/")):
        return _by_email(lines)
    return msg


def _by_email(lines: list[bytes]) -> http.client.HTTPMessage:
    """What ``http.client.parse_headers`` makes of ``lines``."""
    text = b"".join(lines).decode("iso-8859-1")
    parser = email.parser.Parser(_class=http.client.HTTPMessage)
    return parser.parsestr(text)


def codings(values: list[str]) -> list[str]:
    """The transfer codings that ``Transfer-Encoding`` header values name, in order, lower
    case, without the blanks around them (RFC 9112, 6.1: a list, over one header or more)."""
    return [c.strip(" \t").lower() for v in values for c in v.split(",") if c.strip(" \t")]


def begin(resp: http.client.HTTPResponse) -> None:
    """``resp.begin()`` (Python 3.10-3.13's ``HTTPResponse.begin``, line for line) with
    :func:`parse_head` in place of ``http.client.parse_headers``, and every interim (1xx)
    answer before the final one skipped, not only ``100 Continue``: RFC 9110, 15.2 ("a client
    MUST be able to parse one or more 1xx responses received prior to a final response");
    ``http.client`` took a ``103 Early Hints`` for the answer, so the read failed with "HTTP
    103" (tools/faultlib/http_heads.py). A ``101`` is final: it is not the object. The
    interim answers are read under the head's deadline, like the rest of the head.

    The body is chunked when ``chunked`` is the last transfer coding (:func:`codings`), as
    RFC 9112, 6.3 reads it: ``http.client`` wanted the first header's value to be exactly
    ``chunked``, so ``chunked `` (a blank after it), ``identity, chunked`` or two headers
    had their chunk sizes read as the object's bytes, which then counted as bytes received
    (the store refuses other codings: ``HttpStore._fetch``)."""
    if resp.headers is not None:
        return
    r: Any = resp
    while True:
        version, status, reason = r._read_status()
        if not 100 <= status < 200 or status == http.client.SWITCHING_PROTOCOLS:
            break
        http.client._read_headers(r.fp)  # an interim answer's headers, dropped
    resp.code = resp.status = status
    resp.reason = reason.strip()
    if version in ("HTTP/1.0", "HTTP/0.9"):
        resp.version = 10
    elif version.startswith("HTTP/1."):
        resp.version = 11
    else:
        raise http.client.UnknownProtocol(version)
    resp.headers = resp.msg = parse_head(http.client._read_headers(r.fp))
    r.chunked = codings(resp.headers.get_all("transfer-encoding") or [])[-1:] == ["chunked"]
    if r.chunked:
        r.chunk_left = None
    r.will_close = r._check_close()
    resp.length = None
    length = resp.headers.get("content-length")
    if length and not r.chunked:
        try:
            resp.length = int(length)
        except ValueError:
            resp.length = None
        else:
            if resp.length < 0:
                resp.length = None
    if status in (http.client.NO_CONTENT, http.client.NOT_MODIFIED) or 100 <= status < 200:
        resp.length = 0
    elif r._method == "HEAD":
        resp.length = 0
    if not r.will_close and not r.chunked and resp.length is None:
        r.will_close = True
