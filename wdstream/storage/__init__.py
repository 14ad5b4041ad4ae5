"""Storage backends behind one :class:`Store` interface, chosen by URL scheme.

``open_store("data/")`` -> local, ``open_store("s3://bucket/prefix/")`` -> S3,
``open_store("https://host/path/")`` -> HTTP. ``split_url`` turns a shard URL into the
store of its folder plus the object name, so brace patterns of URLs work on every backend.
"""

from __future__ import annotations

import posixpath
from typing import Any

from wdstream.storage.base import Store
from wdstream.storage.local import LocalStore

__all__ = ["LocalStore", "Store", "open_store", "split_url"]


def open_store(url: str, create: bool = False, **options: Any) -> Store:
    """Return the store for a root URL or local path.

    Args:
        url: local folder, ``s3://bucket/prefix``, or ``http(s)://host/path``.
        create: create the root if missing (local folders only; object stores need nothing).
        options: backend options (``endpoint_url``, ``retries``, ``timeout``...).

    Raises:
        ValueError: for a scheme wdstream does not read, such as ``pipe:``.
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("", "file"):
        path = url[len("file://") :] if scheme == "file" else url
        return LocalStore(path, create=create)
    if url.startswith("pipe:"):
        raise ValueError(f"pipe: URLs run shell commands and are refused: {url!r}")
    raise ValueError(f"unsupported storage URL {url!r} (local paths only so far)")


def split_url(url: str) -> tuple[str, str]:
    """Split a shard URL or path into ``(root, name)``."""
    root, name = posixpath.split(url)
    return (root or "."), name
