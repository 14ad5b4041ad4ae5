"""Atomic S3 writes: one PutObject for a small object, a multipart upload for a large one.

The object appears under its key only when :meth:`S3Upload.finish` completes (the ``with``
block of :meth:`~wdstream.storage.s3.S3Store.writer` exited cleanly); :meth:`S3Upload.abort`
aborts the multipart upload. At most one part is held in memory.

An answer is not taken on trust (tests/test_storage_hostile_s3.py): a 200 without the
``UploadId`` or ``ETag`` that S3 always sends is retried like a 5xx (it was a bare
``KeyError``), and :meth:`S3Upload.finish` returns only once a HEAD finds the object with the
size written and the ETag the write was answered with: an endpoint that answers 200 yet
stores nothing (or completes an upload with an empty answer) fails the write, instead of a
``pack`` that exits 0 over a dataset missing a shard (or holding an older one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import botocore.exceptions as bce

from wdstream.errors import RemoteWriteError
from wdstream.storage.retry import TransientError, describe, log
from wdstream.storage.s3_errors import error_code

__all__ = ["S3Upload", "UploadTarget"]


class UploadTarget(Protocol):
    """What an upload uses of its store (:class:`~wdstream.storage.s3.S3Store` has it)."""

    bucket: str
    part_size: int

    @property
    def client(self) -> Any:
        """The boto3 S3 client of this process."""

    def child_url(self, name: str) -> str:
        """``s3://bucket/prefix/name``."""

    def write_call(self, fn: Callable[[], Any], what: str, url: str) -> Any:
        """``fn()`` under the store's retry policy; a final failure is a RemoteWriteError."""

    def object_key(self, name: str) -> str:
        """The key of ``name`` under the store's prefix."""

    def head(self, name: str) -> dict[str, Any] | None:
        """The object's HEAD, or None when it is missing."""

    def abort_leftovers(self, name: str) -> None:
        """Abort multipart uploads of ``name`` left by killed writers."""


class S3Upload:
    """File-like sink: keeps at most one part in memory; the first full part starts a
    multipart upload, ``finish`` completes it (or PUTs a small object), ``abort`` aborts."""

    def __init__(self, store: UploadTarget, name: str) -> None:
        self._store = store
        self._name = name
        self._key = store.object_key(name)
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
        return self._store.write_call(fn, what, self._url)

    def _answered(self, fn: Callable[[], Any], field: str, what: str) -> Any:
        """``fn()``'s answer, which must hold ``field`` (S3 always sends it): a 200 without
        it is retried like a 5xx."""

        def call() -> Any:
            resp = fn()
            if not resp.get(field):
                raise TransientError(f"{what} answered 200 without {field}")
            return resp

        return self._call(call, what)

    def _upload_part(self, data: bytes) -> None:
        s, client = self._store, self._store.client
        if self._upload_id is None:
            resp = self._answered(
                lambda: client.create_multipart_upload(Bucket=s.bucket, Key=self._key),
                "UploadId", "CreateMultipartUpload",
            )  # fmt: skip
            self._upload_id = resp["UploadId"]
        number = len(self._parts) + 1
        resp = self._answered(
            lambda: client.upload_part(
                Bucket=s.bucket, Key=self._key, UploadId=self._upload_id,
                PartNumber=number, Body=data,
            ),
            "ETag", f"UploadPart {number}",
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
            resp = self._answered(
                lambda: client.put_object(Bucket=s.bucket, Key=self._key, Body=body),
                "ETag", "PutObject",
            )  # fmt: skip
            self._check_stored(resp["ETag"])
            s.abort_leftovers(self._name)
            return
        if self._buf:
            self._upload_part(bytes(self._buf))
            self._buf.clear()
        upload_id, parts = self._upload_id, self._parts
        attempts = 0

        def complete() -> str | None:
            nonlocal attempts
            attempts += 1
            try:
                resp = client.complete_multipart_upload(
                    Bucket=s.bucket, Key=self._key, UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )  # fmt: skip
            except bce.ClientError as exc:
                # A retry after a lost reply finds the upload already completed.
                if attempts > 1 and error_code(exc)[0] == "NoSuchUpload":
                    head = s.head(self._name)
                    if head is not None and int(head["ContentLength"]) == self._pos:
                        return None
                raise
            if not resp.get("ETag"):  # an empty 200: S3 always names the object's ETag
                raise TransientError("CompleteMultipartUpload answered 200 without ETag")
            return str(resp["ETag"])

        etag = self._call(complete, "CompleteMultipartUpload")
        self._upload_id = None
        self._check_stored(etag)
        s.abort_leftovers(self._name)

    def _check_stored(self, etag: str | None) -> None:
        """Raise a RemoteWriteError unless a HEAD finds the object just written with its size
        and (when known) the ETag its write was answered with: one request per object, and
        S3's reads after a write see the write."""
        head = self._store.head(self._name)
        if head is None:
            why = "the endpoint answered the write with success, yet the object is missing"
        elif int(head["ContentLength"]) != self._pos:
            why = f"{self._pos} bytes written, the stored object has {head['ContentLength']}"
        elif etag is not None and _tag(head.get("ETag") or etag) != _tag(etag):
            why = f"written with ETag {etag}, the stored object has {head.get('ETag')}"
        else:
            return
        raise RemoteWriteError(f"{self._url}: {why}", self._url, why)

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


def _tag(etag: str) -> str:
    """An ETag compared as S3-compatible stores may spell it: quoted or not, any case."""
    return etag.removeprefix("W/").strip('"').lower()
