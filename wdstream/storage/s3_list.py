"""S3 listings, checked rather than trusted (tests/test_storage_hostile_s3.py).

:func:`object_names` (``S3Store.list``) pages ListObjectsV2 and :func:`incomplete_uploads`
(``remove_partials`` and the leftovers' cleanup after each write) pages ListMultipartUploads
itself: botocore's paginator compares a continuation token only with the one before, so an
endpoint whose pages loop (tokens A, B, A, ...) never ended either listing. Here a token, a
marker or a key seen twice is an error naming the listing. A key outside the prefix is never
taken for one inside it: an endpoint that ignores ``Prefix`` or ``Delimiter`` made a glob
``ds/*.tar`` read the held-out split's ``ds/holdout/*.tar`` as training shards, and made
``remove_partials`` abort another dataset's live upload.
"""

from __future__ import annotations

from typing import Any

from wdstream.errors import RemoteReadError, RemoteWriteError

__all__ = ["incomplete_uploads", "object_names"]


def object_names(client: Any, bucket: str, prefix: str, page_size: int, url: str) -> list[str]:
    """The names (keys less ``prefix``) of the objects right under ``prefix``, sorted; none
    below a sub-folder, none starting with a dot.

    Raises:
        RemoteReadError: a key outside ``prefix``, a key or a continuation token seen twice.
    """
    names: list[str] = []
    keys: set[str] = set()
    tokens: set[str] = set()
    kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/",
                          "MaxKeys": page_size}  # fmt: skip
    while True:
        page = client.list_objects_v2(**kw)
        for obj in page.get("Contents", ()):
            key = str(obj["Key"])
            if key in keys or not key.startswith(prefix):
                why = f"key {key!r} " + ("listed twice" if key in keys else "outside the prefix")
                raise RemoteReadError(f"list {url}: the endpoint's listing is wrong: {why}",
                                      url, why)  # fmt: skip
            keys.add(key)
            name = key[len(prefix) :]
            if name and "/" not in name and not name.startswith("."):
                names.append(name)
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return sorted(names)
        if token in tokens:
            why = "a continuation token came back (pages loop)"
            raise RemoteReadError(f"list {url}: the endpoint's listing is wrong: {why}", url, why)
        tokens.add(token)
        kw["ContinuationToken"] = token


def incomplete_uploads(client: Any, bucket: str, prefix: str, url: str) -> list[tuple[str, str]]:
    """(key, upload id) of every incomplete multipart upload whose key starts with
    ``prefix``; an upload of another key is left out.

    Raises:
        RemoteWriteError: a page marker seen twice (pages that loop).
    """
    uploads: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    while True:
        page = client.list_multipart_uploads(**kw)
        uploads += [(str(u["Key"]), str(u["UploadId"])) for u in page.get("Uploads", ())
                    if str(u["Key"]).startswith(prefix)]  # fmt: skip
        marker = (str(page.get("NextKeyMarker") or ""), str(page.get("NextUploadIdMarker") or ""))
        if not page.get("IsTruncated") or not any(marker):
            return uploads
        if marker in seen:
            why = "a page marker came back (pages loop)"
            raise RemoteWriteError(f"ListMultipartUploads {url}: {why}", url, why)
        seen.add(marker)
        kw["KeyMarker"], kw["UploadIdMarker"] = marker
