"""Test helpers: a tiny dataset writer and the shared exact-resume harness.

``write_synthetic_dataset`` builds a dataset in the real format (through pack's
:class:`~wdstream.write.shards.ShardWriter`, v2 or v1) from synthetic documents whose tokens are *recognisable*: with the default
``uint32`` dtype, token ``t`` of the dataset is the integer ``t`` (its global position in the
document stream), so a test can check no-missing / no-duplicate / order from the tokens
alone, and ``token // sample_tokens`` is the sample key in concat mode::

    docs (lengths 3, 5, ...):   [0 1 2] [3 4 5 6 7] ...
    concat, sample_tokens=4:    sample 0 = [0 1 2 3] doc_lens (3, 1) cont False
                                sample 1 = [4 5 6 7] doc_lens (4,)   cont True

``assert_resumes_exactly`` is the one resumability check every stateful stage's tests call
(the grain / torchdata ``run_test_save_load_state`` habit).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from wdstream.format.checksum import CHECKSUM_NAME
from wdstream.format.index import FORMAT_VERSION, JOURNAL_NAME, DatasetIndex, ShardEntry
from wdstream.format.shard_table import TABLE_NAME, build_table
from wdstream.storage import open_store
from wdstream.write import journal
from wdstream.write.commit import write_index as publish_index
from wdstream.write.shards import ShardWriter

__all__ = [
    "alive",
    "assert_resumes_exactly",
    "committed_shards",
    "live_descendants",
    "restored_after",
    "rewrite_index",
    "synthetic_doc_lengths",
    "write_synthetic_dataset",
]


def synthetic_doc_lengths(n_docs: int, seed: int = 0, lo: int = 1, hi: int = 300) -> list[int]:
    """Deterministic document lengths in ``[lo, hi]``."""
    rng = np.random.default_rng([seed, 12345])
    return [int(x) for x in rng.integers(lo, hi + 1, size=n_docs)]


def _concat_samples(
    doc_lens: Sequence[int], sample_tokens: int
) -> Iterator[tuple[int, int, list[int], bool]]:
    """Yield ``(start_token, n_tokens, doc_lens, cont)`` of fixed-length concat samples."""
    total = int(sum(doc_lens))
    doc_ends = np.cumsum(doc_lens)
    doc_starts = doc_ends - np.asarray(doc_lens)
    for start in range(0, total, sample_tokens):
        stop = min(start + sample_tokens, total)
        first = int(np.searchsorted(doc_ends, start, side="right"))
        pieces: list[int] = []
        d = first
        while d < len(doc_lens) and doc_starts[d] < stop:
            pieces.append(int(min(doc_ends[d], stop) - max(doc_starts[d], start)))
            d += 1
        yield start, stop - start, pieces, bool(doc_starts[first] < start)


def write_synthetic_dataset(
    root: str,
    *,
    n_docs: int = 200,
    doc_lens: Sequence[int] | None = None,
    mode: str = "concat",
    sample_tokens: int = 65,
    samples_per_shard: int = 10,
    dtype: str = "uint32",
    name: str = "data",
    seed: int = 0,
    sidecars: bool = True,
    write_index: bool = True,
    version: int = FORMAT_VERSION,
) -> DatasetIndex:
    """Write a synthetic dataset under ``root`` (through the real shard writer), return its index.

    Args:
        root: dataset folder or URL (anything ``open_store`` takes).
        n_docs: number of synthetic documents (ignored if ``doc_lens`` is given).
        doc_lens: explicit document lengths.
        mode: ``"concat"`` (samples of exactly ``sample_tokens``, the last may be shorter) or
            ``"docs"`` (one document per sample).
        sample_tokens: concat sample length (``seq_len + 1`` of the pack).
        samples_per_shard: samples per shard (small, so there are many shards).
        dtype: ``"uint32"`` (token = global position) or ``"uint16"`` (position mod 65536).
        name: shard name prefix.
        seed: seeds the document lengths.
        sidecars: write ``.idx`` sidecars (False to test the tar-scan fallback).
        write_index: write ``index.json``.
        version: format version (1 to test that old datasets still read).

    Returns:
        The :class:`DatasetIndex` describing what was written.
    """
    if mode not in ("concat", "docs"):
        raise ValueError(f"mode must be 'concat' or 'docs', got {mode!r}")
    lens = list(doc_lens) if doc_lens is not None else synthetic_doc_lengths(n_docs, seed)
    np_dtype = np.dtype("<u4" if dtype == "uint32" else "<u2")
    if mode == "concat":
        samples = list(_concat_samples(lens, sample_tokens))
    else:
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(int)
        samples = [(int(s), n, [n], False) for s, n in zip(starts, lens, strict=True)]
    store = open_store(root, create=True)
    shards: list[ShardEntry] = []
    writer = ShardWriter(
        store,
        name,
        shard_bytes=1 << 62,
        shard_samples=samples_per_shard,
        on_commit=lambda entry, _: shards.append(entry),
        version=version,
    )
    wrap = 1 << (8 * np_dtype.itemsize)
    for start, n, pieces, cont in samples:
        tokens = (np.arange(start, start + n, dtype=np.int64) % wrap).astype(np_dtype)
        writer.add(tokens, pieces, cont, new_docs=len(pieces) - int(cont), state=None)
    writer.close()
    if not sidecars:
        for entry in shards:
            store.delete(entry.sidecar)
    n_vocab = int(sum(lens)) + 1 if dtype == "uint32" else 1 << 16
    index = DatasetIndex(
        tokenizer={"name": "synthetic", "backend": "none", "ranks_sha256": "", "n_vocab": n_vocab},
        eos_id=None,
        bos_id=None,
        dtype=dtype,
        mode=mode,
        seq_len=sample_tokens - 1 if mode == "concat" else None,
        sample_tokens=sample_tokens if mode == "concat" else None,
        shards=tuple(shards),
        stats={"documents": len(lens)},
        checksum=CHECKSUM_NAME if version >= 2 else None,
        version=version,
    )
    if write_index:
        index = publish_index(store, index) if version >= 2 else index
        if version < 2:
            store.write_bytes("index.json", index.to_json().encode())
    return index


class _Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def __iter__(self) -> Iterator[Any]: ...


_S = TypeVar("_S", bound=_Stateful)


def rewrite_index(root: str, obj: dict[str, Any]) -> None:
    """Write ``obj`` (a parsed index.json, edited) as ``root``'s index.json with its shard
    table rebuilt from ``obj["shards"]`` and committed to: a dataset whose index vouches for
    the edit, as a pack that wrote those entries would have (an edit of index.json alone is
    refused where its table disagrees). Shard dicts are written as given (unknown keys too).
    """
    store = open_store(root)
    table: bytes | None = None
    if "shard_table" in obj:
        try:
            entries = [ShardEntry(**{k: s.get(k) for k in _ENTRY_KEYS}) for s in obj["shards"]]
            table = build_table(entries)
        except (TypeError, ValueError, OverflowError, AttributeError, KeyError):
            table = None  # values no table holds (-1, NaN): index.json's rules refuse them
    if "shard_table" in obj and table is not None:
        store.write_bytes(TABLE_NAME, table)
        digest = hashlib.sha256(table).hexdigest()
        obj = {**obj, "shard_table": {"bytes": len(table), "name": TABLE_NAME, "sha256": digest}}
    store.write_bytes("index.json", json.dumps(obj).encode())


_ENTRY_KEYS = tuple(ShardEntry.__dataclass_fields__)


def restored_after(make: Callable[[], _S], stop: int) -> _S:
    """A fresh ``make()`` that loaded the state another one saved after ``stop`` items, the
    state passed through JSON (numpy integers as ints) the way a checkpoint would carry it.

    For loaders whose state is only taken between items (torchdata's ``StatefulDataLoader``
    over workers); :func:`assert_resumes_exactly` checks every position of one pass instead.
    """
    first = make()
    it = iter(first)
    for _ in range(stop):
        next(it)
    state = json.loads(json.dumps(first.state_dict(), default=int))
    del it
    fresh = make()
    fresh.load_state_dict(state)
    return fresh


def _canon(item: Any) -> Any:
    """Comparable form of a batch (tensors / arrays -> nested lists)."""
    if isinstance(item, dict):
        return {k: _canon(v) for k, v in sorted(item.items())}
    if isinstance(item, list | tuple):
        return [_canon(v) for v in item]
    if hasattr(item, "tolist"):
        return item.tolist()
    return item


def assert_resumes_exactly(
    make: Callable[[], _Stateful],
    steps: int | None = None,
    check_at: Iterable[int] | None = None,
    json_roundtrip: bool = True,
) -> list[Any]:
    """Check that restoring the state taken after any step reproduces the rest exactly.

    Runs one uninterrupted pass over ``iter(make())`` (at most ``steps`` items), recording the
    state *before* every item. Then, for every position ``i`` in ``check_at`` (default: all),
    builds a fresh instance, loads the state recorded before item ``i`` and asserts it yields
    exactly items ``i..`` of the uninterrupted pass (up to the same stop).

    Args:
        make: factory of fresh, identically configured instances.
        steps: items to draw from the uninterrupted pass (None: until exhausted).
        check_at: positions to restore at; default every position ``0..n``.
        json_roundtrip: pass each state through ``json.dumps``/``loads`` first.

    Returns:
        The items of the uninterrupted pass (canonicalised to nested lists).
    """
    ref = make()
    it = iter(ref)
    states: list[dict[str, Any]] = []
    items: list[Any] = []
    while steps is None or len(items) < steps:
        states.append(json.loads(json.dumps(ref.state_dict())))
        try:
            items.append(_canon(next(it)))
        except StopIteration:
            states.pop()
            break
    states.append(json.loads(json.dumps(ref.state_dict())))
    positions = range(len(items) + 1) if check_at is None else check_at
    for i in positions:
        state = states[i]
        if json_roundtrip:
            state = json.loads(json.dumps(state))
        fresh = make()
        fresh.load_state_dict(state)
        want = items[i:]
        got: list[Any] = []
        fit = iter(fresh)
        while len(got) < len(want):
            try:
                got.append(_canon(next(fit)))
            except StopIteration:
                break
        assert got == want, f"resume at step {i}: {len(got)} items, first mismatch at " + str(
            next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        )
    return items


def live_descendants(pid: int) -> set[int]:
    """Live (not zombie) descendants of ``pid``, from Linux's ``/proc`` (empty elsewhere):
    what a killed pack or loader must not leave behind (its pool, its fork server)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(d.name))
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (``/proc``; False elsewhere)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def committed_shards(out: Path) -> int:
    """Shards a running local pack into ``out`` has committed so far, read from its journal
    (sealed segments count ``SEGMENT`` each): what a test or fault harness waits for before it
    kills the pack. 0 before the journal exists, after the pack ends (the journal is removed)
    or while a write of it is half-seen."""
    try:
        live = json.loads((out / JOURNAL_NAME).read_bytes())
        return int(live.get("sealed", 0)) * journal.SEGMENT + len(live["shards"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0
