"""Storage backends behind one :class:`Store` interface, chosen by URL scheme.

``open_store("data/")`` -> local, ``open_store("s3://bucket/prefix/")`` -> S3,
``open_store("https://host/path/")`` -> HTTP. ``split_url`` turns a shard URL into the
store of its folder plus the object name, so brace patterns of URLs work on every backend.
See docs/STORAGE.md for the atomicity guarantees and the retry policy.
"""

from __future__ import annotations

import importlib
from typing import Any

from wdstream.storage.base import Store
from wdstream.storage.local import LocalStore
from wdstream.storage.retry import (
    RemoteReadError,
    RemoteStoreError,
    RemoteWriteError,
    RetryPolicy,
    redact_url,
)
from wdstream.storage.urls import split_url

__all__ = [
    "HttpStore",
    "LocalStore",
    "RemoteReadError",
    "RemoteStoreError",
    "RemoteWriteError",
    "RetryPolicy",
    "S3Store",
    "Store",
    "open_store",
    "redact_url",
    "split_url",
]

# Options that only mean something for remote stores; a local root accepts and ignores them
# so one set of storage options can be passed for any dataset URL.
_REMOTE_ONLY = frozenset(
    {
        "retries", "timeout", "backoff", "max_backoff", "deadline", "min_throughput", "budget",
        "endpoint_url",
    }
)  # fmt: skip


def open_store(url: str, create: bool = False, **options: Any) -> Store:
    """Return the store for a root URL or local path.

    Args:
        url: local folder, ``file://path``, ``s3://bucket/prefix``, or ``http(s)://host/path``.
        create: create the root if missing (local folders only; object stores need nothing).
        options: backend options: ``retries``, ``timeout`` (seconds, or a ``(connect, read)``
            pair), ``backoff``, ``max_backoff``, ``deadline``, ``min_throughput``, ``budget``
            for remote stores (see :class:`RetryPolicy`); ``endpoint_url``, ``region``,
            ``profile``, ``part_size`` for S3; ``headers``, ``verify`` for HTTP.

    Raises:
        ValueError: for a scheme wdstream does not read, such as ``pipe:``.
        TypeError: for an option the backend does not know.
    """
    allow_pipe = bool(options.pop("allow_pipe", False))
    if url.startswith("pipe:"):
        if not allow_pipe:
            raise ValueError(
                "pipe: URLs run shell commands and are refused; wdstream reads local paths, "
                "s3:// and http(s):// URLs"
            )
        raise ValueError(
            "pipe: URLs are not implemented by wdstream's stores (allow_pipe=True only lifts "
            "the refusal); use a local path, s3:// or http(s):// instead"
        )
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("", "file"):
        path = url[len("file://") :] if scheme == "file" else url
        unknown = set(options) - _REMOTE_ONLY
        if unknown:
            raise TypeError(f"options not understood by a local store: {sorted(unknown)}")
        return LocalStore(path, create=create)
    if scheme == "s3":
        return _backend("s3")(url, **options)
    if scheme in ("http", "https"):
        return _backend("http")(url, **options)
    raise ValueError(
        f"unsupported storage URL {redact_url(url)!r}: use a local path, s3:// or http(s)://"
    )


# scheme -> (module, class, the packages it needs, the extra that installs them)
_BACKENDS = {
    "s3": ("wdstream.storage.s3", "S3Store", "boto3, botocore and urllib3", "s3"),
    "http": ("wdstream.storage.http", "HttpStore", "requests and urllib3", "http"),
}


def _backend(scheme: str) -> Any:
    """The store class for ``scheme``, imported on first use (boto3 alone takes ~0.3 s).

    Raises:
        ImportError: naming the extra to install when the backend's packages are missing.
    """
    module, cls, needs, extra = _BACKENDS[scheme]
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as exc:
        raise ImportError(
            f"{scheme}:// storage needs {needs} ({exc.name} is missing): "
            f"pip install 'wdstream[{extra}]'"
        ) from exc


def __getattr__(name: str) -> Any:
    # Backends import boto3/requests; load them only when asked for.
    for scheme, (_, cls, _, _) in _BACKENDS.items():
        if name == cls:
            return _backend(scheme)
    raise AttributeError(f"module 'wdstream.storage' has no attribute {name!r}")
