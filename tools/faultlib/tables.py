"""The shard table (``index.shards``), the head of a large ``index.json`` and the node
cache's tables and sidecars, attacked.

Oracles, all outside the code under test: the clean datasets' rows read by the Loader
before any damage (every read must be a clear error or exactly those rows), and, for
``wdstream verify``, an independent decode of the table with :mod:`struct` by
``docs/FORMAT.md``'s layout (:func:`decode_table`) compared with the JSON list parsed by
:mod:`json`: ``verify`` may pass only when the table is the one committed to, equals the
list row for row, and no key after the list says something the head does not.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from crc32c import crc32c  # not wdstream's CRC (fastcrc): an independent implementation

from faultlib.common import (
    Attempt,
    clean_dataset,
    compare,
    labelled,
    read_rows,
    run_cli,
    test_servers,
)
from wdstream.testing import write_synthetic_dataset

HEADER = struct.Struct("<8sIIQIIQ24x")  # docs/FORMAT.md, "The shard table"
COUNTS = ("samples", "tokens", "documents", "bytes")
HASHES = ("sha256", "sidecar_sha256", "provenance_sha256")
SUFFIX = {"name": ".tar", "sidecar": ".idx", "provenance": ".prov"}
SUMMARY = ("format", "version", "tokenizer", "eos_id", "bos_id", "dtype", "mode", "seq_len",
           "sample_tokens", "checksum", "pad_id", "loss_mask", "shard_table", "stats")  # fmt: skip
REQUIRED = SUMMARY[:9]
TABLE = "index.shards"
KEYS = ("name", "sidecar", *COUNTS, *HASHES, "provenance")  # a shard's known keys

# ---------------------------------------------------------------- an independent table codec


def decode_table(data: bytes) -> list[dict[str, Any]]:
    """The rows of table bytes by ``docs/FORMAT.md`` (ValueError for anything else)."""
    if len(data) < HEADER.size:
        raise ValueError("short")
    magic, version, flags, n, plen, crc, names_bytes = HEADER.unpack_from(data)
    if magic != b"WDSHARDS" or version != 1 or flags & ~3 or n < 1:
        raise ValueError("header")
    if bool(flags & 2) == bool(plen) or crc32c(data[HEADER.size :]) != crc:
        raise ValueError("flags or crc")
    at, prov = HEADER.size, bool(flags & 1)
    prefix = data[at : at + plen].decode() if plen else None
    at += plen + (-plen % 8)
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    for key in COUNTS:
        for i, v in enumerate(struct.unpack_from(f"<{n}Q", data, at)):
            rows[i][key] = v
        at += 8 * n
    for key in HASHES[: 3 if prov else 2]:
        for i in range(n):
            rows[i][key] = data[at + 32 * i : at + 32 * i + 32].hex()
        at += 32 * n
    keys = ["name", "sidecar", "provenance"][: 3 if prov else 2]
    for key in keys:
        if prefix is not None:
            for i in range(n):
                rows[i][key] = f"{prefix}-{i:06d}{SUFFIX[key]}"
            continue
        offs = struct.unpack_from(f"<{n + 1}Q", data, at)
        at += 8 * (n + 1)
        blob = data[at : at + offs[-1]]
        if len(blob) != offs[-1] or any(b < a for a, b in zip(offs, offs[1:], strict=False)):
            raise ValueError("offsets")
        for i in range(n):
            rows[i][key] = blob[offs[i] : offs[i + 1]].decode()
        at += offs[-1] + (-offs[-1] % 8)
    if at != len(data) or (prefix is None and at - _names_start(n, plen, prov) != names_bytes):
        raise ValueError("size")
    return rows


def _names_start(n: int, plen: int, prov: bool) -> int:
    return HEADER.size + plen + (-plen % 8) + n * (32 + 32 * (3 if prov else 2))


def encode_table(rows: list[dict[str, Any]], listed: bool = False, **lie: Any) -> bytes:
    """Table bytes of ``rows`` (names under the rule NAME-{i:06d} unless ``listed``); ``lie``
    replaces header fields (``magic``, ``version``, ``flags``, ``n``, ``plen``, ``crc``,
    ``names_bytes``) or the ``prefix`` after the body is laid out."""
    n, prov = len(rows), all("provenance" in r for r in rows)
    body_fn = lie.pop("body", None)
    prefix = None if listed else rows[0]["name"][: -len("-000000.tar")]
    raw = b"" if prefix is None else lie.pop("prefix", prefix.encode())
    body = raw + bytes(-len(raw) % 8)
    for key in COUNTS:
        body += struct.pack(f"<{n}Q", *[r[key] for r in rows])
    for key in HASHES[: 3 if prov else 2]:
        body += b"".join(bytes.fromhex(r[key]) for r in rows)
    names = b""
    if listed:
        for key in ["name", "sidecar", "provenance"][: 3 if prov else 2]:
            encoded = [r[key] if isinstance(r[key], bytes) else r[key].encode() for r in rows]
            offs = np.concatenate([[0], np.cumsum([len(s) for s in encoded])]).tolist()
            blob = b"".join(encoded)
            names += struct.pack(f"<{n + 1}Q", *offs) + blob + bytes(-len(blob) % 8)
    body += names
    fields = {"magic": b"WDSHARDS", "version": 1, "flags": int(prov) | (2 if listed else 0),
              "n": n, "plen": len(raw), "crc": None, "names_bytes": len(names)}  # fmt: skip
    fields.update(lie)
    body = body_fn(body) if body_fn is not None else body
    crc = crc32c(body) if fields["crc"] is None else fields["crc"]
    head = HEADER.pack(fields["magic"], fields["version"], fields["flags"], fields["n"],
                       fields["plen"], crc, fields["names_bytes"])  # fmt: skip
    return head + body


def commit(root: Path, table: bytes, **commitment: Any) -> None:
    """Write ``table`` as ``root``'s index.shards and make index.json commit to it (its
    length and sha256, unless ``commitment`` says otherwise), keys kept in order."""
    (root / TABLE).write_bytes(table)
    obj = json.loads((root / "index.json").read_text())
    obj["shard_table"] = {"bytes": len(table), "name": TABLE,
                          "sha256": hashlib.sha256(table).hexdigest(), **commitment}  # fmt: skip
    (root / "index.json").write_text(json.dumps(obj, indent=1) + "\n")


def listed_rows(root: Path) -> list[dict[str, Any]]:
    return json.loads((root / "index.json").read_text())["shards"]


# ---------------------------------------------------------------- the oracle for verify


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return {"__order__": keys, **dict(pairs)} if "shards" in keys else dict(pairs)


def _bad_constant(text: str) -> Any:
    raise ValueError(text)


def consistent(root: Path) -> str | None:
    """What makes ``root`` a dataset ``verify`` must refuse, by json + struct alone (None:
    nothing)."""
    try:
        obj = json.loads((root / "index.json").read_bytes(), object_pairs_hook=_pairs,
                         parse_constant=_bad_constant)  # fmt: skip
    except (ValueError, RecursionError) as exc:
        return f"index.json is not strict JSON ({exc})"[:200]
    order = obj.pop("__order__", [])
    after = order[order.index("shards") + 1 :] if "shards" in order else []
    head = order[: order.index("shards")] if "shards" in order else order
    if set(REQUIRED) <= set(head) and "shard_table" in head and set(after) & set(SUMMARY):
        return f"keys {sorted(set(after) & set(SUMMARY))} after the shard list"
    commitment = obj.get("shard_table")
    if commitment is None:
        return f"{TABLE} lies there uncommitted" if (root / TABLE).exists() else None
    try:
        data = (root / TABLE).read_bytes()
    except OSError as exc:
        return f"table unreadable ({exc})"
    if not isinstance(commitment, dict) or {
        k: commitment.get(k) for k in ("bytes", "name", "sha256")
    } != {
        "bytes": len(data),
        "name": TABLE,
        "sha256": hashlib.sha256(data).hexdigest(),
    }:  # fmt: skip  (unknown keys are ignored, as everywhere in index.json)
        return "the table is not the one committed to"
    try:
        rows = decode_table(data)
    except (ValueError, UnicodeDecodeError, struct.error) as exc:
        return f"the table does not decode ({exc})"
    listed = obj.get("shards")
    if not isinstance(listed, list) or len(listed) != len(rows):
        return "list and table differ in length"
    for i, (a, b) in enumerate(zip(listed, rows, strict=True)):
        a = (
            {k: v for k, v in a.items() if v is not None and k in KEYS}
            if isinstance(a, dict)
            else a
        )
        if a != b:
            return f"shards[{i}] differs between list and table"
    return None


def verify_attempt(root: Path) -> Attempt:
    """``wdstream verify``: a clear failure, or a pass the oracle agrees with."""
    found: list[str] = []

    def ok() -> bool:
        said = consistent(root)
        found.extend([said] if said else [])
        return said is None

    def attempt() -> str:
        out = run_cli(["verify", str(root)], timeout=120, ok=ok)
        return f"silent wrong: verify passed: {found[0]}" if found else out

    return attempt


def loader_attempt(root: Path, want: np.ndarray, **read: object) -> Attempt:
    return lambda: compare(lambda: read_rows(str(root), **read), want)


# ---------------------------------------------------------------- datasets


def large_dataset(work: Path) -> tuple[Path, np.ndarray]:
    """~280 one-sample shards: an index.json over 64 KiB, so readers take the head path."""
    root = work / "tables-large"
    if not root.exists():
        write_synthetic_dataset(str(root), n_docs=60, sample_tokens=33, samples_per_shard=1)
    assert (root / "index.json").stat().st_size > 64 << 10
    return root, read_rows(str(root))


def listed_dataset(work: Path, src: Path) -> Path:
    """``src`` with every shard renamed off the packer's rule (names listed in the table,
    which :func:`encode_table` writes), index.json and table rewritten to match."""
    root = work / f"tables-listed-{src.name}"
    if root.exists():
        return root
    shutil.copytree(src, root)
    obj = json.loads((root / "index.json").read_text())
    for i, shard in enumerate(obj["shards"]):
        for key, ext in (("name", ".tar"), ("sidecar", ".idx")):
            new = f"part{i * 7 % 1000}-{'x' * (i % 5)}{ext}"
            (root / shard[key]).rename(root / new)
            shard[key] = new
    (root / "index.json").write_text(json.dumps(obj, indent=1) + "\n")
    commit(root, encode_table(obj["shards"], listed=True))
    return root


def _copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def _both(dst: Path, want: np.ndarray, label: str) -> Iterator[Attempt]:
    """The Loader's epoch and ``verify`` of ``dst``, each outcome labelled."""
    for run, what in ((loader_attempt(dst, want), "Loader"), (verify_attempt(dst), "verify")):
        yield lambda run=run, what=what: labelled(f"{label} ({what})", run())


# ---------------------------------------------------------------- attacks


def table_flips(work: Path, scale: float) -> Iterator[Attempt]:
    """1 random bit of index.shards flipped: left alone, with index.json's commitment
    updated, and with the table's CRC32C recomputed too (an attacker who rewrites both);
    small and large index.json, names by rule and listed."""
    small, want = clean_dataset(work)
    large, want_large = large_dataset(work)
    sets = [(Path(small), want), (large, want_large), (listed_dataset(work, Path(small)), want),
            (listed_dataset(work, large), want_large)]  # fmt: skip
    rng = np.random.default_rng(11)
    for k in range(max(4, int(48 * scale))):
        src, clean = sets[k % 4]
        data = bytearray((src / TABLE).read_bytes())
        n = struct.unpack_from("<Q", data, 16)[0]
        near = 64 + 8 + 32 * n  # header, a prefix, the counts: most of the meaning
        bit = int(rng.integers((near if k % 2 else len(data)) * 8))
        data[bit // 8] ^= 1 << (bit % 8)
        how = ("alone", "committed", "crc")[k // 4 % 3]
        if how == "crc" and bit >= 64 * 8:
            data[28:32] = struct.pack("<I", crc32c(bytes(data[64:])))
        dst = _copy(src, work / f"tflip-{k}")
        if how == "alone":
            (dst / TABLE).write_bytes(bytes(data))
        else:
            commit(dst, bytes(data))
        yield from _both(
            dst, clean, f"{(src / 'index.json').stat().st_size >> 10} KB, {how}, bit {bit}"
        )


def _lies() -> dict[str, Callable[[list[dict[str, Any]]], bytes]]:
    big = (1 << 63) + 5

    def names(*values: Any) -> Callable[[list[dict[str, Any]]], bytes]:
        def make(rows: list[dict[str, Any]]) -> bytes:
            rows = [dict(r) for r in rows]
            for i, v in enumerate(values):
                if v is not None:
                    rows[i + 1]["name"] = v
            return encode_table(rows, listed=True)

        return make

    def offsets(fn: Callable[[list[int]], list[int]]) -> Callable[[list[dict[str, Any]]], bytes]:
        def make(rows: list[dict[str, Any]]) -> bytes:
            good = encode_table(rows, listed=True)
            n = len(rows)
            at = _names_start(n, 0, False)
            offs = fn(list(struct.unpack_from(f"<{n + 1}Q", good, at)))
            body = bytearray(good[64:])
            struct.pack_into(f"<{n + 1}Q", body, at - 64, *offs)
            return encode_table(rows, listed=True, body=lambda _b: bytes(body))

        return make

    def row(key: str, value: Any) -> Callable[[list[dict[str, Any]]], bytes]:
        def make(rows: list[dict[str, Any]]) -> bytes:
            rows = [dict(r) for r in rows]
            rows[1][key] = value
            return encode_table(rows)

        return make

    return {
        "n + 1": lambda r: encode_table(r, n=len(r) + 1),
        "n - 1": lambda r: encode_table(r, n=len(r) - 1),
        "n = 0": lambda r: encode_table(r, n=0),
        "n = 2**63": lambda r: encode_table(r, n=big),
        "n = 2**40 - 1": lambda r: encode_table(r, n=(1 << 40) - 1),
        "prefix length + 1": lambda r: encode_table(r, plen=5),
        "prefix length 2**31": lambda r: encode_table(r, plen=1 << 31),
        "prefix length 0, not listed": lambda r: encode_table(r, plen=0),
        "names bytes 2**63": lambda r: encode_table(r, names_bytes=big),
        "names bytes 8": lambda r: encode_table(r, names_bytes=8),
        "flags 4": lambda r: encode_table(r, flags=4),
        "flags: provenance, no columns": lambda r: encode_table(r, flags=1),
        "version 2": lambda r: encode_table(r, version=2),
        "magic": lambda r: encode_table(r, magic=b"WDSHARDZ"),
        "crc 0": lambda r: encode_table(r, crc=0),
        "prefix ../up": lambda r: encode_table(r, prefix=b"../data"),
        "prefix /tmp/abs": lambda r: encode_table(r, prefix=b"/tmp/data"),
        "prefix with NUL": lambda r: encode_table(r, prefix=b"da\x00a"),
        "prefix not UTF-8": lambda r: encode_table(r, prefix=b"d\xffta"),
        "prefix sub/data": lambda r: encode_table(r, prefix=b"sub/data"),
        "prefix %s": lambda r: encode_table(r, prefix=b"d%sa"),
        "prefix other": lambda r: encode_table(r, prefix=b"other"),
        "prefix 5000 bytes": lambda r: encode_table(r, prefix=b"d" * 5000),
        "prefix 'data ' (space)": lambda r: encode_table(r, prefix=b"data "),
        "listed ../x.tar": names("../data-000001.tar"),
        "listed /etc/x.tar": names("/etc/x.tar"),
        "listed NUL": names("a\x00b.tar"),
        "listed not UTF-8": names(b"d\xff.tar"),
        "listed duplicate": names("part0-.tar"),
        "listed empty": names(""),
        "listed no .tar": names("x.idx"),
        "listed dot": names(".tar"),
        "listed newline": names("a\nb.tar"),
        "listed 5000 bytes": names("d" * 5000 + ".tar"),
        "offsets backwards": offsets(lambda o: [o[0], o[2], o[1], *o[3:]]),
        "offsets past the end": offsets(lambda o: [*o[:-1], o[-1] + 8]),
        "offsets first 2**63": offsets(lambda o: [1 << 63, *o[1:]]),
        "offsets first 3": offsets(lambda o: [3, *o[1:]]),
        "offsets all 0": offsets(lambda o: [0] * len(o)),
        "offset 2**64-1": offsets(lambda o: [o[0], (1 << 64) - 1, *o[2:]]),
        "samples 0": row("samples", 0),
        "samples 2**64-1": row("samples", (1 << 64) - 1),
        "tokens - 1": lambda r: row("tokens", r[1]["tokens"] - 1)(r),
        "tokens 2**48": row("tokens", 1 << 48),
        "bytes 513": row("bytes", 513),
        "bytes + 512": lambda r: row("bytes", r[1]["bytes"] + 512)(r),
        "documents + 1": lambda r: row("documents", r[1]["documents"] + 1)(r),
        "sha256 of another shard": lambda r: row("sha256", r[2]["sha256"])(r),
        "sidecar_sha256 zero": row("sidecar_sha256", "00" * 32),
        "two rows swapped": lambda r: encode_table([r[1], r[0], *r[2:]], listed=True),
        "provenance added": lambda r: encode_table(
            [
                {**x, "provenance": f"p-{i}.prov", "provenance_sha256": "11" * 32}
                for i, x in enumerate(r)
            ],
            listed=True,
        ),  # fmt: skip
        "cut by 8": lambda r: encode_table(r)[:-8],
        "8 bytes appended": lambda r: encode_table(r) + bytes(8),
        "header only": lambda r: encode_table(r)[:64],
        "empty": lambda r: b"",
    }


def table_lies(work: Path, scale: float) -> Iterator[Attempt]:
    """Tables whose header, names or rows lie, forged with a valid CRC32C and committed to
    by index.json (length and sha256): small and large index.json, Loader and verify."""
    small, want = clean_dataset(work)
    large, want_large = large_dataset(work)
    for j, (src, clean) in enumerate(((Path(small), want), (large, want_large))):
        rows = listed_rows(src)
        for k, (label, make) in enumerate(_lies().items()):
            if label.startswith(("listed", "offsets")):
                src_k = listed_dataset(work, src)
                rows_k = listed_rows(src_k)
            else:
                src_k, rows_k = src, rows
            dst = _copy(src_k, work / f"tlie-{j}-{k}")
            commit(dst, make(rows_k))
            yield from _both(dst, clean, f"{'large' if j else 'small'}: {label}")


def _commitments() -> dict[str, Callable[[dict[str, Any]], Any]]:
    return {
        "missing": lambda c: None,
        "null": lambda c: "null",
        "a string": lambda c: "index.shards",
        "a list": lambda c: [c],
        "bytes true": lambda c: {**c, "bytes": True},
        "bytes 1.5e5": lambda c: {**c, "bytes": float(c["bytes"])},
        "bytes - 1": lambda c: {**c, "bytes": c["bytes"] - 1},
        "bytes + 1": lambda c: {**c, "bytes": c["bytes"] + 1},
        "bytes 2**47": lambda c: {**c, "bytes": 1 << 47},
        "bytes 2**64": lambda c: {**c, "bytes": 1 << 64},
        "bytes -1": lambda c: {**c, "bytes": -1},
        "bytes 0": lambda c: {**c, "bytes": 0},
        "bytes a string": lambda c: {**c, "bytes": str(c["bytes"])},
        "sha256 upper-case": lambda c: {**c, "sha256": c["sha256"].upper()},
        "sha256 one digit changed": lambda c: {
            **c,
            "sha256": "0" + c["sha256"][1:] if c["sha256"][0] != "0" else "1" + c["sha256"][1:],
        },  # fmt: skip
        "sha256 63 digits": lambda c: {**c, "sha256": c["sha256"][:63]},
        "sha256 a number": lambda c: {**c, "sha256": 5},
        "sha256 missing": lambda c: {k: v for k, v in c.items() if k != "sha256"},
        "name ../index.shards": lambda c: {**c, "name": "../index.shards"},
        "name index.json": lambda c: {**c, "name": "index.json"},
        "extra key": lambda c: {**c, "x": 1},
        "another dataset's table": lambda c: "other",
    }


def commitments(work: Path, scale: float) -> Iterator[Attempt]:
    """index.json's ``shard_table`` retyped, resized, re-hashed, renamed or removed (the
    table itself untouched, or another dataset's in its place), small and large."""
    small, want = clean_dataset(work)
    large, want_large = large_dataset(work)
    for j, (src, clean, other) in enumerate(
        ((Path(small), want, large), (large, want_large, Path(small)))
    ):
        for k, (label, edit) in enumerate(_commitments().items()):
            dst = _copy(src, work / f"tcommit-{j}-{k}")
            obj = json.loads((dst / "index.json").read_text())
            new = edit(obj["shard_table"])
            if new is None:
                del obj["shard_table"]
            elif new == "null":
                obj["shard_table"] = None
            elif new == "other":
                shutil.copyfile(other / TABLE, dst / TABLE)
                obj = json.loads((dst / "index.json").read_text())
                obj["shard_table"] = json.loads((other / "index.json").read_text())["shard_table"]
            else:
                obj["shard_table"] = new
            (dst / "index.json").write_text(json.dumps(obj, indent=1) + "\n")
            yield from _both(dst, clean, f"{'large' if j else 'small'}: {label}")


def _text_edits() -> dict[str, Callable[[str], str]]:
    def tail(extra: str) -> Callable[[str], str]:
        return lambda t: t.rstrip()[:-1] + extra + "}\n"

    def reorder(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[str], str]:
        return lambda t: json.dumps(fn(json.loads(t)), indent=1) + "\n"

    def move_after(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        return lambda o: {**{k: v for k, v in o.items() if k != key}, key: o[key]}

    def one_row(key: str, delta: int) -> Callable[[str], str]:
        def edit(t: str) -> str:
            o = json.loads(t)
            o["shards"][1][key] += delta
            return json.dumps(o, indent=1) + "\n"

        return edit

    return {
        "mode repeated after the list": tail(', "mode": "docs"'),
        "version 3 repeated after the list": tail(', "version": 3'),
        "stats repeated after the list": tail(', "stats": {"documents": 1}'),
        "loss_mask after the list": tail(', "loss_mask": "bit31"'),
        "pad_id after the list": tail(', "pad_id": 0'),
        "unknown key after the list": tail(', "zz": 1'),
        "shards repeated": tail(', "shards": []'),
        "mode repeated in the head": lambda t: t.replace('"mode": "concat",', '"mode": "concat", "mode": "docs",'),
        "shard_table repeated in the head": lambda t: t.replace('"shard_table": {', '"shard_table": null, "shard_table": {'),
        "NaN in stats": lambda t: t.replace('"stats": {', '"stats": {"x": NaN, '),
        "Infinity as seq_len": lambda t: t.replace('"seq_len": 32', '"seq_len": Infinity'),
        "41-digit number": lambda t: t.replace('"stats": {', '"stats": {"x": ' + "9" * 41 + ", "),
        "nested 100,000 deep": lambda t: t.replace('"stats": {', '"deep": ' + "[" * 100000 + "]" * 100000 + ', "stats": {'),
        "100 KB of spaces before the list": lambda t: t.replace('"shards": [', " " * 100000 + '"shards": ['),
        "100 KB string in the head": lambda t: t.replace('"stats": {', '"stats": {"x": "' + "y" * 100000 + '", '),
        "'shards' inside a string": lambda t: t.replace('"stats": {', '"stats": {"x": "\\"shards\\": [", '),
        "'shards' as a nested key": lambda t: t.replace('"stats": {', '"stats": {"shards": [], '),
        "shards a number, list under another key": lambda t: t.replace('"shards": [', '"shards": 5, "zz": ['),
        "UTF-8 BOM": lambda t: "\ufeff" + t,
        "not UTF-8 in the head": lambda t: t.replace('"stats": {', '"stats": {"x": "\udcff", '),
        "cut inside the head": lambda t: t[:300],
        "keys sorted (shards not last)": reorder(lambda o: dict(sorted(o.items()))),
        "shard_table after the list": reorder(move_after("shard_table")),
        "tokenizer after the list": reorder(move_after("tokenizer")),
        "list: one tokens changed": one_row("tokens", 33),
        "list: one samples changed": one_row("samples", 1),
        "list: a shard dropped": reorder(lambda o: {**o, "shards": o["shards"][:-1]}),
        "list: provenance added": reorder(lambda o: {**o, "shards": [
            {**s, "provenance": "x.prov", "provenance_sha256": "00" * 32} for s in o["shards"]]}),  # fmt: skip
        "list: an unknown shard key": reorder(lambda o: {**o, "shards": [{**o["shards"][0], "zz": 1}, *o["shards"][1:]]}),
    }  # fmt: skip


def head_edits(work: Path, scale: float) -> Iterator[Attempt]:
    """index.json edited as text (the table untouched): keys repeated or moved after the
    list, strict-JSON breakers in the head, ``shards`` hidden in strings, the list made to
    disagree with the table; small (parsed whole) and large (head only)."""
    small, want = clean_dataset(work)
    large, want_large = large_dataset(work)
    for j, (src, clean) in enumerate(((Path(small), want), (large, want_large))):
        for k, (label, edit) in enumerate(_text_edits().items()):
            dst = _copy(src, work / f"thead-{j}-{k}")
            text = edit((dst / "index.json").read_text())
            (dst / "index.json").write_bytes(text.encode("utf-8", "surrogateescape"))
            yield from _both(dst, clean, f"{'large' if j else 'small'}: {label}")
    for j, (src, clean) in enumerate(((Path(small), want), (large, want_large))):
        for kind in ("fifo", "dir", "devzero", "uncommitted"):
            k_dst = _copy(src, work / f"tspecial-{j}-{kind}")
            (k_dst / TABLE).unlink()
            if kind == "fifo":
                os.mkfifo(k_dst / TABLE)
            elif kind == "dir":
                (k_dst / TABLE).mkdir()
            elif kind == "devzero":
                (k_dst / TABLE).symlink_to("/dev/zero")
            else:  # the JSON alone commits to nothing, a table lies there
                shutil.copyfile(src / TABLE, k_dst / TABLE)
                obj = json.loads((k_dst / "index.json").read_text())
                del obj["shard_table"]
                (k_dst / "index.json").write_text(json.dumps(obj, indent=1) + "\n")
            yield from _both(k_dst, clean, f"{'large' if j else 'small'}: table {kind}")


def cache_tables(work: Path, scale: float) -> Iterator[Attempt]:
    """A remote (HTTP) dataset read with a ``cache_dir``: the node cache's
    ``tables/SHA.shards`` and ``objects/SHA256`` (sidecars) replaced by garbage, cut, another
    dataset's table, a FIFO, a directory; then 4 processes opening one cold cache at once; and
    without a cache_dir, a table cut, removed or another dataset's, committed to."""
    file_server, _ = test_servers()
    small, want = clean_dataset(work)
    large, want_large = large_dataset(work)
    damages = ("garbage", "cut", "other", "fifo", "dir", "empty")
    for src, clean, other in ((Path(small), want, large), (large, want_large, Path(small))):
        for where in ("tables", "objects"):
            for damage in damages:

                def attempt(src: Path = src, clean: np.ndarray = clean, other: Path = other,
                            where: str = where, damage: str = damage) -> str:  # fmt: skip
                    with file_server(src) as server, tempfile.TemporaryDirectory() as cache:
                        read_rows(server.base_url, cache_dir=cache)  # fills the cache
                        files = sorted(p for p in (Path(cache) / where).iterdir()
                                       if p.suffix not in (".lock", ".tmp"))  # fmt: skip
                        victim = files[len(files) // 2]
                        _damage(victim, damage, other)
                        out = compare(lambda: read_rows(server.base_url, cache_dir=cache), clean)
                        return labelled(f"{where}/ {damage}", out)

                yield attempt

        def crowd(src: Path = src, clean: np.ndarray = clean) -> str:
            import multiprocessing as mp

            with file_server(src) as server, tempfile.TemporaryDirectory() as cache:
                ctx = mp.get_context("fork")
                with ctx.Pool(4) as pool:
                    outs = pool.map(_crowd_read, [(server.base_url, cache, clean)] * 4)
            bad = [o for o in outs if o != "handled"]
            return bad[0] if bad else "handled"

        yield crowd

    for k, label in enumerate(("cut, committed", "removed", "another dataset's, committed")):
        dst = _copy(large, work / f"tremote-{k}")  # read over HTTP without a cache_dir
        if k == 0:
            commit(dst, (large / TABLE).read_bytes()[:-8])
        elif k == 1:
            (dst / TABLE).unlink()
        else:
            commit(dst, (Path(small) / TABLE).read_bytes())

        def remote(dst: Path = dst, label: str = label) -> str:
            with file_server(dst) as server:
                out = compare(lambda: read_rows(server.base_url), want_large)
            return labelled(f"no cache_dir: table {label}", out)

        yield remote


def _crowd_read(args: tuple[str, str, np.ndarray]) -> str:
    url, cache, clean = args
    try:
        return compare(lambda: read_rows(url, cache_dir=cache), clean)
    except Exception as exc:  # noqa: BLE001 - classified
        return f"crash: {type(exc).__name__}: {exc}"[:300]


def _damage(victim: Path, damage: str, other: Path) -> None:
    size = victim.stat().st_size
    if damage == "garbage":
        victim.write_bytes(os.urandom(size))
        return
    if damage == "cut":
        victim.write_bytes(victim.read_bytes()[: size // 2])
        return
    if damage == "empty":
        victim.write_bytes(b"")
        return
    victim.unlink()
    if damage == "other":
        shutil.copyfile(
            other / (TABLE if victim.suffix == ".shards" else "data-000000.idx"), victim
        )
    elif damage == "fifo":
        os.mkfifo(victim)
    else:
        victim.mkdir()


def worker_remap(work: Path, scale: float) -> Iterator[Attempt]:
    """A Loader of 2 spawned workers (the table is pickled by path and mapped again in
    each) after index.shards was replaced by a table of the same size: two listed names
    swapped, CRC32C valid. The workers must refuse it, or read the rows the parent checked."""
    large, want_large = large_dataset(work)
    src = listed_dataset(work, large)
    read = dict(num_workers=2, multiprocessing_context="spawn")

    def attempt() -> str:
        from faultlib.common import READ
        from wdstream import Loader

        dst = _copy(src, work / "tremap")
        loader = Loader(str(dst), **{**READ, **read})
        rows = listed_rows(dst)
        rows[0], rows[3] = {**rows[0], "name": rows[3]["name"], "sidecar": rows[3]["sidecar"],
                            "sha256": rows[3]["sha256"], "sidecar_sha256": rows[3]["sidecar_sha256"]}, \
            {**rows[3], "name": rows[0]["name"], "sidecar": rows[0]["sidecar"],
             "sha256": rows[0]["sha256"], "sidecar_sha256": rows[0]["sidecar_sha256"]}  # fmt: skip
        forged = encode_table(rows, listed=True)
        assert len(forged) == (dst / TABLE).stat().st_size
        tmp = dst / "forged.tmp"
        tmp.write_bytes(forged)
        os.replace(tmp, dst / TABLE)

        def epoch() -> np.ndarray:
            out = [np.concatenate([b["input_ids"], b["labels"][:, -1:]], axis=1) for b in loader]
            return np.concatenate(out)

        return compare(epoch, want_large)

    yield attempt
