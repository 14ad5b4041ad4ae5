"""An S3 endpoint that lies (session 45): the S3 store read and written through a proxy in front
of moto's S3 server (``tests/hostile_s3.py``) that rewrites a seeded share of its answers.

Reads (``Loader`` on ``s3://bucket/ds``, the root or a glob, 0 and 2 workers, node cache on and
off): GetObject answered 200 with the whole object to a Range, 206 with a shifted
Content-Range, a body cut short of its Content-Length, longer than it, bytes after it on the
kept-alive connection, gzip-encoded, another ETag (the object replaced), SlowDown, 416, a 200 of
malformed XML; ListObjectsV2 ignoring the Delimiter (the held-out split ``ds/holdout/`` listed
too), looping its pages, naming keys outside the prefix; HeadObject lying about the size; a
head trickled a byte per 0.2 s. Oracle: the Loader's rows over the local copy.

Writes (the store's ``write_bytes`` of a dataset with 9 MB shards, so multipart uploads, and
``wdstream.pack`` with its journal): PutObject / CompleteMultipartUpload answered 200 without
storing, an empty 200, a 200 holding an ``<Error>``, CreateMultipartUpload without UploadId,
UploadPart without or with a wrong ETag, SlowDown; ListMultipartUploads looping its pages or
ignoring Prefix (another dataset's live upload listed). Oracle: every object read from moto
directly with boto3 against the local pack's files (sha256); a pack that failed is rerun
against the honest endpoint and must then equal it; the other dataset's upload still there.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from faultlib.common import Attempt, clean_dataset, compare, read_rows
from wdstream.errors import WdstreamError
from wdstream.storage import open_store
from wdstream.testing import write_synthetic_dataset

LIMITS = {"retries": 2, "timeout": 1.0, "deadline": 2.0, "budget": 4.0, "backoff": 0.02}
Lie = Callable[[Any, Callable[[], Any]], Any]


def _hostile() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import tests.hostile_s3 as hostile  # the storage tests' lying S3 proxy

    return hostile


class _Moto:
    """A moto S3 server for one attempt (bucket ``bkt``), its endpoint in the environment."""

    def __enter__(self) -> _Moto:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        logging.getLogger("wdstream").setLevel(logging.ERROR)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                          AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=self.url)  # fmt: skip
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            os.environ.pop(var, None)
        self.client = boto3.client("s3", endpoint_url=self.url)
        self.client.create_bucket(Bucket="bkt")
        return self

    def live_upload(self) -> Callable[[], str | None]:
        """Start another dataset's multipart upload; the function returned says what went
        wrong with it afterwards (None: still there, as it must be)."""
        upload = self.client.create_multipart_upload(Bucket="bkt", Key="other/live.tar")

        def check() -> str | None:
            left = self.client.list_multipart_uploads(Bucket="bkt").get("Uploads", [])
            ids = {u["UploadId"] for u in left}
            return None if upload["UploadId"] in ids else "another prefix's live upload aborted"

        return check

    def upload(self, local: str, prefix: str) -> None:
        for f in sorted(Path(local).iterdir()):
            self.client.upload_file(str(f), "bkt", f"{prefix}/{f.name}")

    def tree(self, prefix: str) -> dict[str, str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket="bkt", Prefix=prefix)
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        return {k.removeprefix(prefix): hashlib.sha256(self.client.get_object(
            Bucket="bkt", Key=k)["Body"].read()).hexdigest() for k in keys}  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def _tree(root: str) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in Path(root).iterdir() if p.is_file() and not p.name.startswith(".")}  # fmt: skip


# ------------------------------------------------------------------------------ the lies


def _read_lies(hostile: Any, client: Any) -> dict[str, tuple[str, Lie]]:
    """name -> (S3 operation, lie) for the read side."""
    Reply = hostile.Reply  # noqa: N806 - a class

    def whole(req: Any, fwd: Any) -> Any:
        r = fwd()
        if r.status == 206:
            r.status, r.body = 200, client.get_object(Bucket="bkt", Key=req.key)["Body"].read()
            r.headers.pop("content-range", None)
        return r

    def shifted(req: Any, fwd: Any) -> Any:
        r = fwd()
        m = re.match(r"bytes (\d+)-(\d+)/(\d+)", r.headers.get("content-range", ""))
        if m and len(r.body) > 7:
            a, b, t = m.groups()
            r.headers["content-range"], r.body = f"bytes {int(a) + 7}-{b}/{t}", r.body[7:]
        return r

    def body(fn: Callable[[Any], None]) -> Lie:
        def lie(req: Any, fwd: Any) -> Any:
            r = fwd()
            fn(r)
            return r

        return lie

    def cut(r: Any) -> None:
        r.send = len(r.body) // 2

    def longer(r: Any) -> None:
        r.body += b"X" * 10

    def extra(r: Any) -> None:
        r.extra = b"HTTP/1.1 200 OK\r\n" * 3

    def gzipped(r: Any) -> None:
        import gzip

        r.body, r.headers["content-encoding"] = gzip.compress(r.body), "gzip"

    def replaced(r: Any) -> None:
        r.headers["etag"] = f'"{random.getrandbits(64):032x}"'

    def head_size(r: Any) -> None:
        r.length = max(0, (r.length or 0) + random.choice([-100, -1, 1, 100]))

    def trickle(r: Any) -> None:
        r.head_trickle = 0.2

    def slowdown(req: Any, fwd: Any) -> Any:
        return Reply(503, {}, hostile.error_xml("SlowDown"))

    def invalid_range(req: Any, fwd: Any) -> Any:
        return Reply(416, {"content-type": "application/xml"}, hostile.error_xml("InvalidRange"))

    def bad_xml(req: Any, fwd: Any) -> Any:
        fwd()
        return Reply(200, {}, b"<ListBucketResult><Contents><Key>ds/a")

    def no_delimiter(req: Any, fwd: Any) -> Any:
        req.path = re.sub(r"&?delimiter=[^&]*", "", req.path)
        return fwd()

    def looping(req: Any, fwd: Any) -> Any:
        token = req.query.get("continuation-token", ["B"])[0]
        req.path = re.sub(r"&?continuation-token=[^&]*", "", req.path)
        r = fwd()
        more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{'AB'[token == 'A']}"
        r.body = r.body.replace(b"<IsTruncated>false</IsTruncated>",
                                more.encode() + b"</NextContinuationToken>")  # fmt: skip
        return r

    def outside(req: Any, fwd: Any) -> Any:
        r = fwd()
        keys = ["other/data-000099.tar", "ds/../data-000098.tar", "/data-000097.tar"]
        extra_keys = "".join(f"<Contents><Key>{k}</Key><Size>1</Size></Contents>" for k in keys)
        r.body = r.body.replace(
            b"</ListBucketResult>", extra_keys.encode() + b"</ListBucketResult>"
        )
        return r

    return {
        "GetObject 200 whole object to a Range": ("GetObject", whole),
        "GetObject shifted Content-Range": ("GetObject", shifted),
        "GetObject body cut short": ("GetObject", body(cut)),
        "GetObject body longer than Content-Length": ("GetObject", body(longer)),
        "GetObject bytes after the body": ("GetObject", body(extra)),
        "GetObject gzip": ("GetObject", body(gzipped)),
        "GetObject another ETag": ("GetObject", body(replaced)),
        "GetObject SlowDown": ("GetObject", slowdown),
        "GetObject 416 InvalidRange": ("GetObject", invalid_range),
        "GetObject head trickled": ("GetObject", body(trickle)),
        "HeadObject size": ("HeadObject", body(head_size)),
        "ListObjectsV2 ignores Delimiter": ("ListObjectsV2", no_delimiter),
        "ListObjectsV2 pages loop": ("ListObjectsV2", looping),
        "ListObjectsV2 keys outside the prefix": ("ListObjectsV2", outside),
        "ListObjectsV2 malformed XML": ("ListObjectsV2", bad_xml),
    }


def _write_lies(hostile: Any) -> dict[str, tuple[str, Lie]]:
    """name -> (S3 operation, lie) for the write side."""
    Reply, error_xml = hostile.Reply, hostile.error_xml  # noqa: N806 - a class

    def not_stored(req: Any, fwd: Any) -> Any:
        return Reply(200, {"etag": f'"{hashlib.md5(req.body).hexdigest()}"'}, b"")

    def empty(req: Any, fwd: Any) -> Any:
        fwd()
        return Reply(200, {}, b"")

    def error200(req: Any, fwd: Any) -> Any:
        return Reply(200, {}, error_xml("InternalError"))

    def wrong_etag(req: Any, fwd: Any) -> Any:
        r = fwd()
        r.headers["etag"] = '"0123456789abcdef0123456789abcdef"'
        return r

    def slowdown(req: Any, fwd: Any) -> Any:
        return Reply(503, {}, error_xml("SlowDown"))

    def uploads_loop(req: Any, fwd: Any) -> Any:
        marker = req.query.get("key-marker", ["B"])[0]
        req.path = re.sub(r"&?(key-marker|upload-id-marker)=[^&]*", "", req.path)
        r = fwd()
        nxt = "AB"[marker == "A"]
        more = f"<IsTruncated>true</IsTruncated><NextKeyMarker>{nxt}</NextKeyMarker>"
        more += f"<NextUploadIdMarker>{nxt}</NextUploadIdMarker>"
        r.body = r.body.replace(b"<IsTruncated>false</IsTruncated>", more.encode())
        return r

    def no_prefix(req: Any, fwd: Any) -> Any:
        req.path = re.sub(r"&?prefix=[^&]*", "", req.path)
        return fwd()

    return {
        "PutObject 200, not stored": ("PutObject", not_stored),
        "PutObject empty 200 (forwarded)": ("PutObject", empty),
        "PutObject SlowDown": ("PutObject", slowdown),
        "CompleteMultipartUpload 200, not done": ("CompleteMultipartUpload", not_stored),
        "CompleteMultipartUpload empty 200 (done)": ("CompleteMultipartUpload", empty),
        "CompleteMultipartUpload 200 <Error>": ("CompleteMultipartUpload", error200),
        "CreateMultipartUpload without UploadId": ("CreateMultipartUpload", empty),
        "UploadPart without ETag": ("UploadPart", empty),
        "UploadPart wrong ETag": ("UploadPart", wrong_etag),
        "UploadPart SlowDown": ("UploadPart", slowdown),
        "ListMultipartUploads pages loop": ("ListMultipartUploads", uploads_loop),
        "ListMultipartUploads ignores Prefix": ("ListMultipartUploads", no_prefix),
    }


def _seeded(op: str, lie: Lie, seed: int, p: float, honest: Lie) -> Lie:
    """``lie`` told to a seeded share ``p`` of the requests of ``op``, by request number."""
    count = [0]

    def told(req: Any, fwd: Any) -> Any:
        if req.op != op:
            return honest(req, fwd)
        count[0] += 1
        hit = random.Random(seed * 1_000_003 + count[0]).random() < p
        return lie(req, fwd) if hit else honest(req, fwd)

    return told


# ------------------------------------------------------------------------------ attempts


def s3_lies(work: Path, scale: float) -> Iterator[Attempt]:
    root, want = clean_dataset(work)
    held = work / "s3-held"
    if not held.exists():
        write_synthetic_dataset(str(held), n_docs=8, sample_tokens=33, samples_per_shard=9,
                                seed=5)  # fmt: skip
    big = work / "s3-big"  # two shards of ~9 MB: multipart uploads
    if not big.exists():
        write_synthetic_dataset(str(big), n_docs=2, doc_lens=[2_300_000, 2_300_000],
                                sample_tokens=1025, samples_per_shard=2200)  # fmt: skip

    def read(name: str, seed: int, p: float, workers: int, cached: bool, glob: bool) -> Attempt:
        def attempt() -> str:
            hostile = _hostile()
            with _Moto() as moto:
                moto.upload(root, "ds")
                moto.upload(str(held), "ds/holdout")
                op, lie = _read_lies(hostile, moto.client)[name]
                told = _seeded(op, lie, seed, p, hostile.honest)
                with hostile.LyingS3(moto.url, told) as s3, _cache(work, cached) as extra:
                    url = "s3://bkt/ds" + ("/*.tar" if glob else "")
                    local = root + ("/*.tar" if glob else "")
                    expect = want if not glob else read_rows(local)
                    return compare(lambda: read_rows(url, num_workers=workers,
                                                     endpoint_url=s3.base_url, **LIMITS,
                                                     **extra), expect)  # fmt: skip

        return attempt

    def write(name: str, seed: int, p: float) -> Attempt:
        def attempt() -> str:
            hostile = _hostile()
            with _Moto() as moto:
                live = moto.live_upload()
                op, lie = _write_lies(hostile)[name]
                told = _seeded(op, lie, seed, p, hostile.honest)
                with hostile.LyingS3(moto.url, told) as s3:
                    store = open_store("s3://bkt/big", endpoint_url=s3.base_url, **LIMITS)
                    try:
                        for f in sorted(big.iterdir()):
                            store.write_bytes(f.name, f.read_bytes())
                    except WdstreamError:
                        wrong = live()
                        return f"silent wrong: {name}: {wrong}" if wrong else "clear error"
                got, ref = moto.tree("big/"), _tree(str(big))
                wrong = live() or (None if got == ref else "objects differ")
                return f"silent wrong: {name}: {wrong}" if wrong else "handled"

        return attempt

    def pack(name: str, seed: int, p: float) -> Attempt:
        def attempt() -> str:
            import wdstream
            from faultlib.packs import pack_input

            hostile = _hostile()
            src, ref = pack_input(work)
            kw: dict[str, Any] = {"seq_len": 63, "shard_size": "16KB", "workers": 0,
                                  "progress": False}  # fmt: skip
            with _Moto() as moto:
                live = moto.live_upload()
                op, lie = _write_lies(hostile)[name]
                told = _seeded(op, lie, seed, p, hostile.honest)
                with hostile.LyingS3(moto.url, told) as s3:
                    try:
                        wdstream.pack(
                            [str(src)],
                            "s3://bkt/p",
                            **kw,
                            store_options={"endpoint_url": s3.base_url, **LIMITS},
                        )
                        failed = False
                    except WdstreamError:
                        failed = True
                if failed:  # the rerun, honest endpoint: resumes from the journal
                    wdstream.pack([str(src)], "s3://bkt/p", **kw, force_unlock=True)
                got = {k: v for k, v in moto.tree("p/").items() if not k.startswith(".")}
                wrong = live()
                if got != _tree(str(ref)):
                    wrong = f"pack{' rerun' if failed else ''} differs"
                if wrong:
                    return f"silent wrong: {name}: {wrong}"
                return "clear error" if failed else "handled"

        return attempt

    hostile = _hostile()
    reads = list(_read_lies(hostile, None))
    writes = list(_write_lies(hostile))
    n = max(1, int(3 * scale))
    for i, name in enumerate(reads):
        for k in range(n):
            seed = 4500 + 10 * i + k
            p = (0.3, 1.0, 0.1)[k % 3]
            slow = "trickled" in name
            yield read(name, seed, 0.1 if slow else p, workers=2 * (k % 2),
                       cached=k % 3 == 1, glob="ListObjects" in name or k == 2)  # fmt: skip
    for i, name in enumerate(writes):
        for k in range(n):
            p = (0.5, 1.0, 0.2)[k % 3]
            if name.startswith(("UploadPart", "CreateMultipart", "CompleteMultipart")):
                yield write(name, 4600 + 10 * i + k, p)
            else:
                yield pack(name, 4600 + 10 * i + k, p)


class _cache:  # noqa: N801 - used as a function in a with statement
    """``{"cache_dir": a fresh folder}`` when ``cached``, else ``{}``."""

    def __init__(self, work: Path, cached: bool) -> None:
        self.work, self.cached = work, cached

    def __enter__(self) -> dict[str, Any]:
        if not self.cached:
            return {}
        import tempfile

        self.tmp = tempfile.TemporaryDirectory(dir=self.work)
        return {"cache_dir": self.tmp.name}

    def __exit__(self, *exc: object) -> None:
        if self.cached:
            self.tmp.cleanup()
