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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, cast
from urllib.parse import urlsplit

import botocore.exceptions as bce
from botocore.config import Config

from wdstream.storage.body import iter_stream, socket_body
from wdstream.storage.http_get import head_deadline
from wdstream.storage.ranges import promised_by_range
from wdstream.storage.remote import RemoteStore
from wdstream.storage.retry import (
    Readable,
    RemoteReadError,
    RemoteWriteError,
    Retrier,
    RetryPolicy,
    TransientError,
    log,
)
from wdstream.storage.s3_errors import error_code, is_missing, is_transient
from wdstream.storage.s3_list import incomplete_uploads, object_names
from wdstream.storage.s3_session import shared_loader_session
from wdstream.storage.s3_upload import S3Upload

__all__ = ["MIN_PART_SIZE", "S3Store"]

# S3 rejects parts (other than the last) below 5 MiB.
MIN_PART_SIZE = 5 << 20
_CHUNK = 1 << 20


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
    # The client (sockets, credentials) is rebuilt in each process.
    _process_local = ("_retrier", "_lock", "_client", "_client_pid", "_leftovers_unlistable")

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
                    session = shared_loader_session(self.profile)
                    self._client = session.client(
                        "s3",
                        endpoint_url=self.endpoint_url,
                        region_name=self.region,
                        config=config,
                    )
                    head_deadline(self._client, self.policy.deadline)
                    self._client_pid = os.getpid()
        return self._client

    def object_key(self, name: str) -> str:
        """The key of ``name`` under this store's prefix."""
        return self.prefix + name

    def write_call(self, fn: Callable[[], Any], what: str, url: str) -> Any:
        """``fn()`` under this store's retry policy; a final failure is a RemoteWriteError."""
        return self._retrier.call(fn, what, url, RemoteWriteError)

    def child_url(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.object_key(name)}"

    def identity(self, name: str) -> str:
        return (
            f"{self.endpoint_url or os.environ.get('AWS_ENDPOINT_URL', '')} {self.child_url(name)}"
        )

    # -- reads ----------------------------------------------------------------------------

    def _fetch(
        self, name: str, start: int, end: int | None
    ) -> tuple[int, Iterable[bytes] | Readable]:
        kw: dict[str, Any] = {"Bucket": self.bucket, "Key": self.object_key(name)}
        if start > 0 or end is not None:
            kw["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        try:
            resp = self.client.get_object(**kw)
        except bce.ClientError as exc:
            if is_missing(exc):
                raise FileNotFoundError(f"no such object: {self.child_url(name)}") from None
            if error_code(exc)[0] == "InvalidRange":  # start at or past the end
                return 0, ()
            if error_code(exc)[1] == 403:
                raise PermissionError(f"access denied: {self.child_url(name)}") from None
            raise
        body = resp["Body"]
        promised = int(resp["ContentLength"])
        if "ContentRange" in resp or start > 0:  # a range must answer with its own bytes
            try:
                promised = promised_by_range(
                    self.child_url(name), start, end, resp.get("ContentRange"), promised
                )
            except RemoteReadError:
                body.close()
                raise
        raw = socket_body(getattr(body, "_raw_stream", None)) if end is not None else None
        out: Any = raw if raw is not None else _Chunks(body, _CHUNK)
        out.version = resp.get("ETag")  # one version per read (RemoteStore)
        return promised, out

    def head(self, name: str) -> dict[str, Any] | None:
        """The object's HEAD response, or None when it is missing."""

        def head_object() -> dict[str, Any] | None:
            try:
                return cast(
                    dict[str, Any],
                    self.client.head_object(Bucket=self.bucket, Key=self.object_key(name)),
                )
            except bce.ClientError as exc:
                if is_missing(exc):
                    return None
                raise

        return self._retrier.call(head_object, "HEAD", self.child_url(name))

    def size(self, name: str) -> int:
        head = self.head(name)
        if head is None:
            raise FileNotFoundError(f"no such object: {self.child_url(name)}")
        return int(head["ContentLength"])

    def exists(self, name: str) -> bool:
        return self.head(name) is not None

    def list(self) -> list[str]:
        """Names right under the prefix, the listing checked (:mod:`.s3_list`)."""
        return self._retrier.call(
            lambda: object_names(self.client, self.bucket, self.prefix, self._list_page_size,
                                 self.url),
            "list", self.url,
        )  # fmt: skip

    # -- writes ---------------------------------------------------------------------------

    @contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        out = S3Upload(self, name)
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
            lambda: self.client.delete_object(Bucket=self.bucket, Key=self.object_key(name)),
            "DELETE",
            self.child_url(name),
            RemoteWriteError,
        )

    def create_if_absent(self, name: str, data: bytes) -> None:
        """``PutObject(IfNoneMatch="*")``: atomic on AWS and the S3-compatible stores that
        support it; an endpoint that answers 501 (not implemented) gets a check then a write."""
        key, url = self.object_key(name), self.child_url(name)

        def put() -> bool:
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
            except bce.ClientError as exc:
                status = error_code(exc)[1]
                if status == 412:  # PreconditionFailed: it exists (ours, if a reply was lost)
                    return True
                if status == 409:  # ConditionalRequestConflict: a concurrent conditional put
                    raise TransientError(f"conditional put conflict on {key}") from None
                if status == 501:
                    return False
                raise
            return True

        if not self._retrier.call(put, "PutObject If-None-Match", url, RemoteWriteError):
            super().create_if_absent(name, data)

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
        """(key, upload id) of every incomplete multipart upload under ``prefix``, the
        listing checked (:mod:`.s3_list`)."""
        return incomplete_uploads(self.client, self.bucket, prefix, self.url)

    def _abort_upload(self, key: str, upload_id: str) -> None:
        def abort() -> None:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except bce.ClientError as exc:
                if error_code(exc)[0] != "NoSuchUpload":  # gone already is what we want
                    raise

        url = f"s3://{self.bucket}/{key}"
        self._retrier.call(abort, "AbortMultipartUpload", url, RemoteWriteError)

    def abort_leftovers(self, name: str) -> None:
        """Abort earlier incomplete multipart uploads of ``name``'s key (a killed writer's).

        Called after a complete write of the key, so it never races this writer's own
        upload; assumes one writer per key at a time (``pack`` holds a lock on its output).
        A failure here (for instance no ``s3:ListBucketMultipartUploads`` permission) does
        not fail the write, whose object is complete: it is logged once per store.
        """
        if self._leftovers_unlistable:
            return
        key, url = self.object_key(name), self.child_url(name)
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
