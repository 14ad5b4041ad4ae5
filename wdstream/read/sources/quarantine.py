"""Reads that stand in for what cannot be read (``on_corrupt="mask"``), so a run goes on.

:class:`QuarantinedReads` reads like :meth:`ShardSource.read
<wdstream.read.sources.packed.ShardSource.read>` and gives the same result while every
piece reads; when a read fails it reads each piece again on its own, and each piece that
still fails is handled by what failed:

* bytes that fail a check (CRC32C, a shard cut short, a sample that does not decode):
  each sample of the piece is read again alone (:meth:`ShardSource.read_sample`, checked
  against its own CRC32C as a torch worker checks what it copies), and only those that
  still fail stand in;
* the store cannot serve the piece (a missing shard, an object answering 500 past the
  store's retries) or the shard's sidecar cannot be read: every sample of the piece.

A stand-in has the sample's token count (from its sidecar, or for a regular concat shard
from ``index.json``'s counts when the sidecar cannot be read), so every later token, and
so every later row, is where a clean read puts it. A shard whose samples vary in length
(docs or best-fit mode) has no such count without its sidecar: that stays an error.
"""

from __future__ import annotations

import numpy as np

from wdstream.errors import CorruptShardError
from wdstream.format.sample import LocatedTokens, Sample
from wdstream.read.sources.exchange import SharedPieces
from wdstream.read.sources.fetches import Stop
from wdstream.read.sources.packed import ShardSource
from wdstream.read.sources.reads import BadSample, PieceRead, masked_tokens, neutral_id

__all__ = ["QuarantinedReads"]

_FAILURES = (CorruptShardError, OSError)  # what a read raises for data it cannot deliver


class QuarantinedReads:
    """A source's reads with unreadable samples replaced by masked tokens, named in each
    :class:`PieceRead`'s ``bad`` (see the module docstring).

    Args:
        source: the packed dataset.
    """

    def __init__(self, source: ShardSource) -> None:
        self.source = source
        self.neutral = neutral_id(source.index)

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
        """:meth:`ShardSource.read`, but a sample that cannot be read stands in masked (a
        piece read again after a failure is fetched by this process, not ``shared``).

        Raises:
            CorruptShardError: a shard without a readable sidecar whose samples vary in
                length (no count keeps the later rows in place).
        """
        try:
            return self.source.read(
                pieces, docs=docs, checks=checks, verify=verify, shared=shared, stop=stop
            )
        except _FAILURES:
            pass  # some piece failed: find which, one by one
        out = []
        for j, piece in enumerate(pieces):
            check = None if checks is None else [checks[j]]
            try:
                out += self.source.read([piece], docs=docs, checks=check, verify=verify)
            except _FAILURES as exc:
                out.append(self._stand_in(*piece, docs, exc))
        return out

    def _stand_in(self, shard: int, a: int, b: int, docs: bool, error: Exception) -> PieceRead:
        """Samples ``[a, b)`` of ``shard``, whose read failed with ``error``: those that
        can be read, and masked tokens for the rest."""
        src = self.source
        try:
            sidecar = src.sidecar(shard)
        except _FAILURES as exc:
            sidecar, error = None, exc
        try:
            counts = src.token_counts(shard, a, b) if sidecar is None else sidecar.tokens[a:b]
        except _FAILURES as exc:
            raise CorruptShardError(
                f"{error}; on_corrupt='mask' cannot stand in for its samples: without the "
                "sidecar their token counts are unknown, so every later row would move"
            ) from exc
        got: list[Sample | BadSample]
        if sidecar is not None and isinstance(error, CorruptShardError):
            got = [self._alone(shard, int(sidecar.offsets[k]), k) for k in range(a, b)]
        else:
            offsets = [None] * (b - a) if sidecar is None else sidecar.offsets[a:b].tolist()
            where = src.where(shard)
            got = [BadSample(where, a + i, None if o is None else int(o), str(error))
                   for i, o in enumerate(offsets)]  # fmt: skip
        masked = masked_tokens(counts, self.neutral).views()
        arrays = [masked[i] if isinstance(x, BadSample) else x.tokens for i, x in enumerate(got)]
        lens = [(len(t),) if isinstance(x, BadSample) else x.doc_lens
                for t, x in zip(arrays, got, strict=True)]  # fmt: skip
        bad = {i: x for i, x in enumerate(got) if isinstance(x, BadSample)}
        return PieceRead(LocatedTokens.of_arrays(arrays), lens if docs else [], None, bad)

    def _alone(self, shard: int, byte: int, k: int) -> Sample | BadSample:
        """Sample ``k`` of ``shard`` (its data at ``byte``) read on its own, or why not."""
        try:
            return self.source.read_sample(shard, k)
        except _FAILURES as exc:
            where = self.source.where(shard)
            reason = str(exc).removeprefix(f"{where}: sample {k} at byte {byte}: ")
            return BadSample(where, k, byte, reason)
