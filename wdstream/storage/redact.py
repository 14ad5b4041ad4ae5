"""Redaction: what a message, a log line or ``store.url`` may show of a URL or an error.

``user:pass@`` becomes ``***@``, a query string (a presigned signature) ``?<redacted>``, and
``Authorization``/signature/token fields that a client library echoes in an exception text
are scrubbed (docs/STORAGE.md, "Credentials").
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["describe", "redact_text", "redact_url"]

_USERINFO = re.compile(r"(?<=//)[^/@\s'\"]+@")
_QUERY = re.compile(r"\?[^\s'\"()<>]+")
# Header-looking secrets a library might echo in an exception text. A quoted value is
# dropped whole; an unquoted Authorization value loses its scheme and its credentials.
_SECRET_FIELDS = re.compile(
    r"(?i)(authorization|x-amz-security-token|x-amz-credential|x-amz-signature|"
    r"signature|aws_secret_access_key|aws_access_key_id|password|token)"
    r"(['\"]?\s*[:=]\s*)"
    r"('[^']*'|\"[^\"]*\"|[^\s'\",&}]+)"
)
_AUTH_UNQUOTED = re.compile(
    r"(?i)(authorization['\"]?\s*[:=]\s*)([^\s'\"][^\s'\",&}]*(?:\s+[^\s'\",&}]+)?)"
)


def redact_url(url: str) -> str:
    """The URL with ``user:pass@`` and any query string (presigned signatures) removed."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "<redacted>" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def redact_text(text: str) -> str:
    """Scrub URL credentials, query strings and secret-looking fields from free text."""
    text = _USERINFO.sub("***@", text)
    text = _QUERY.sub("?<redacted>", text)
    text = _AUTH_UNQUOTED.sub(r"\1<redacted>", text)
    return _SECRET_FIELDS.sub(r"\1\2<redacted>", text)


def describe(exc: BaseException) -> str:
    """One-line, redacted description of an exception, for messages and logs."""
    text = str(exc) or exc.__class__.__name__
    # botocore's ClientError text names the S3 error code but not the HTTP status.
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status:
            text = f"HTTP {status}: {text}"
    name = exc.__class__.__name__.lstrip("_")  # a private class still reads as a name
    return f"{name}: {redact_text(text)}"[:500]
