"""Where a reader's samples come from: shard names, per-shard counts, ranged sample reads.

A :class:`ShardSource` is the pluggable bottom of the reader: the plan only needs
``samples`` (per shard), ``tokens_before(shard, k)`` and ``read(shard, a, b)``. This one
serves indexed token shards; a raw-text source would implement the same three.

``source`` may be a dataset root holding ``index.json`` (counts come from the index; sidecars
are loaded lazily, only for the shards actually read), a brace pattern of shard URLs
(``data/x-{000000..000009}.tar``), or a list of them (counts come from each shard's
``.idx`` sidecar; a shard without one is scanned once). Every byte goes through
:mod:`wdstream.storage`, so local paths, ``s3://`` and ``http(s)://`` take the same path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from functools import cached_property, partial
from typing import Any

import numpy as np

from wdstream.format.index import DatasetIndex, ShardEntry, ShardTable
from wdstream.format.sample import LocatedTokens, Sample
from wdstream.format.sidecar import ShardSidecar, sidecar_name
from wdstream.read.sources.checked_ranges import CheckedRanges
from wdstream.read.sources.exchange import SharedPieces
from wdstream.read.sources.fetches import FetchPool, Stop, results
from wdstream.read.sources.identity import DatasetIdentity, packed_identity
from wdstream.read.sources.layouts import KeptLayouts
from wdstream.read.sources.names import ShardWhere, TableNames, TableUrls
from wdstream.read.sources.reads import CopyChecks, PieceRead
from wdstream.read.sources.shards import (
    decode_span,
    drop_short_last_sample,
    infer_mode,
    read_index,
    sibling_index,
)
from wdstream.read.sources.sidecars import ShardSidecars
from wdstream.read.sources.stores import StoreCache, expand_urls
from wdstream.read.sources.vouch import IdLimit, check_index_ids, id_limit
from wdstream.storage import Store
from wdstream.storage.urls import is_dataset_root, split_url

# CopyChecks, PieceRead: reads.py; expand_urls: stores.py
__all__ = ["CopyChecks", "PieceRead", "ShardSource", "expand_urls"]

_SIDECAR_CACHE = 64  # shards whose sidecars stay in memory per process (~16 B/sample each)


class ShardSource:
    """Indexed token shards: counts for planning and one ranged read per sample span.

    In concat mode the dataset's last sample is usually shorter than the others; it is left
    out of the counts (and so never read), because once shuffled into the middle of a stream
    every later row would straddle it and the next, unrelated sample: one row is one packed
    sample, always.

    Args:
        source: dataset root with ``index.json``, brace pattern of shard URLs, or a list.
        checksums: verify every sample's CRC32C as it is read (format v2). Off only for
            storage that checksums its own reads; v1 datasets have no checksums to verify.
        store_options: passed to :func:`wdstream.storage.open_store`.

    Raises:
        IncompleteDatasetError: if a root has no ``index.json`` (says if a pack was cut short).
        IndexValidationError: if ``index.json`` is not a valid, consistent index.
        FileNotFoundError: if a shard is missing.
        CorruptShardError: if a sidecar or sample does not decode or fails its checksum
            (names shard, sample and offset).
    """

    def __init__(
        self, source: str | Sequence[str], checksums: bool = True, **store_options: Any
    ) -> None:
        self.checksums = checksums
        self._stores = StoreCache(**store_options)
        self._fetches = FetchPool()  # remote reads' threads (read/sources/fetches.py)
        # Where each sample's tokens lie in its shard (None: not the writer's layout; a
        # remote shard's start of -1: not searched yet), see _token_spans.
        self._layouts = KeptLayouts(_SIDECAR_CACHE)
        self.index: DatasetIndex | None = None
        self._entries: Sequence[ShardEntry] | None = None  # each shard's entry in self.index
        # Opened by URL: per shard (samples, tokens, sha256 of its sidecar), for the identity.
        self._records: list[tuple[int, int, str]] | None = None
        if isinstance(source, str) and is_dataset_root(source):
            store = self._store(source)
            self.index = read_index(store)
            # Columns, not entries: an entry is made where a shard is read (ShardTable).
            self._entries = self.index.shards
            table = self._entries.table if isinstance(self._entries, ShardTable) else None
            if table is not None:  # names made as asked for (read/sources/names.py)
                self.urls: Sequence[tuple[str, str]] = TableUrls(source, table)
                self.sidecar_names: Sequence[str] = TableNames(table, "sidecar")
            else:
                self.urls = [(source, name) for name in self.index.column("name")]
                self.sidecar_names = list(self.index.column("sidecar"))
            self.samples = np.array(self.index.column("samples"), dtype=np.int64)
            self.tokens = np.array(self.index.column("tokens"), dtype=np.int64)
            self.mode = self.index.mode
            self.sample_tokens = self.index.sample_tokens
            self.sidecars = self._sidecars()
            roots = {source}  # every shard under the root: not a Python call per shard
        else:
            self.urls = [split_url(u) for u in expand_urls(source, **store_options)]
            if not self.urls:
                raise ValueError(f"no shard URLs in {source!r}")
            self.sidecar_names = [sidecar_name(n) for _, n in self.urls]
            # The meaning of shards opened by URL comes from the index.json beside them
            # (their sidecars are then checked against its entries as they are read).
            found = sibling_index(self.urls, self._store)
            if found is not None:
                self.index, self._entries = found
            self.sidecars = self._sidecars()
            loaded = [self.sidecars.load(i) for i in range(len(self.urls))]
            counts = [entry[0].tokens for entry, _ in loaded]
            self._records = [(len(c), int(c.sum(dtype=np.int64)), sha)
                             for c, (_, sha) in zip(counts, loaded, strict=True)]  # fmt: skip
            self.samples = np.array([r[0] for r in self._records], dtype=np.int64)
            self.tokens = np.array([r[1] for r in self._records], dtype=np.int64)
            ix = self.index  # only without an index is the mode inferred
            self.mode, self.sample_tokens = (
                (ix.mode, ix.sample_tokens) if ix else infer_mode(counts)
            )
            roots = {r for r, _ in self.urls}
        self.ranges = CheckedRanges(self._stores, self.urls, checksums, self._where)
        drop_short_last_sample(self.samples, self.tokens, self.mode, self.sample_tokens)
        check_index_ids(self.index, self._stores.url(self.urls[0][0], "index.json"))
        self._ids = id_limit(self.index)  # every read's ids are checked against it (vouch.py)
        # Remote reads are latency-bound: the reader issues a window's ranged reads in parallel.
        self.remote = any("://" in root and not root.startswith("file://") for root in roots)
        # Torch workers split a window's fetches (read/sources/exchange.py); through a node
        # cache each reads its local blocks instead.
        self.shares_reads = self.remote and store_options.get("cache_dir") is None
        st = self.sample_tokens or 0
        # A shard is "regular" when every sample but possibly its last has sample_tokens
        # tokens; then token prefixes are arithmetic and no sidecar is needed to plan.
        self._regular = (
            (self.samples > 0)
            & ((self.samples - 1) * st < self.tokens)
            & (self.tokens <= self.samples * st)
            if self.mode == "concat" and st
            else np.zeros(len(self.samples), dtype=bool)
        )

    @cached_property
    def identity(self) -> DatasetIdentity:
        """What a saved state names this dataset by: its content, made on first use
        (:mod:`~wdstream.read.sources.identity`)."""
        return packed_identity(
            self.index, self._entries, self.urls, self._records, self.mode, self.sample_tokens
        )

    @property
    def id_limit(self) -> IdLimit | None:
        """The ids this dataset's samples may hold (None: opened without an index)."""
        return self._ids

    def __len__(self) -> int:
        return len(self.urls)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("identity", None)  # made again where asked (states are the loader's)
        return state

    def close(self) -> None:
        """Release the stores' cached file handles / connections."""
        self._stores.close()

    def end_fetches(self) -> None:
        """Leave the threads of concurrent remote reads (made again when next needed): the
        fetches not started are not made, and the GETs in flight are not waited for (their
        results are dropped; :func:`~wdstream.read.sources.fetches.join_dropped` waits for
        them, before a fork)."""
        self._fetches.drop()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - interpreter shutdown; nothing left to release
            pass

    def _sidecars(self) -> ShardSidecars:
        """The shards' sidecars, read as shards are (once ``urls``, the index are known)."""
        return ShardSidecars(self._stores, self.urls, self.sidecar_names, self.index,
                             self._entries, self.checksums, self._where, _SIDECAR_CACHE)  # fmt: skip

    def _store(self, root: str) -> Store:
        return self._stores.get(root)

    @property
    def _where(self) -> ShardWhere:
        """:meth:`where` without this source (see :class:`ShardWhere`)."""
        return ShardWhere(self._stores.url, self.urls)

    def where(self, shard: int) -> str:
        """URL of a shard, for messages."""
        return self._stores.url(*self.urls[shard])

    def sidecar(self, shard: int) -> ShardSidecar:
        """The sidecar of ``shard`` (read once, checked, kept in a per-process LRU).

        Raises:
            CorruptShardError, OSError: it cannot be read, or fails its checks.
        """
        return self.sidecars.get(shard)[0]

    def tokens_before(self, shard: int, k: int) -> int:
        """Tokens in samples ``[0, k)`` of ``shard`` (no read for regular concat shards)."""
        if k <= 0:
            return 0
        if k >= self.samples[shard]:
            return int(self.tokens[shard])
        if self._regular[shard]:
            return k * int(self.sample_tokens or 0)
        return int(self.sidecars.get(shard)[1][k])

    def token_counts(self, shard: int, a: int, b: int) -> np.ndarray:
        """Token count of each sample ``[a, b)`` of ``shard`` (no read for regular shards)."""
        if self._regular[shard]:
            return np.full(b - a, int(self.sample_tokens or 0), dtype=np.int64)
        return self.sidecars.get(shard)[0].tokens[a:b].astype(np.int64)

    def read(
        self,
        pieces: list[tuple[int, int, int]],
        *,
        docs: bool = False,
        checks: list[np.ndarray] | None = None,
        verify: bool = True,
        shared: SharedPieces | None = None,
        stop: Stop | None = None,
    ) -> list[PieceRead]:
        """The samples of every ``(shard, a, b)`` piece (samples ``[a, b)`` of ``shard``),
        one ranged read each, in order.

        Locally the reads go one after the other; from a remote store concurrently: a window
        touches one span per lane (and shard), so over S3/HTTP its reads would otherwise pay
        one round trip each, and issued together they cost about one.

        Args:
            docs: also decode each sample's document pieces (each sample unpacked). Without
                them the token arrays are found in place where the samples have the
                writer's layout (no msgpack unpacking), else decoded.
            checks: per piece, (bool, one per sample) the samples this reader uses, when
                other processes use (and verify) the rest: only these are verified, with
                running checksums one call per run of consecutive ones. Default: all.
            verify: False leaves the checksums to the caller: each read carries what
                verifies each sample (``PieceRead.checks``, None when checks are off or the
                shard has none). For a copier that uses scattered samples of a read (a torch
                worker cutting its own chunks from a window): checking each sample right
                after copying it sums bytes the copy just brought into the cache. The caller
                must verify every sample it copies before handing the copy on.
            shared: how torch workers split these pieces' fetches
                (:mod:`~wdstream.read.sources.exchange`); None: this process fetches all.
            stop: once set, the pieces not started are not read (the read raises
                ``CancelledError``), and the read stops waiting for those in flight (it
                raises ``CancelledError`` at once): the reader dropping the window (its
                iteration ended) waits neither for the GETs queued nor for those in
                flight (:mod:`~wdstream.read.sources.fetches`).
        """

        failed = threading.Event()

        def one(j: int) -> PieceRead:
            # One fate per window: at its first failure the reads not started are not made,
            # so it fails by its first read's deadline, not one more per round of threads.
            if failed.is_set() or (stop is not None and stop.is_set()):
                if shared is not None:
                    shared.abandon(j)
                raise CancelledError
            try:
                return self._read_piece(*pieces[j], docs, each[j], verify, shared, j)
            except BaseException:
                failed.set()
                if shared is not None:  # its takers fetch it themselves (e.g. no sidecar)
                    shared.abandon(j)
                raise

        each = checks if checks is not None else [None] * len(pieces)
        if shared is not None:
            shared.begin()
        # A single remote piece goes to a fetch thread too where a stop may end the wait: in
        # line, a stalled GET held its reader (a torch worker) for the read timeout.
        alone = len(pieces) < 2 and stop is None
        if not self.remote or alone or not pieces or self._held(pieces):
            return [one(j) for j in range(len(pieces))]
        pool = self._fetches.get()
        order = shared.taken_first() if shared is not None else range(len(pieces))
        jobs = {j: pool.submit(one, j) for j in order}
        if shared is not None:  # a fetch cancelled unstarted (the pool dropped) releases its
            for j, job in jobs.items():  # takers as one skipped does (else they wait 60 s)
                job.add_done_callback(partial(shared.abandon_cancelled, j))
        try:
            # The first failure in order; CancelledError at once when stopped.
            return results([jobs[j] for j in range(len(pieces))], stop)
        except CancelledError:
            if stop is not None and stop.is_set():
                raise  # the window is dropped: its GETs in flight are not waited for
            # A read not made because another failed (which may come later in this order,
            # e.g. workers' shared pieces taken first): raise that failure, not the cancel.
            for j in range(len(pieces)):
                err = jobs[j].exception()
                if err is not None and not isinstance(err, CancelledError):
                    raise err from None
            raise
        finally:
            # The exception raised holds this frame, whose futures hold it: a cycle that
            # kept the source, its sockets and its windows' bytes until the collector ran.
            jobs, job, err = {}, None, None  # type: ignore[assignment]

    def _held(self, pieces: list[tuple[int, int, int]]) -> bool:
        """Whether the stores hold every piece's bytes at hand (a node cache's mapped
        blocks): those reads pay no round trip to hide, and reading them on the fetch threads
        measured ~15 % slower than one after the other (the threads contend for the GIL).
        Only sidecars already in memory are consulted; a shard not read yet counts as remote."""
        for shard, a, b in pieces:
            if b <= a:
                continue
            hit = self.sidecars.held(shard)
            if hit is None:
                return False
            root, name = self.urls[shard]
            if not self._store(root).holds_range(name, *hit[0].byte_range(a, b)):
                return False
        return True

    def _read_piece(
        self, shard: int, a: int, b: int, docs: bool, check: np.ndarray | None, verify: bool,
        shared: SharedPieces | None = None, j: int = 0,
    ) -> PieceRead:  # fmt: skip
        """One piece of :meth:`read` (piece ``j`` of ``shared``)."""
        sidecar = self.sidecars.get(shard)[0]
        seen: list[tuple[memoryview, LocatedTokens | None, bool]] = []
        look = None
        if self._ids is not None and not docs and not self.remote:
            ids = self._ids

            def look(buf: memoryview, begin: int) -> None:
                # The ids pass runs before the sums, which then find the bytes in the cache
                # (docs/READER.md, "Checks at 0 workers"); only what it admits skips check().
                tokens = self._in_place(shard, sidecar, a, b, buf, begin)
                seen.append((buf, tokens, tokens is not None and ids.admits_samples(tokens)))

        buf, begin = self.ranges.read(shard, a, b, sidecar, check, verify, shared, j, look)
        if docs:
            # Verified by ranges.read as asked: not a second CRC pass per sample here.
            samples = list(decode_span(buf, begin, sidecar, a, b, self.where(shard), verify=False))
            tokens = LocatedTokens.of_arrays([s.tokens for s in samples])
            self.ranges.check_counts(shard, sidecar.tokens[a:b], tokens.count)
            if self._ids is not None:
                where = partial(self.where, shard)
                self._ids.check(tokens, where, a, lambda k: self.read_sample(shard, k))
            return PieceRead(tokens, [s.doc_lens for s in samples], None)
        if seen and seen[0][0] is buf:  # what the look found holds: these bytes are verified
            _, in_place, admitted = seen[0]
        else:
            in_place, admitted = self._in_place(shard, sidecar, a, b, buf, begin), False
        if in_place is not None:
            tokens = in_place
        else:
            # A layout other than the writer's: unpack each sample (the bytes are verified
            # already, or are the caller's to verify).
            odd = decode_span(buf, begin, sidecar, a, b, self.where(shard), verify=False)
            tokens = LocatedTokens.of_arrays([s.tokens for s in odd])
        self.ranges.check_counts(shard, sidecar.tokens[a:b], tokens.count)
        crcs = sidecar.crc32c
        if verify or not self.checksums or crcs is None:
            if self._ids is not None and not admitted:  # unverified: a bad id's sample first
                where = partial(self.where, shard)  # made for a message only
                self._ids.check(tokens, where, a, lambda k: self.read_sample(shard, k))
            return PieceRead(tokens, [], None)
        # Its copier verifies what it copies, ids too (window_data.copy_rows): a torch worker
        # copies 1/W of a window, and checking the ids of all of it cost each worker a pass
        # over the whole window (its pages faulted in) before its first chunk.
        offsets = sidecar.offsets[a:b].astype(np.int64) - begin
        checks = CopyChecks(buf, begin, shard, a, offsets, sidecar.sizes[a:b], crcs[a:b])
        return PieceRead(tokens, [], checks)

    def _in_place(
        self, shard: int, sidecar: ShardSidecar, a: int, b: int, buf: memoryview, begin: int
    ) -> LocatedTokens | None:
        """The tokens of samples ``[a, b)`` found in place in ``buf`` (shard bytes from
        ``begin``), None where the shard is not in the writer's layout."""
        spans = (
            self._layouts.of_remote(shard, sidecar, a, b, buf, begin)
            if self.remote
            else self._layouts.of_local(shard, sidecar, a, b, begin, self._mapped(shard))
        )
        return None if spans is None else LocatedTokens.in_buffer(buf, spans)

    def read_sample(self, shard: int, k: int) -> Sample:
        """Sample ``k`` of ``shard`` alone, decoded, checked against its own CRC32C (not the
        running one: the bytes between samples are no sample's), as a torch worker checks
        what it copies; for reads that failed, sample by sample (``on_corrupt="mask"``).

        Raises:
            CorruptShardError, OSError: naming the shard, the sample and its byte offset.
        """
        sidecar = self.sidecar(shard)
        root, name = self.urls[shard]
        begin, end = sidecar.byte_range(k, k + 1)
        data = self._store(root).read_range_view(name, begin, end)
        where, verify = self.where(shard), self.checksums
        [sample] = decode_span(data, begin, sidecar, k, k + 1, where, verify=verify)
        if self._ids is not None:
            self._ids.check(LocatedTokens.of_arrays([sample.tokens]), where, k)
        return sample

    def _mapped(self, shard: int) -> Callable[[int], memoryview]:
        """The first ``end`` bytes of a local shard, mapped (its token layout is searched once:
        the shard's name is looked up only then)."""

        def first(end: int) -> memoryview:
            root, name = self.urls[shard]
            return self._store(root).read_range_view(name, 0, end)

        return first
