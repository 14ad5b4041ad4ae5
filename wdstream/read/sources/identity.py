"""A dataset named by its content: what a saved state says its data is, and the check on load.

A state must find its data again after the data moved (copied to node-local disk, mirrored
to another bucket, opened by a glob instead of its root) and must refuse data that changed.
So it names the dataset by what ``index.json`` and the sidecars commit to, never by the root
or URLs it was opened with:

* **keys** (:data:`KEYS`): what gives the samples their meaning. An indexed dataset:
  index.json's format version, checksum, tokenizer, EOS/BOS/pad ids, dtype, mode,
  ``seq_len``, ``sample_tokens`` and ``loss_mask``. Shards without an index: the mode and
  sample length inferred from their sidecars. Raw text: only its kind.
* **shards**, in order, one 64-bit digest each of what commits to the shard: with an index,
  its entry's sample and token counts, sha256 and sidecar sha256; without one, the counts
  and the sha256 of its sidecar's bytes (read on open anyway, to count); a shard without a
  sidecar, the sha256 of the tar (scanned whole on open anyway); a raw-text file, its name
  and size (no index commits to its bytes). Names and folders are not in a packed shard's
  digest: a mirror is the same data wherever it lies.

The state holds a fixed-size summary, which grows only with the log of the shard count::

    "dataset": {"shards": 9, "digest": "<16 hex>", "keys": "<8 hex x 12>",
                "set": "<16 hex>", "slices": "<2 x 8 hex per bit of the shard number>"}

``digest`` (BLAKE2b over the keys and the shard digests in order) alone decides: equal, the
same data. The rest only says *what* differs when it is not:

* ``keys``: one tag per key: names the keys that differ (another tokenizer, seq_len, ...).
* ``set``: the sum of the shard digests mod 2**64, blind to their order: an equal set with
  other slices is the same shards reordered; with one shard more, the difference *is* the
  added shard's digest, which names it.
* ``slices``: per bit ``b`` of the shard number, the sums (mod 2**32) of the digests of the
  shards whose number has bit ``b`` clear, and of those with it set. A changed shard
  changes exactly one sum of every pair, and which one spells its number::

      9 shards, shard 5 (0b0101) changed:   bit 0: set side differs    -> 1
                                            bit 1: clear side differs  -> 0
                                            bit 2: set side differs    -> 1
                                            bit 3: clear side differs  -> 0   => shard 5

  Two changed shards differ in some bit and change both sums of its pair ("several
  shards"); a removed shard is found by the one gap whose refill gives the saved sums.

States saved before content identity (``"dataset": "<16 hex>"``, a hash of the root or
URLs they were opened with, :attr:`DatasetIdentity.legacy`) load when this reader was
opened the same way, and are refused otherwise with a message saying so.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from wdstream.errors import StateMismatchError
from wdstream.format.index import DatasetIndex, ShardEntry, ShardTable
from wdstream.words import count

__all__ = [
    "KEYS",
    "DatasetIdentity",
    "indexed_identity",
    "packed_identity",
    "shards_identity",
    "text_identity",
]

# The keys of a dataset's meaning, in the order of their tags (absent ones are None).
KEYS = ("kind", "format", "checksum", "tokenizer", "eos_id", "bos_id", "pad_id", "dtype",
        "mode", "seq_len", "sample_tokens", "loss_mask")  # fmt: skip
_FIELDS = ("shards", "digest", "keys", "set", "slices")
_TAG = 8  # hex digits of one key's or slice's tag
_LOW = (1 << 32) - 1
_HEX = re.compile(r"[0-9a-f]*")
_SHOW = 60  # characters of a value quoted in a message


def _shard_digests(records: Iterable[str]) -> np.ndarray:
    """One 64-bit digest per record: the first 8 bytes of its BLAKE2b, little-endian."""
    blake2b = hashlib.blake2b
    joined = b"".join(blake2b(r.encode(), digest_size=8).digest() for r in records)
    return np.frombuffer(joined, dtype="<u8").astype(np.uint64)


def _hex(value: int, digits: int) -> str:
    return f"{value:0{digits}x}"


def _bits(n: int) -> int:
    """Bits of a shard number among ``n`` shards (at least one pair of slices)."""
    return max(1, (n - 1).bit_length())


def _slices(digests: np.ndarray) -> list[tuple[int, int]]:
    """Per bit of the shard number: (sum of digests with the bit clear, with it set), mod 2**32."""
    numbers = np.arange(len(digests))
    out = []
    for b in range(_bits(len(digests))):
        set_ = ((numbers >> b) & 1).astype(bool)
        ones = int(digests[set_].sum(dtype=np.uint64)) & _LOW
        zeros = int(digests[~set_].sum(dtype=np.uint64)) & _LOW
        out.append((zeros, ones))
    return out


@dataclass(frozen=True)
class DatasetIdentity:
    """A dataset's identity by content (see the module docstring).

    Attributes:
        keys: the value of every key of :data:`KEYS` (None where the kind has none).
        digests: uint64, one per shard (or file), in order.
        old: makes what states saved before content identity hashed to name this opening
            (the shards' names and sha256 of a root, else the URLs with counts or sizes):
            made only where such a state is checked.
        unit: what one digest stands for, in messages ("shard", raw text's "file").
    """

    keys: dict[str, Any]
    digests: np.ndarray
    old: Callable[[], list[list[Any]]]
    unit: str = "shard"

    @cached_property
    def summary(self) -> dict[str, Any]:
        """The state's ``dataset`` value (copied by :meth:`state`)."""
        blob = json.dumps(self.keys, sort_keys=True, separators=(",", ":")).encode()
        digest = hashlib.blake2b(blob + self.digests.astype("<u8").tobytes(), digest_size=8)
        return {
            "shards": len(self.digests),
            "digest": digest.hexdigest(),
            "keys": "".join(self._key_tag(k) for k in KEYS),
            "set": _hex(int(self.digests.sum(dtype=np.uint64)), 16),
            "slices": "".join(_hex(z, _TAG) + _hex(o, _TAG) for z, o in _slices(self.digests)),
        }

    def _key_tag(self, key: str) -> str:
        text = f"{key}={json.dumps(self.keys[key], sort_keys=True, separators=(',', ':'))}"
        return hashlib.blake2b(text.encode(), digest_size=_TAG // 2).hexdigest()

    @cached_property
    def legacy(self) -> str:
        """How a state saved before content identity names this opening: 16 hex of SHA-256
        over ``repr`` of :attr:`old` (made only to check such a state)."""
        return hashlib.sha256(repr(self.old()).encode()).hexdigest()[:16]

    def state(self) -> dict[str, Any]:
        """What a state saves as ``dataset`` (a fresh dict: the caller may change it)."""
        return dict(self.summary)

    def check(self, path: str, saved: Any, where: Callable[[int], str]) -> None:
        """Accept ``saved`` (a state's ``dataset``) as naming this dataset, or refuse it.

        Args:
            path: where the value lies in the state, for messages (``config.dataset``).
            saved: the value as loaded.
            where: the URL of shard (or file) ``i`` here, to name it.

        Raises:
            StateMismatchError: naming ``path`` and what differs: the keys, the shard that
                changed, was added or removed, another order; or a malformed value, or a
                state saved before content identity by another root or URLs.
        """
        if isinstance(saved, str):
            if saved != self.legacy:
                raise StateMismatchError(
                    f"{path}: the state names its dataset the old way, by the root or shard "
                    f"URLs it was opened with ({_quote(saved)}; opened this way, this dataset "
                    f"is {self.legacy!r}): a state saved before datasets were named by content "
                    "loads only when the dataset is opened exactly as that run opened it (the "
                    "same root, or the same shard URLs in the same order)"
                )
            return
        fields = self._parse(path, saved)
        if fields != self.summary:
            raise StateMismatchError(f"{path}: {self._difference(fields, where)}")

    def _parse(self, path: str, saved: Any) -> dict[str, Any]:
        """``saved`` checked for shape: the summary's keys, types and hex lengths."""
        if not isinstance(saved, dict):
            raise StateMismatchError(
                f"{path}: a dataset identity (dict) expected (got {_quote(saved)})"
            )
        for k in (*_FIELDS, *saved):
            if k not in _FIELDS or k not in saved:
                why = "unknown key" if k not in _FIELDS else "missing"
                raise StateMismatchError(f"{path}.{k}: {why} (got {_quote(saved.get(k))})")
        n = saved["shards"]
        if type(n) is not int or not 0 < n < 1 << 63:
            raise StateMismatchError(f"{path}.shards: a shard count expected (got {_quote(n)})")
        sizes = {"digest": 16, "keys": _TAG * len(KEYS), "set": 16, "slices": 2 * _TAG * _bits(n)}
        for k, size in sizes.items():
            v = saved[k]
            if not isinstance(v, str) or len(v) != size or not _HEX.fullmatch(v):
                raise StateMismatchError(
                    f"{path}.{k}: a string of {size} hex digits expected (got {_quote(v)})"
                )
        return saved

    def _difference(self, saved: dict[str, Any], where: Callable[[int], str]) -> str:
        """What differs between the saved summary and this dataset, in words."""
        mine = self.summary
        keys = [k for k, a, b in zip(KEYS, _tags(saved["keys"]), _tags(mine["keys"]), strict=True)
                if a != b]  # fmt: skip
        if keys:
            now = ", ".join(f"{k} {_quote(self.keys[k])}" for k in keys)
            verb = "differs" if len(keys) == 1 else "differ"
            why = (
                ": shards read with their index.json and without one are different datasets "
                "(the index gives them their meaning: tokenizer, ids, mode)"
                if "kind" in keys
                else ""
            )
            return (
                f"another dataset: its {', '.join(keys)} {verb} from the saved one's "
                f"(now {now}){why}"
            )
        if saved["shards"] != len(self.digests):
            return self._count_difference(saved, where)
        if saved["set"] == mine["set"] and saved["slices"] != mine["slices"]:
            return (
                f"the same {count(saved['shards'], self.unit)} in another order (the order "
                "decides the rows): open them in the saved run's order (the dataset root, or "
                "the names sorted)"
            )
        shard = self._changed_shard(saved)
        if shard is not None:
            u = self.unit
            return (
                f"{u} {shard} ({where(shard)}) is not the saved dataset's {u} {shard}: its "
                "content (hashes or counts) differs: changed or re-packed"
            )
        if saved["set"] != mine["set"]:
            return (
                f"several of its {count(saved['shards'], self.unit)} differ from the saved one's "
                "(re-packed, or other data under the same names)"
            )
        return "the fields of the saved identity disagree with each other: the state was edited"

    def _count_difference(self, saved: dict[str, Any], where: Callable[[int], str]) -> str:
        """A shard count that differs: the added shard, or where a removed one was."""
        n, m = saved["shards"], len(self.digests)
        u = self.unit
        counts = f"the saved dataset has {count(n, u)}, this one {m:,}"
        extra = (int(self.summary["set"], 16) - int(saved["set"], 16)) % (1 << 64)
        if m == n + 1:
            for j in np.flatnonzero(self.digests == np.uint64(extra)).tolist():
                if _joined(_slices(np.delete(self.digests, j))) == saved["slices"]:
                    return f"{counts}: {u} {j} ({where(j)}) was added"
        if m == n - 1:
            gap = _gap(self.digests, (-extra) % (1 << 64), saved["slices"])
            if gap is not None:
                near = [f"after {where(gap - 1)}"] if gap else []
                near += [f"before {where(gap)}"] if gap < m else []
                at = f" (it was {' and '.join(near)})" if near else ""
                return f"{counts}: the saved dataset's {u} {gap} is not here{at}: removed"
        return f"{counts}: {u}s were added or removed"

    def _changed_shard(self, saved: dict[str, Any]) -> int | None:
        """The one shard whose digest differs, read off the slices; None unless exactly one."""
        step = (int(saved["set"], 16) - int(self.summary["set"], 16)) & _LOW
        theirs, mine = _tags(saved["slices"]), _tags(self.summary["slices"])
        number = 0
        for b in range(len(mine) // 2):
            zeros, ones = (
                (int(theirs[i], 16) - int(mine[i], 16)) & _LOW for i in (2 * b, 2 * b + 1)
            )
            if step == 0 or sorted((zeros, ones)) != [0, step]:
                return None  # both sums of the pair differ (several shards), or neither
            number |= int(ones != 0) << b
        return number if number < len(self.digests) else None


def _tags(text: str) -> list[str]:
    return [text[i : i + _TAG] for i in range(0, len(text), _TAG)]


def _joined(slices: list[tuple[int, int]]) -> str:
    return "".join(_hex(z, _TAG) + _hex(o, _TAG) for z, o in slices)


def _gap(digests: np.ndarray, removed: int, saved_slices: str) -> int | None:
    """Where a shard of digest ``removed`` was taken out of ``digests`` (the saved order):
    the first position ``j`` whose refill gives ``saved_slices``, or None.

    Every gap is tried at once: with the shard put back at ``j``, the set side of bit ``b``
    sums the shards before ``j`` whose number has the bit, the refill if ``j`` has it, and
    the shards from ``j`` on whose number *plus one* has it (prefix and suffix sums)."""
    m = len(digests)
    numbers = np.arange(m + 1)
    ok = np.ones(m + 1, dtype=bool)
    with np.errstate(over="ignore"):  # sums mod 2**64
        total = digests.sum(dtype=np.uint64) + np.uint64(removed)
        for b, (zeros, ones) in enumerate(_slices_of(saved_slices)):
            before = np.zeros(m + 1, dtype=np.uint64)
            before[1:] = np.cumsum(digests * ((numbers[:m] >> b) & 1).astype(np.uint64))
            shifted = digests * (((numbers[:m] + 1) >> b) & 1).astype(np.uint64)
            after = np.zeros(m + 1, dtype=np.uint64)
            after[:m] = np.cumsum(shifted[::-1])[::-1]
            refill = np.uint64(removed) * ((numbers >> b) & 1).astype(np.uint64)
            set_side = before + refill + after
            ok &= (set_side & np.uint64(_LOW)) == np.uint64(ones)
            ok &= ((total - set_side) & np.uint64(_LOW)) == np.uint64(zeros)
    found = np.flatnonzero(ok)
    return int(found[0]) if len(found) else None


def _slices_of(text: str) -> list[tuple[int, int]]:
    tags = [int(t, 16) for t in _tags(text)]
    return list(zip(tags[::2], tags[1::2], strict=True))


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 3] + "..."


def indexed_identity(
    index: DatasetIndex, entries: Sequence[ShardEntry], old: Callable[[], list[list[Any]]]
) -> DatasetIdentity:
    """The identity of the shards ``entries`` of ``index`` (a root, or shards opened by URL
    beside their index.json: the same shards give the same identity either way)."""
    keys = {"kind": "index.json", "format": index.version, "checksum": index.checksum,
            "tokenizer": index.tokenizer, "eos_id": index.eos_id, "bos_id": index.bos_id,
            "pad_id": index.pad_id, "dtype": index.dtype, "mode": index.mode,
            "seq_len": index.seq_len, "sample_tokens": index.sample_tokens,
            "loss_mask": index.loss_mask}  # fmt: skip
    fields = ("samples", "tokens", "sha256", "sidecar_sha256")
    columns = (
        [entries.column(f) for f in fields]  # index.json's table: no entry made
        if isinstance(entries, ShardTable)
        else [[getattr(e, f) for e in entries] for f in fields]
    )
    digests = _shard_digests(map("{}|{}|{}|{}".format, *columns))
    return DatasetIdentity(keys, digests, old)


def shards_identity(
    mode: str,
    sample_tokens: int | None,
    records: Sequence[tuple[int, int, str]],
    old: Callable[[], list[list[Any]]],
) -> DatasetIdentity:
    """The identity of shards read without an index: ``mode`` and ``sample_tokens`` as
    inferred, per shard ``(samples, tokens, sha256 of its sidecar, or of the tar without one)``."""
    keys = dict.fromkeys(KEYS) | {"kind": "shards", "mode": mode, "sample_tokens": sample_tokens}
    digests = _shard_digests(f"{s}|{t}|{sha}" for s, t, sha in records)
    return DatasetIdentity(keys, digests, old)


def text_identity(files: Sequence[tuple[str, int]], old: list[list[Any]]) -> DatasetIdentity:
    """The identity of raw text files: per file ``(name without its folder, size)``."""
    keys = dict.fromkeys(KEYS) | {"kind": "text"}
    digests = _shard_digests(f"{name}|{size}" for name, size in files)
    return DatasetIdentity(keys, digests, lambda: old, "file")


def packed_identity(
    index: DatasetIndex | None,
    entries: Sequence[ShardEntry] | None,
    urls: Sequence[tuple[str, str]],
    records: Sequence[tuple[int, int, str]] | None,
    mode: str,
    sample_tokens: int | None,
) -> DatasetIdentity:
    """The identity of a packed dataset as a :class:`ShardSource` opened it: ``entries`` of
    ``index`` when it has one (opened by root or beside it), else the shards' ``records``
    (samples, tokens, sidecar sha256) and inferred ``mode``; what old states hashed from the
    root's index (opened by root: ``records`` None) or from the shard URLs and counts."""

    def old() -> list[list[Any]]:
        if records is None:
            return [[s.name, s.sha256] for s in entries or ()]
        return [[f"{r}/{n}", a, b] for (r, n), (a, b, _) in zip(urls, records, strict=True)]

    if index is not None and entries is not None:
        return indexed_identity(index, entries, old)
    assert records is not None
    return shards_identity(mode, sample_tokens, records, old)
