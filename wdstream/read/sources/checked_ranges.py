"""A packed source's ranged reads of sample spans, checked against their checksums, and
the errors that name what failed.

Samples ``[a, b)`` of a shard are one byte range (its sidecar's offsets); a
:class:`CheckedRanges` reads it (or takes it from the torch workers sharing a window's
fetches, :mod:`~wdstream.read.sources.exchange`), verifies the samples asked for, fetches
bytes from a node cache that failed once more from the source, and raises a
:class:`~wdstream.errors.CorruptShardError` naming the shard, the sample and its offset.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import NoReturn

import numpy as np

from wdstream.errors import CorruptShardError
from wdstream.format.checksum import Corruption, find_corruption, spot_check
from wdstream.format.sidecar import ShardSidecar
from wdstream.read.sources.damage import corruption_message
from wdstream.read.sources.exchange import SharedPieces
from wdstream.read.sources.reads import CopyChecks
from wdstream.read.sources.stores import StoreCache

__all__ = ["CheckedRanges"]


class CheckedRanges:
    """Checked ranged reads of a packed source's shards.

    Args:
        stores: the source's stores.
        urls: ``(root, name)`` of each shard.
        checksums: verify samples' CRC32C (else only a spot check, :func:`spot_check`).
        where: a shard's URL, for messages.
    """

    def __init__(
        self,
        stores: StoreCache,
        urls: Sequence[tuple[str, str]],
        checksums: bool,
        where: Callable[[int], str],
    ) -> None:
        self._stores = stores
        self._urls = urls
        self._checksums = checksums
        self._where = where

    def report_corrupt(self, checks: CopyChecks, start: int) -> NoReturn:
        """Raise for the sample of ``checks``' read that begins at byte ``start`` of its
        buffer, which failed its checksum.

        Raises:
            CorruptShardError: always, naming the shard, the sample and its byte offset.
        """
        i = int(np.searchsorted(checks.offsets, start))
        bad = Corruption(checks.first + i, checks.begin + start)
        root, name = self._urls[checks.shard]
        at = checks.begin + start, checks.begin + start + int(checks.sizes[i])
        dropped = self._stores.get(root).forget_range(name, *at)  # a rerun fetches them again
        raise CorruptShardError(corruption_message(self._where(checks.shard), bad, dropped))

    def read(
        self, shard: int, a: int, b: int, sidecar: ShardSidecar, check: np.ndarray | None,
        verify: bool = True, shared: SharedPieces | None = None, j: int = 0,
        look: Callable[[memoryview, int], object] | None = None,
    ) -> tuple[memoryview, int]:  # fmt: skip
        """The bytes of samples ``[a, b)`` (one ranged read, or piece ``j`` of ``shared``),
        verified against their checksums (those ``check`` marks; none without ``verify``);
        returns ``(buffer, its shard offset)``.

        ``look(buffer, offset)`` runs on the buffer first read, right before its checksums are
        summed (only where they are): a pass over the same bytes that leaves them in the cache
        for the sums. It sees unverified bytes, so it must not raise for them, and what it
        finds holds only for the buffer returned if that is the one it saw (bytes a node cache
        failed are fetched again, unseen)."""
        verify = verify and self._checksums and sidecar.crc32c is not None
        verify = verify and (check is None or bool(check.any()))
        by_run = verify and sidecar.crc32c_run is not None
        # A run check starts at the end of the previous sample's data: a header earlier.
        begin, end = sidecar.run_check(a, b)[:2] if by_run else sidecar.byte_range(a, b)
        root, name = self._urls[shard]
        store = self._stores.get(root)
        if shared is None:
            buf = store.read_range_view(name, begin, end)
        else:
            # Workers differ in which samples they verify: all share the widest range.
            wide = begin if by_run or sidecar.crc32c_run is None else sidecar.run_check(a, b)[0]
            got = shared.fetch(j, lambda: store.read_range_view(name, wide, end), end - wide)
            buf = got[begin - wide :]
        if look is not None and verify:
            look(buf, begin)
        bad = self._bad_bytes(shard, buf, begin, sidecar, a, b, check, verify)
        dropped = store.forget_range(name, begin, end) if bad is not None else []
        if dropped:  # a node cache's bytes failed: fetched once more, from the source
            warnings.warn(f"{self._where(shard)}: cached bytes failed their checksums; the "
                          f"node cache's blocks {', '.join(dropped)} were dropped and fetched again",
                          stacklevel=3)  # fmt: skip
            buf = store.read_source_range(name, begin, end)
            bad = self._bad_bytes(shard, buf, begin, sidecar, a, b, check, verify)
        if bad is not None:
            raise CorruptShardError(corruption_message(self._where(shard), bad, dropped))
        return buf, begin

    def _bad_bytes(
        self, shard: int, buf: memoryview, begin: int, sidecar: ShardSidecar, a: int, b: int,
        check: np.ndarray | None, verify: bool,
    ) -> Corruption | None:  # fmt: skip
        """Where the bytes of samples ``[a, b)`` fail their checksums (all, when asked to
        verify; else, with ``checksums=False``, the first and last sample: a check that stays
        on, see :func:`spot_check`), or None."""
        if len(buf) != sidecar.byte_range(a, b)[1] - begin:  # the range asked, exactly
            raise CorruptShardError(f"{self._where(shard)}: short read at byte {begin + len(buf)}")
        if verify:
            return find_corruption(buf, begin, sidecar, a, b, check)
        return None if self._checksums else spot_check(buf, begin, sidecar, a, b)

    def check_counts(self, shard: int, want: np.ndarray, got: np.ndarray) -> None:
        """Raise unless the token counts ``got`` of a read are its sidecar's ``want``.

        Raises:
            CorruptShardError: naming the shard.
        """
        if not np.array_equal(want, got):
            raise CorruptShardError(f"{self._where(shard)}: token counts disagree with the sidecar")
