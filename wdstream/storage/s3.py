"""S3 store through boto3: ranged GETs with resuming retries, atomic multipart writes.

Credentials come from boto3's standard chain (environment, shared config/credentials files,
SSO, instance/container roles); none is ever held by wdstream. The endpoint comes from
boto3's own ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` variables or the
``endpoint_url`` option (MinIO, Ceph, R2, moto in the tests).

Atomicity: an object appears under its key only through one ``PutObject`` (small objects) or
one ``CompleteMultipartUpload`` (large ones), both sent only when the ``with`` block exits
cleanly. An exception aborts the multipart upload; a killed process leaves an *incomplete
multipart upload*, which is invisible to readers and listing but costs storage until it is
aborted. The next complete write of the same key aborts those leftovers (a rerun of a killed
pack rewrites the shard it was writing); :meth:`S3Store.remove_partials` clears a whole
prefix, and a bucket lifecycle rule clears what no rerun rewrites.

botocore's own retries are switched off so that one policy (:mod:`wdstream.storage.retry`)
governs every call, and so a retried read asks only for the bytes it is missing.
"""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, cast
from urllib.parse import urlsplit

import boto3
import botocore.exceptions as bce
import urllib3
from botocore.config import Config

from wdstream.storage.remote import RemoteStore
from wdstream.storage.retry import (
    RemoteWriteError,
    Retrier,
    RetryPolicy,
    TransientError,
    describe,
    iter_stream,
    log,
    transient_status,
)

__all__ = ["MIN_PART_SIZE", "S3Store"]

# S3 rejects parts (other than the last) below 5 MiB.
MIN_PART_SIZE = 5 << 20
_CHUNK = 1 << 20
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


def _code(exc: bce.ClientError) -> tuple[str, int]:
    err = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    return str(err.get("Code", "")), int(meta.get("HTTPStatusCode", 0) or 0)


def is_transient(exc: BaseException) -> bool:
    """Whether an exception from boto3 is worth another attempt."""
    if isinstance(exc, bce.SSLError):
        return False
    if isinstance(exc, bce.ClientError):
        code, status = _code(exc)
        # 501 NotImplemented (an unsupported header or feature) will not heal: not retried.
        return code in _RETRYABLE_CODES or transient_status(status)
    return isinstance(
        exc,
        (
            TransientError,
            bce.HTTPClientError,  # connection closed, read timeout, streaming error
            bce.ConnectionError,  # endpoint unreachable, connect timeout
            bce.IncompleteReadError,
            urllib3.exceptions.ProtocolError,
            urllib3.exceptions.ReadTimeoutError,
            ConnectionError,
            TimeoutError,
        ),
    )


class _Chunks:
    """The body of a GetObject response in chunks as they arrive (see ``iter_stream``);
    ``close()`` releases the connection."""

    def __init__(self, body: Any, chunk_size: int) -> None:
        self._body, self._chunk = body, chunk_size

    def __iter__(self) -> Iterator[bytes]:
        # botocore's StreamingBody only offers read(n), which loses a partial chunk when
        # the connection drops; its urllib3 response underneath has read1.
        raw = getattr(self._body, "_raw_stream", None)
        return iter_stream(raw if raw is not None else self._body, self._chunk)

    def close(self) -> None:
        self._body.close()


class S3Store(RemoteStore):
    """Objects under ``s3://bucket/prefix/``.

    Args:
        url: ``s3://bucket`` or ``s3://bucket/prefix``.
        endpoint_url: S3-compatible endpoint; default from boto3 (``AWS_ENDPOINT_URL``).
        region: region name; default from boto3's chain.
        profile: a named profile of the shared config files.
        retries, timeout, backoff, max_backoff, deadline, min_throughput, budget: see
            :class:`RetryPolicy`.
        part_size: bytes per multipart part (at least 5 MiB); objects up to this size are
            written with one PutObject.
        max_pool_connections: connections the client keeps (threads reading at once).
    """

    _list_page_size = 1000  # keys per ListObjectsV2 call (S3's maximum)

    def __init__(
        self,
        url: str,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        retries: int | None = None,
        timeout: float | tuple[float, float] | None = None,
        backoff: float | None = None,
        max_backoff: float | None = None,
        part_size: int = 8 << 20,
        max_pool_connections: int = 16,
        deadline: float | None = None,
        min_throughput: float | None = None,
        budget: float | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"not an s3://bucket/prefix URL: {url!r}")
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be >= {MIN_PART_SIZE} bytes, got {part_size!r}")
        self.bucket = parts.netloc
        prefix = parts.path.strip("/")
        self.prefix = prefix + "/" if prefix else ""
        self.url = f"s3://{self.bucket}/{prefix}".rstrip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        self.profile = profile
        self.policy = RetryPolicy.from_options(
            retries, timeout, backoff, max_backoff, deadline, min_throughput, budget
        )
        self.part_size = part_size
        self.max_pool_connections = max_pool_connections
        self._setup()

    def __repr__(self) -> str:
        return f"S3Store({self.url!r})"

    def _setup(self) -> None:
        self._retrier = Retrier(self.policy, is_transient)
        self._lock = threading.Lock()
        self._client: Any = None
        self._client_pid: int | None = None
        self._leftovers_unlistable = False

    def __getstate__(self) -> dict[str, Any]:
        # The client (sockets, credentials) is rebuilt in each DataLoader worker.
        state = self.__dict__.copy()
        for key in ("_retrier", "_lock", "_client", "_client_pid", "_leftovers_unlistable"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    @property
    def client(self) -> Any:
        """The boto3 client of this process, made on first use.

        boto3 *clients* are thread-safe (sessions are not), so one client per process
        serves the reader's read-ahead thread too; it is made under a lock.
        """
        if self._client is None or self._client_pid != os.getpid():
            with self._lock:
                if self._client is None or self._client_pid != os.getpid():
                    config = Config(
                        connect_timeout=self.policy.connect_timeout,
                        read_timeout=self.policy.read_timeout,
                        retries={"total_max_attempts": 1, "mode": "standard"},
                        max_pool_connections=self.max_pool_connections,
                    )
                    session = boto3.session.Session(profile_name=self.profile)
                    self._client = session.client(
                        "s3",
                        endpoint_url=self.endpoint_url,
                        region_name=self.region,
                        config=config,
                    )
                    self._client_pid = os.getpid()
        return self._client

    def _key(self, name: str) -> str:
        return self.prefix + name

    def child_url(self, name: str) -> str:
        return f"s3://{self.bucket}/{self._key(name)}"

    def _missing(self, exc: bce.ClientError, name: str) -> bool:
        code, status = _code(exc)
        return code in _MISSING_CODES or status == 404

    # -- reads ----------------------------------------------------------------------------

    def _fetch(self, name: str, start: int, end: int | None) -> tuple[int, Iterable[bytes]]:
        kw: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(name)}
        if start > 0 or end is not None:
            kw["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        try:
            resp = self.client.get_object(**kw)
        except bce.ClientError as exc:
            if self._missing(exc, name):
                raise FileNotFoundError(f"no such object: {self.child_url(name)}") from None
            if _code(exc)[0] == "InvalidRange":  # start at or past the end
                return 0, ()
            if _code(exc)[1] == 403:
                raise PermissionError(f"access denied: {self.child_url(name)}") from None
            raise
        return int(resp["ContentLength"]), _Chunks(resp["Body"], _CHUNK)

    def _head(self, name: str) -> dict[str, Any] | None:
        def head() -> dict[str, Any] | None:
            try:
                return cast(
                    dict[str, Any],
                    self.client.head_object(Bucket=self.bucket, Key=self._key(name)),
                )
            except bce.ClientError as exc:
                if self._missing(exc, name):
                    return None
                raise

        return self._retrier.call(head, "HEAD", self.child_url(name))

    def size(self, name: str) -> int:
        head = self._head(name)
        if head is None:
            raise FileNotFoundError(f"no such object: {self.child_url(name)}")
        return int(head["ContentLength"])

    def exists(self, name: str) -> bool:
        return self._head(name) is not None

    def list(self) -> list[str]:
        def list_all() -> list[str]:
            names = []
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket,
                Prefix=self.prefix,
                Delimiter="/",
                PaginationConfig={"PageSize": self._list_page_size},
            )
            for page in pages:
                for obj in page.get("Contents", ()):
                    name = obj["Key"][len(self.prefix) :]
                    if name and not name.startswith("."):
                        names.append(name)
            return sorted(names)

        return self._retrier.call(list_all, "list", self.url)

    # -- writes ---------------------------------------------------------------------------

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        out = _S3Writer(self, name)
        done = False
        try:
            yield cast(BinaryIO, out)
            out.finish()
            done = True
        finally:
            if not done:
                out.abort()

    def delete(self, name: str) -> None:
        self._retrier.call(
            lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(name)),
            "DELETE",
            self.child_url(name),
            RemoteWriteError,
        )

    def remove_partials(self) -> int:
        """Abort incomplete multipart uploads under the prefix (leftovers of killed writers);
        returns how many were aborted. Do not run it while another writer is active."""
        uploads = self._retrier.call(
            lambda: self._incomplete_uploads(self.prefix), "ListMultipartUploads", self.url,
            RemoteWriteError,
        )  # fmt: skip
        for key, upload_id in uploads:
            self._abort_upload(key, upload_id)
        return len(uploads)

    # builtins.list: inside this class ``list`` names the method S3Store.list.
    def _incomplete_uploads(self, prefix: str) -> builtins.list[tuple[str, str]]:
        """(key, upload id) of every incomplete multipart upload whose key starts with
        ``prefix``."""
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        return [(u["Key"], u["UploadId"]) for page in pages for u in page.get("Uploads", ())]

    def _abort_upload(self, key: str, upload_id: str) -> None:
        def abort() -> None:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except bce.ClientError as exc:
                if _code(exc)[0] != "NoSuchUpload":  # gone already is what we want
                    raise

        url = f"s3://{self.bucket}/{key}"
        self._retrier.call(abort, "AbortMultipartUpload", url, RemoteWriteError)

    def _abort_leftovers(self, name: str) -> None:
        """Abort earlier incomplete multipart uploads of ``name``'s key (a killed writer's).

        Called after a complete write of the key, so it never races this writer's own
        upload; assumes one writer per key at a time (``pack`` holds a lock on its output).
        A failure here (for instance no ``s3:ListBucketMultipartUploads`` permission) does
        not fail the write, whose object is complete: it is logged once per store.
        """
        if self._leftovers_unlistable:
            return
        key, url = self._key(name), self.child_url(name)
        try:
            uploads = self._retrier.call(
                lambda: self._incomplete_uploads(key), "ListMultipartUploads", url,
                RemoteWriteError,
            )  # fmt: skip
            for other_key, upload_id in uploads:
                if other_key == key:  # the prefix also matches longer keys
                    self._abort_upload(key, upload_id)
        except RemoteWriteError as exc:
            self._leftovers_unlistable = True
            log.warning(
                "%s is written, but earlier incomplete multipart uploads of it could not be "
                "aborted (%s); not trying again for %s. Use remove_partials() or a bucket "
                "lifecycle rule AbortIncompleteMultipartUpload",
                url, exc.cause, self.url,
            )  # fmt: skip

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class _S3Writer:
    """File-like sink: keeps at most one part in memory; the first full part starts a
    multipart upload, ``finish`` completes it (or PUTs a small object), ``abort`` aborts."""

    def __init__(self, store: S3Store, name: str) -> None:
        self._store = store
        self._name = name
        self._key = store._key(name)
        self._url = store.child_url(name)
        self._buf = bytearray()
        self._pos = 0
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self.closed = False

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.closed:
            raise ValueError(f"write to a finished writer of {self._url}")
        n = len(data)
        self._buf += data
        self._pos += n
        size = self._store.part_size
        while len(self._buf) >= size:
            # Keep one byte back so the last part is never empty.
            if len(self._buf) == size:
                break
            self._upload_part(bytes(self._buf[:size]))
            del self._buf[:size]
        return n

    def _call(self, fn: Any, what: str) -> Any:
        return self._store._retrier.call(fn, what, self._url, RemoteWriteError)

    def _upload_part(self, data: bytes) -> None:
        s, client = self._store, self._store.client
        if self._upload_id is None:
            resp = self._call(
                lambda: client.create_multipart_upload(Bucket=s.bucket, Key=self._key),
                "CreateMultipartUpload",
            )
            self._upload_id = resp["UploadId"]
        number = len(self._parts) + 1
        resp = self._call(
            lambda: client.upload_part(
                Bucket=s.bucket, Key=self._key, UploadId=self._upload_id,
                PartNumber=number, Body=data,
            ),
            f"UploadPart {number}",
        )  # fmt: skip
        part = {"ETag": resp["ETag"], "PartNumber": number}
        for field in ("ChecksumCRC32", "ChecksumCRC32C", "ChecksumCRC64NVME", "ChecksumSHA1"):
            if resp.get(field):
                part[field] = resp[field]
        self._parts.append(part)

    def finish(self) -> None:
        """Make the object visible under its name (only call on a clean exit)."""
        s, client = self._store, self._store.client
        self.closed = True
        if self._upload_id is None:
            body = bytes(self._buf)
            self._call(
                lambda: client.put_object(Bucket=s.bucket, Key=self._key, Body=body),
                "PutObject",
            )
            s._abort_leftovers(self._name)
            return
        if self._buf:
            self._upload_part(bytes(self._buf))
            self._buf.clear()
        upload_id, parts = self._upload_id, self._parts
        attempts = 0

        def complete() -> None:
            nonlocal attempts
            attempts += 1
            try:
                client.complete_multipart_upload(
                    Bucket=s.bucket, Key=self._key, UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )  # fmt: skip
            except bce.ClientError as exc:
                # A retry after a lost reply finds the upload already completed.
                if attempts > 1 and _code(exc)[0] == "NoSuchUpload":
                    head = s._head(self._name)
                    if head is not None and int(head["ContentLength"]) == self._pos:
                        return
                raise

        self._call(complete, "CompleteMultipartUpload")
        self._upload_id = None
        s._abort_leftovers(self._name)

    def abort(self) -> None:
        """Drop everything written; nothing appears under the name."""
        self.closed = True
        self._buf.clear()
        if self._upload_id is None:
            return
        s, upload_id = self._store, self._upload_id
        self._upload_id = None
        try:
            s.client.abort_multipart_upload(Bucket=s.bucket, Key=self._key, UploadId=upload_id)
        except Exception as exc:  # the original exception matters more than this one
            log.warning(
                "could not abort the multipart upload of %s (%s); the next complete write "
                "of it, S3Store.remove_partials() or a lifecycle rule will clear it",
                self._url, describe(exc),
            )  # fmt: skip
