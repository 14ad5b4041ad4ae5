"""Dataset and shard URLs: the one place that reads a root, a shard name and a query string.

Every entry point (the packed reader, ``inspect``/``stats``/``verify``, the raw-text reader)
asks these functions what a source names, so a root given with a signed query string
(``http://host/ds/?token=abc``) is a root everywhere, and the query travels to every object
URL. In an http(s) URL ``?`` starts the query: it is never a wildcard there (``*`` and ``[``
still are, in the path); in local paths and ``s3://`` keys it is one.
"""

from __future__ import annotations

import posixpath
from urllib.parse import urlsplit, urlunsplit

__all__ = ["has_wildcard", "is_dataset_root", "is_shard_url", "join_url", "split_url", "url_path"]

_HTTP = ("http://", "https://")


def url_path(url: str) -> str:
    """The part of ``url`` that names objects: an http(s) URL without its query string."""
    return urlsplit(url).path if url.startswith(_HTTP) else url


def has_wildcard(name: str) -> bool:
    """Whether an object name (no query string) is a pattern to match against a listing."""
    return any(c in name for c in "*?[")


def is_shard_url(url: str) -> bool:
    """Whether ``url`` names one shard (``.../data-000000.tar``, query string allowed)."""
    return url_path(url).endswith(".tar")


def is_dataset_root(source: str) -> bool:
    """Whether ``source`` names a dataset root (a folder with ``index.json``), not a shard,
    a brace pattern or a wildcard; an http(s) root may carry a query string."""
    path = url_path(source)
    return not any(c in path for c in "{*[") and not has_wildcard(path) and not is_shard_url(source)


def split_url(url: str) -> tuple[str, str]:
    """Split a shard URL or path into ``(root, name)``.

    ``"s3://bucket/a/b.tar"`` -> ``("s3://bucket/a", "b.tar")``. The query string of an
    HTTP URL (a signed token) stays with the root, so ``open_store(root)`` appends it to
    every object it fetches.
    """
    if url.startswith(_HTTP):
        p = urlsplit(url)
        folder, name = posixpath.split(p.path)
        return urlunsplit((p.scheme, p.netloc, folder, p.query, "")), name
    root, name = posixpath.split(url)
    return (root or "."), name


def join_url(root: str, name: str) -> str:
    """The URL of object ``name`` under ``root``, the root's query string kept at the end:
    the inverse of :func:`split_url`."""
    if root.startswith(_HTTP):
        p = urlsplit(root)
        path = p.path.rstrip("/") + "/" + name
        return urlunsplit((p.scheme, p.netloc, path, p.query, ""))
    return f"{root.rstrip('/')}/{name}"
