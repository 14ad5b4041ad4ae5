"""What a packed dataset vouches for, held to on every read: its sidecars and its token ids.

Two promises of ``index.json`` that the reader used to take on trust:

* **Sidecars.** A dataset of format version 2 (``"checksum": "crc32c"``) has a sidecar with
  per-sample checksums for every shard. A shard whose sidecar is missing used to be scanned
  and read *unchecked* as if it were format v1, with one ``UserWarning``: a flipped token
  byte in it was served. Now that is a :class:`CorruptShardError` naming the sidecar
  (:func:`refuse_missing_sidecar`); with ``on_corrupt="mask"`` the shard's samples stand in
  masked and are counted, as for any unreadable sidecar (``read/sources/quarantine.py``).
  Shards opened by URL without an ``index.json`` and format-v1 datasets promise no sidecar:
  those are still scanned, with the warning.
* **Token ids.** Every id a reader yields must be a token of the dataset's vocabulary
  (``tokenizer.n_vocab``) and, in a dataset without ``"loss_mask"``, carry no bit 31. An
  ``index.json`` whose ``loss_mask`` was deleted or nulled turned every masked token into an
  id of about -2**31 in the batches; now each read is checked (:meth:`IdLimit.check`: one
  vectorised max over the samples' tokens: ~0.13 ns a token in cache, 256 samples of 2,049
  tokens, about a plain ``max``; 0.4-0.8 ns per token read in a 0-worker epoch of a
  9 M-token dataset, against 5-9 ns per delivered token for the whole process; a masked
  dataset's ids are stripped first, ~3x that; a torch worker of several, which reads whole
  windows but copies only its rows, checks the rows it copies instead: ``IdLimit.admits`` in
  ``read/order/window_data.copy_rows``) and the first sample holding an
  id outside the vocabulary is an :class:`IndexValidationError` naming the shard, the sample,
  the id and what ``index.json`` says. The ids ``index.json`` itself names (``eos_id``,
  ``bos_id``, ``pad_id``) are checked when the dataset is opened (:func:`check_index_ids`).
  These are errors in every ``on_corrupt`` mode: the bytes are as packed (their CRC32C
  holds), it is the dataset's meaning that is wrong, and masking would hide it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from wdstream.errors import CorruptShardError, IndexValidationError
from wdstream.format.index import DatasetIndex
from wdstream.format.loss import ID_BITS, NO_LOSS_BIT
from wdstream.format.sample import LocatedTokens

__all__ = ["IdLimit", "check_index_ids", "id_limit", "refuse_missing_sidecar"]


def refuse_missing_sidecar(index: DatasetIndex | None, sidecar_url: str) -> None:
    """Raise when ``index`` promises the sidecar at ``sidecar_url`` that is not there.

    Raises:
        CorruptShardError: the dataset is of format version >= 2 or declares checksums.
    """
    if index is None or (index.version < 2 and index.checksum is None):
        return
    raise CorruptShardError(
        f"{sidecar_url}: missing: index.json says this dataset (format version "
        f"{index.version}, checksum {index.checksum!r}) has a sidecar with per-sample checksums "
        "for every shard; without it the shard's samples cannot be checked, and it is not read "
        "unchecked. Restore the sidecar from the pack's output, or repack"
    )


@dataclass(frozen=True)
class IdLimit:
    """The ids a dataset's samples may hold.

    Attributes:
        n_vocab: ids (without the loss bit) must be below this.
        masked: the ids carry the loss bit (``"loss_mask": "bit31"``), stripped before the
            comparison; else a set bit 31 is itself out of range.
        where: how to name the dataset's index in messages.
    """

    n_vocab: int
    masked: bool
    where: str

    def check(
        self,
        tokens: LocatedTokens,
        shard_url: str | Callable[[], str],
        first: int,
        confirm: Callable[[int], object] | None = None,
    ) -> None:
        """Refuse samples ``first, first + 1, ...`` of ``shard_url`` (``tokens``) holding an
        id outside the vocabulary.

        Args:
            shard_url: the shard's URL for the message, or what makes it (made only then:
                a read checks every piece, and the URL is a string made from the table).
            confirm: reads sample ``k`` of the shard alone and verifies its checksum, raising
                if its bytes are damaged: ``tokens`` may not be verified yet (a torch worker
                checks at copy time), and a flipped byte is corruption, not a wrong index.

        Raises:
            CorruptShardError: from ``confirm``: the sample's bytes fail their checksum.
            IndexValidationError: naming the shard, the sample, its position, the id.
        """
        n = len(tokens)
        if n == 0 or self.n_vocab >= 1 << 32:
            return
        tops = _sample_max(tokens, self.masked)
        if int(tops.max(initial=0)) < self.n_vocab:
            return
        k = int(np.flatnonzero(tops >= self.n_vocab)[0])
        if confirm is not None:
            confirm(first + k)  # raises for damaged bytes (or for the id, once verified)
        f, c = int(tokens.first[k]), int(tokens.count[k])
        ids = tokens.base[f : f + c].astype(np.int64)
        plain = ids & ID_BITS if self.masked else ids
        at = int(np.flatnonzero(plain >= self.n_vocab)[0])
        got = int(ids[at])
        url = shard_url() if callable(shard_url) else shard_url
        raise IndexValidationError(f"{url}: sample {first + k}, token {at}: " + self._why(got))

    def admits_samples(self, tokens: LocatedTokens) -> bool:
        """Whether every sample of ``tokens`` holds only ids of the vocabulary; names no
        culprit and raises nothing, so it may run on bytes not verified yet: a local read
        runs it before its CRC32C pass (``ShardSource._read_piece``), which then finds the
        bytes in the cache, and a read it does not admit gets :meth:`check` once verified."""
        if len(tokens) == 0 or self.n_vocab >= 1 << 32:
            return True
        return int(_sample_max(tokens, self.masked).max(initial=0)) < self.n_vocab

    def admits(self, ids: np.ndarray) -> bool:
        """Whether every id of ``ids`` is one of the vocabulary: ids as read (unsigned) or as
        copied into an int32 block (bit 31 then reads as the sign), one vectorised max."""
        if ids.size == 0 or self.n_vocab >= 1 << 32:
            return True
        if ids.dtype == np.int32:
            ids = ids.view(np.uint32)
        top = np.bitwise_and(ids, ids.dtype.type(ID_BITS)).max() if self.masked else ids.max()
        return int(top) < self.n_vocab

    def _why(self, got: int) -> str:
        if not self.masked and got >= NO_LOSS_BIT and (got & ID_BITS) < self.n_vocab:
            return (
                f"id {got} carries the loss bit (bit 31; id {got & ID_BITS} without it), but "
                f'{self.where} has no "loss_mask": the dataset\'s ids carry a loss mask its '
                'index.json no longer declares (restore "loss_mask": "bit31")'
            )
        plain = got & ID_BITS if self.masked else got
        return (
            f"id {plain} is not a token of the vocabulary {self.where} names "
            f"(tokenizer.n_vocab = {self.n_vocab}): index.json and the shards disagree"
        )


def _sample_max(tokens: LocatedTokens, masked: bool) -> np.ndarray:
    """The largest id (without the loss bit when ``masked``) of each sample, vectorised.

    Samples of one length at one stride (a packed shard's, read in place) are the rows of
    one strided view, and its row maxima one ``max``. Else one ``maximum.reduceat`` over
    the spans of every sample and the gaps between them; in place, the tokens lie at an
    odd byte phase (after each tar and msgpack header), and ``reduceat`` copied the whole
    unaligned buffer into an aligned one first (window 0 of a fresh process's epoch: 3.0
    ms and 800 page faults for the check; in the cache, 1.1 ms against 0.5 ms strided for
    1,024 samples of 2,049 tokens, measured).
    """
    first, count = tokens.first.astype(np.int64), tokens.count.astype(np.int64)
    base = tokens.base
    if masked:
        lo, hi = int(first.min()), int((first + count).max())
        base = base[lo:hi] & base.dtype.type(ID_BITS)
        first = first - lo
    rows = _strided_rows(base, first, count)
    if rows is not None:
        # Last sample first: a local read's CRC32C pass right after this one sums its bytes
        # first to last, so it then begins on the bytes touched last, still in the nearest
        # cache (docs/READER.md, "Checks at 0 workers (session 44)").
        return rows[::-1].max(axis=1)[::-1].astype(np.int64)
    nonempty = count > 0
    bounds = np.empty(2 * len(first), dtype=np.int64)
    bounds[0::2], bounds[1::2] = first, first + count
    # reduceat takes [bounds[i], bounds[i + 1]): even slots are samples, odd slots the gaps.
    # An empty sample (no writer makes one) gives its first element: masked out below.
    size = len(base)
    keep = bounds < size
    if not keep.all():  # the last end is the buffer's end: its span runs there anyway
        bounds = bounds[keep]
    tops = np.maximum.reduceat(base, bounds) if size else np.zeros(len(bounds), base.dtype)
    out = np.zeros(len(first), dtype=np.int64)
    picked = tops[0::2][: len(first)].astype(np.int64)
    out[: len(picked)] = picked
    return np.where(nonempty, out, 0)


def _strided_rows(base: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray | None:
    """The samples as rows of one read-only view of ``base``, when they are all of one
    length (not empty), evenly spaced and inside it, else None."""
    n = len(first)
    if n == 0 or int(count[0]) == 0 or not (count == count[0]).all():
        return None
    step = int(first[1] - first[0]) if n > 1 else int(count[0])
    if step < 0 or (n > 2 and not (np.diff(first) == step).all()):
        return None
    start, size = int(first[0]), base.itemsize
    if start < 0 or start + (n - 1) * step + int(count[0]) > len(base):
        return None  # (as_strided checks nothing: never a row past the buffer)
    return np.lib.stride_tricks.as_strided(base[start:], shape=(n, int(count[0])),
                                           strides=(step * size, size), writeable=False)  # fmt: skip


def id_limit(index: DatasetIndex | None) -> IdLimit | None:
    """The ids ``index``'s samples may hold (None: opened without an index, nothing known)."""
    if index is None:
        return None
    n_vocab = index.tokenizer.get("n_vocab") if isinstance(index.tokenizer, dict) else None
    if not isinstance(n_vocab, int) or isinstance(n_vocab, bool):
        n_vocab = NO_LOSS_BIT  # no vocabulary named: still no id reaches bit 31
    return IdLimit(min(n_vocab, NO_LOSS_BIT), index.loss_mask is not None, "index.json")


def check_index_ids(index: DatasetIndex | None, where: str) -> None:
    """Refuse an ``index.json`` naming an id (``eos_id``, ``bos_id``, ``pad_id``) that is not
    a token of its vocabulary: every id a reader yields is one.

    Raises:
        IndexValidationError: naming ``where`` and the key.
    """
    limit = id_limit(index)
    if index is None or limit is None:
        return
    for key in ("eos_id", "bos_id", "pad_id"):
        value = getattr(index, key)
        if value is not None and not 0 <= value < limit.n_vocab:
            raise IndexValidationError(
                f"{where}: {key}: {value} is not a token of the vocabulary (tokenizer.n_vocab "
                f"= {limit.n_vocab}, ids below 2**31): every id a reader yields must be one"
            )
