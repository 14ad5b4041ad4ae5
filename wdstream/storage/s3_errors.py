"""S3 errors: which boto3 failures are worth another attempt, and which mean "missing".

Shared by the store's reads and writes (:mod:`wdstream.storage.s3`,
:mod:`wdstream.storage.s3_upload`).
"""

from __future__ import annotations

import botocore.exceptions as bce

from wdstream.storage.remote import NETWORK_ERRORS
from wdstream.storage.retry import transient_status

__all__ = ["error_code", "is_missing", "is_transient"]

_RETRYABLE_CODES = frozenset(
    {
        "SlowDown",
        "InternalError",
        "RequestTimeout",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
    }
)
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound", "NoSuchBucket"})


def error_code(exc: bce.ClientError) -> tuple[str, int]:
    """The S3 error code and HTTP status of a boto3 client error."""
    err = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    return str(err.get("Code", "")), int(meta.get("HTTPStatusCode", 0) or 0)


def is_transient(exc: BaseException) -> bool:
    """Whether an exception from boto3 is worth another attempt."""
    if isinstance(exc, bce.SSLError):
        return False
    if isinstance(exc, bce.ClientError):
        code, status = error_code(exc)
        # 501 NotImplemented (an unsupported header or feature) will not heal: not retried.
        return code in _RETRYABLE_CODES or transient_status(status)
    return isinstance(
        exc,
        (
            *NETWORK_ERRORS,
            bce.HTTPClientError,  # connection closed, read timeout, streaming error
            bce.ConnectionError,  # endpoint unreachable, connect timeout
            bce.IncompleteReadError,
        ),
    )


def is_missing(exc: bce.ClientError) -> bool:
    """Whether a client error says the object (or its bucket) does not exist."""
    code, status = error_code(exc)
    return code in _MISSING_CODES or status == 404
