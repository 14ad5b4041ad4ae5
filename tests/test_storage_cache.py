"""The node-local block cache over a real S3 server (moto): ranged reads equal the object,
a second pass is served from local disk, damaged blocks are dropped and fetched again,
eviction keeps the folder bounded and least-recently-used, several real processes share one
folder, and ``Loader(cache_dir=...)`` reads epoch 2 with the shards gone from S3."""

from __future__ import annotations

import hashlib
import multiprocessing
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

import wdstream
from wdstream import Loader
from wdstream.storage import open_store
from wdstream.storage.cache import CachedStore, parse_cache_limit

pytest_plugins = ["tests.fixtures_remote"]
pytestmark = pytest.mark.timeout(180)

BLOCK = 64 << 10
SIZE = 20 * BLOCK + 12_345  # 21 blocks, the last one short


@pytest.fixture
def s3_object(s3_bucket: str) -> tuple[str, bytes]:
    """``(root URL, bytes)`` of one random object ``obj.bin`` on the moto server."""
    data = random.Random(5).randbytes(SIZE)
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="root/obj.bin", Body=data)
    return f"s3://{s3_bucket}/root", data


def _blocks(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.blk"))


def test_ranges_equal_the_object_then_come_from_disk(
    s3_object: tuple[str, bytes], tmp_path: Path
) -> None:
    url, data = s3_object
    store = CachedStore(open_store(url), str(tmp_path / "c"), "1GB", block=BLOCK)
    rng = random.Random(1)
    ranges = [(0, 10), (BLOCK - 5, BLOCK + 5), (3 * BLOCK, 7 * BLOCK), (SIZE - 100, SIZE + 500)]
    ranges += [tuple(sorted(rng.sample(range(SIZE + 1000), 2))) for _ in range(40)]
    for a, b in ranges:
        assert store.read_range("obj.bin", a, b) == data[a:b], (a, b)
    assert store.read_range("obj.bin", SIZE + 10, SIZE + 20) == b""
    assert store.misses == 21 and len(_blocks(tmp_path / "c")) == 21
    again = CachedStore(open_store(url), str(tmp_path / "c"), "1GB", block=BLOCK)
    assert again.read_range("obj.bin", 0, SIZE) == data
    assert (again.hits, again.misses) == (21, 0)


def test_holds_range_tells_cached_blocks_from_missing_ones(
    s3_object: tuple[str, bytes], tmp_path: Path
) -> None:
    url, _ = s3_object
    inner = open_store(url)
    assert not inner.holds_range("obj.bin", 0, 10)  # a remote store holds nothing
    store = CachedStore(inner, str(tmp_path / "c"), "1GB", block=BLOCK)
    assert not store.holds_range("obj.bin", BLOCK, 3 * BLOCK)
    store.read_range("obj.bin", BLOCK + 7, 3 * BLOCK - 7)  # blocks 1 and 2, fetched
    assert not store.holds_range("obj.bin", BLOCK, 3 * BLOCK)  # on disk, mapped at next read
    store.read_range("obj.bin", BLOCK + 7, 3 * BLOCK - 7)
    assert store.holds_range("obj.bin", BLOCK, 3 * BLOCK) and store.misses == 2
    assert store.holds_range("obj.bin", BLOCK + 100, BLOCK + 100)  # empty range in a block
    assert not store.holds_range("obj.bin", BLOCK, 3 * BLOCK + 1)  # block 3 is not cached
    assert not store.holds_range("obj.bin", BLOCK - 1, 2 * BLOCK)
    other = CachedStore(open_store(url), str(tmp_path / "c"), "1GB", block=BLOCK)
    assert not other.holds_range("obj.bin", BLOCK, 3 * BLOCK)  # on disk, not mapped here yet
    other.read_range("obj.bin", BLOCK, 3 * BLOCK)  # maps and checks them: no GET
    assert other.holds_range("obj.bin", BLOCK, 3 * BLOCK) and other.misses == 0
    for path in _blocks(tmp_path / "c"):
        path.unlink()
    assert other.holds_range("obj.bin", BLOCK, 3 * BLOCK)  # mapped: still at hand


def test_second_pass_from_the_cache_reads_serially_and_keeps_token_spans(
    s3_bucket: str,
    tmp_path: Path,
    corpus_docs: list[str],
    write_jsonl: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reads of blocks the node cache has mapped skip the fetch threads, and a remote
    shard's token spans are searched once: later passes over the same pieces equal the
    local dataset's tokens with no search, and once the blocks are mapped, no fetch pool."""
    import wdstream.read.sources.layouts as source_module
    from wdstream.read.sources.packed import ShardSource

    url = f"s3://{s3_bucket}/spans"
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:60])
    local = tmp_path / "local"
    for out in (url, str(local)):
        wdstream.pack(str(src), out, seq_len=64, shard_size="48KB", workers=0, progress=False)
    reference = ShardSource(str(local))
    assert len(reference) >= 3
    pieces = [(s, a, min(a + 5, int(reference.samples[s])))
              for s in range(len(reference)) for a in range(0, int(reference.samples[s]), 5)]  # fmt: skip
    want = [r.tokens.views() for r in reference.read(pieces)]
    searches: list[int] = []
    real_search = source_module.find_token_spans

    def counted(*args: Any) -> Any:
        searches.append(1)
        return real_search(*args)

    monkeypatch.setattr(source_module, "find_token_spans", counted)
    remote = ShardSource(url, cache_dir=str(tmp_path / "cache"))
    windows = [pieces[i : i + 4] for i in range(0, len(pieces), 4)]

    def read_all() -> list[list[Any]]:
        return [r.tokens.views() for w in windows for r in remote.read(w)]

    def same(got: list[list[Any]]) -> bool:
        return all(
            len(g) == len(w) and all((x == y).all() for x, y in zip(g, w, strict=True))
            for g, w in zip(got, want, strict=True)
        )

    assert same(read_all())  # fetches every block: through the fetch threads
    assert len(searches) == len(pieces) and remote._fetches._pool is not None
    searches.clear()
    assert same(read_all())  # maps the cached blocks (threads again), searches nothing
    assert searches == []
    remote.end_fetches()
    assert same(read_all())  # every block mapped: one read after the other
    assert searches == [] and remote._fetches._pool is None


def test_kept_token_spans_never_skip_the_checksums(
    s3_bucket: str, tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]
) -> None:
    """A flip in a remote shard after its spans were kept (a later read, new bytes) is
    still refused by the sample's CRC32C, naming the shard and sample."""
    from wdstream.errors import CorruptShardError
    from wdstream.read.sources.packed import ShardSource

    url = f"s3://{s3_bucket}/flip"
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:30])
    wdstream.pack(str(src), url, seq_len=64, shard_size="48KB", workers=0, progress=False)
    remote = ShardSource(url)
    n = int(remote.samples[0])
    first = remote.read([(0, 0, n), (1, 0, 1)])[0].tokens.views()
    s3 = boto3.client("s3")
    key = "flip/" + remote.urls[0][1]
    data = bytearray(s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
    sidecar, _ = remote.sidecars.get(0)
    at = int(sidecar.offsets[3]) + int(sidecar.sizes[3]) // 2  # inside sample 3's tokens
    data[at] ^= 0x10
    s3.put_object(Bucket=s3_bucket, Key=key, Body=bytes(data))
    with pytest.raises(CorruptShardError, match=r"sample 3 .*checksum"):
        remote.read([(0, 0, n), (1, 0, 1)])
    assert len(first) == n


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_damaged_block_is_dropped_and_fetched_again(
    s3_object: tuple[str, bytes], tmp_path: Path, damage: str
) -> None:
    url, data = s3_object
    cache = tmp_path / "c"
    CachedStore(open_store(url), str(cache), "1GB", block=BLOCK).read_range("obj.bin", 0, SIZE)
    victim = _blocks(cache)[3]
    raw = bytearray(victim.read_bytes())
    if damage == "flip":
        raw[100] ^= 0x10
    victim.write_bytes(bytes(raw[: len(raw) // 2]) if damage == "truncate" else
                       b"" if damage == "empty" else bytes(raw))  # fmt: skip
    store = CachedStore(open_store(url), str(cache), "1GB", block=BLOCK)
    with pytest.warns(UserWarning, match=r"failed its checksum.*fetched again"):
        assert store.read_range("obj.bin", 0, SIZE) == data
    assert (store.dropped, store.misses, store.hits) == (1, 1, 20)
    fresh = CachedStore(open_store(url), str(cache), "1GB", block=BLOCK)
    assert fresh.read_range("obj.bin", 3 * BLOCK, 4 * BLOCK) == data[3 * BLOCK : 4 * BLOCK]
    assert fresh.hits == 1 and fresh.dropped == 0  # the block was written back whole


def test_eviction_is_bounded_and_least_recently_used(
    s3_object: tuple[str, bytes], tmp_path: Path
) -> None:
    url, data = s3_object
    cache = tmp_path / "c"
    limit = 8 * (BLOCK + 12)  # eight blocks with their trailers
    store = CachedStore(open_store(url), str(cache), limit, block=BLOCK)
    for k in range(8):
        store.read_range("obj.bin", k * BLOCK, k * BLOCK + 1)
        time.sleep(0.01)  # distinct mtimes: the LRU clock
    store.read_range("obj.bin", 0, 2 * BLOCK)  # blocks 0 and 1 are now the most recent
    time.sleep(0.01)
    for k in range(8, 12):
        store.read_range("obj.bin", k * BLOCK, k * BLOCK + 1)
        time.sleep(0.01)
        assert sum(p.stat().st_size for p in _blocks(cache)) <= limit
    kept = {int(p.name.split(".")[-2]) for p in _blocks(cache)}
    assert {0, 1, 11} <= kept and not {2, 3, 4} & kept
    assert store.read_range("obj.bin", 0, SIZE) == data  # evicted blocks come back


def _reader(url: str, cache: str, limit: int, seed: int, out: Any) -> None:
    """One process: read the object in random ranges through the shared cache."""
    store = CachedStore(open_store(url), cache, limit, block=BLOCK)
    rng = random.Random(seed)
    buf = bytearray(SIZE)
    cuts = sorted({0, SIZE, *rng.sample(range(1, SIZE), 30)})
    spans = list(zip(cuts, cuts[1:], strict=False))
    rng.shuffle(spans)
    for _ in range(2):
        for a, b in spans:
            buf[a:b] = store.read_range("obj.bin", a, b)
    out.put((seed, hashlib.sha256(buf).hexdigest(), store.hits, store.misses, store.dropped))


@pytest.mark.parametrize("limit", [1 << 30, 6 * BLOCK])  # roomy; evicting under the readers
def test_processes_share_one_cache(
    s3_object: tuple[str, bytes], tmp_path: Path, limit: int
) -> None:
    url, data = s3_object
    cache = tmp_path / "c"
    # fork: what is proved is processes sharing one folder, not how they were started (a
    # spawned child imported torch and wdstream again, ~2 s each of eight)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(url, str(cache), limit, s, out)) for s in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=150) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    want = hashlib.sha256(data).hexdigest()
    assert all(r[1] == want for r in results), "a process read other bytes"
    assert all(r[4] == 0 for r in results), "a process saw a partial or damaged block"
    assert sum(r[2] for r in results) > 0  # processes used each other's blocks
    assert not list(cache.rglob("*.tmp"))
    verify = CachedStore(open_store(url), str(cache), "1GB", block=BLOCK)
    assert verify.read_range("obj.bin", 0, SIZE) == data and verify.dropped == 0
    if limit < SIZE:
        assert sum(p.stat().st_size for p in _blocks(cache)) <= limit + verify._sweep_every


def test_loader_epoch_two_from_the_cache_with_shards_gone(
    s3_bucket: str, tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]
) -> None:
    url = f"s3://{s3_bucket}/ds"
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:80])
    wdstream.pack(str(src), url, seq_len=64, shard_size="48KB", workers=0, progress=False)
    kw: dict[str, Any] = dict(seq_len=64, batch_size=4, epochs=1, shuffle_window=16, seed=3)

    def batches(**extra: Any) -> list[list[list[int]]]:
        return [b["input_ids"].tolist() for b in Loader(url, **kw, **extra)]

    plain = batches(num_workers=0)
    cache = str(tmp_path / "cache")
    assert batches(num_workers=2, cache_dir=cache, cache_limit="1GB") == plain
    assert _blocks(Path(cache)), "nothing was cached"
    s3 = boto3.client("s3")
    tars = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket)["Contents"]
            if o["Key"].endswith(".tar")]  # fmt: skip
    assert len(tars) >= 3
    for key in tars:
        s3.delete_object(Bucket=s3_bucket, Key=key)
    assert batches(num_workers=0, cache_dir=cache) == plain  # every byte from local disk
    with pytest.raises(FileNotFoundError, match=r"no such object: s3:.*\.tar"):
        batches(num_workers=0)


def test_wildcard_shard_urls_read_through_the_cache(
    s3_bucket: str, tmp_path: Path, corpus_docs: list[str], write_jsonl: Callable[..., Path]
) -> None:
    url = f"s3://{s3_bucket}/wild"
    src = write_jsonl(tmp_path / "in.jsonl", corpus_docs[:40])
    wdstream.pack(str(src), url, seq_len=64, shard_size="48KB", workers=0, progress=False)
    kw: dict[str, Any] = dict(seq_len=64, batch_size=4, epochs=1, num_workers=0, seed=3)
    plain = [b["input_ids"].tolist() for b in Loader(f"{url}/*.tar", **kw)]
    cache = tmp_path / "cache"
    cached = [b["input_ids"].tolist() for b in Loader(f"{url}/*.tar", **kw, cache_dir=str(cache))]
    assert cached == plain and plain
    assert _blocks(cache), "nothing was cached"


def test_options_are_checked(tmp_path: Path) -> None:
    assert parse_cache_limit("50GB") == 50 * 10**9 and parse_cache_limit("2GiB") == 2 << 30
    assert parse_cache_limit(4096) == 4096
    for bad in ("lots", "0", -1, "5XB"):
        with pytest.raises(ValueError, match="cache_limit"):
            parse_cache_limit(bad)
    from wdstream.read.sources.stores import StoreCache

    with pytest.raises(ValueError, match="cache_limit needs cache_dir"):
        StoreCache(cache_limit="1GB")
    local = StoreCache(cache_dir=str(tmp_path / "c")).get(str(tmp_path))
    assert not isinstance(local, CachedStore)  # local roots are read directly
