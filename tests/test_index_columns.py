"""The fast path of ``index.json`` (shard columns, json's own integers, lazy entries) agrees
with the rules as written, shard by shard.

The oracle is the slow path itself, forced: ``shard_columns`` returning None sends every
shard through the per-shard rules of ``index_rules``/``index_checks``, and
``_parse_clean`` returning None sends the text through the strict parse. For any edit of a
real index, both paths must refuse it with the same message or accept it as the same
index; ``tests/test_index_validation.py`` pins the messages themselves.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wdstream.errors import IndexValidationError
from wdstream.format import index as index_module
from wdstream.format import index_checks, index_columns
from wdstream.format.index import DatasetIndex, ShardEntry, ShardTable
from wdstream.testing import write_synthetic_dataset

WHERE = "d/index.json"
SHA = "ab" * 32


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real index of 6 concat shards (3 samples of 9 tokens each but the last)."""
    root = tmp_path_factory.mktemp("cols")
    write_synthetic_dataset(str(root), n_docs=30, sample_tokens=9, samples_per_shard=3)
    obj: dict[str, Any] = json.loads((root / "index.json").read_text())
    obj["shards"] = obj["shards"][:6]
    obj["shards"][-1]["tokens"] = obj["shards"][-1]["samples"] * 9  # a full last shard
    obj["stats"].pop("documents", None)  # the cut changed the sum
    return obj


def _with_provenance(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for s in out["shards"]:
        s["provenance"], s["provenance_sha256"] = s["name"][:-4] + ".prov", SHA
    return out


def _outcome(text: str, slow: bool, monkeypatch: pytest.MonkeyPatch) -> str | DatasetIndex:
    """The index, or the refusal's message, by the fast path or (``slow``) the rules alone."""
    with monkeypatch.context() as m:
        if slow:
            m.setattr(index_checks, "shard_columns", lambda shards: None)
            m.setattr(index_module, "_parse_clean", lambda text, where: None)
        try:
            return DatasetIndex.from_json(text, WHERE)
        except IndexValidationError as exc:
            return str(exc)


def _agree(obj: dict[str, Any] | str, monkeypatch: pytest.MonkeyPatch) -> str | DatasetIndex:
    text = obj if isinstance(obj, str) else json.dumps(obj)
    fast, slow = _outcome(text, False, monkeypatch), _outcome(text, True, monkeypatch)
    assert fast == slow
    if isinstance(fast, DatasetIndex):  # the entries too, field by field
        assert [vars(e) for e in fast.shards] == [vars(e) for e in slow.shards]  # type: ignore[union-attr]
    return fast


def test_a_packed_index_takes_the_fast_path(
    base: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for obj in (base, _with_provenance(base)):
        columns = index_checks.validate_index(copy.deepcopy(obj), WHERE)
        assert columns is not None and columns.known_keys_only
        assert isinstance(_agree(obj, monkeypatch), DatasetIndex)


# Values the columns must refuse exactly where a rule does, or pass exactly where all do.
TRICKY: list[Any] = [
    None, True, False, 0, 1, -1, 7, 1.0, 512, 1024, 9216, 2**48 - 1, 2**48, 2**63, 10**45,
    "", "x", "data-000001.tar", "data-000001.idx", "data-000001.prov", "d/data-000001.tar",
    "./data-000001.tar", "../data-000001.tar", "a\nb.tar", "data-000001.tar\n", ".tar",
    "x" * 251 + ".tar", "x" * 252 + ".tar", "dätä-000001.tar", "data 000001.tar",
    SHA, SHA.upper(), SHA[:-1], SHA + "0", " " + SHA[1:], SHA[:32] + "\n" + SHA[33:],
    "ab" * 31 + "zz", [], {}, ["x"],
    "x.tar\ny.tar", "x.idx\ny.idx", "x.prov\ny.prov",  # two plain names in one value
]  # fmt: skip
KEYS = ("name", "sidecar", "samples", "tokens", "documents", "bytes", "sha256",
        "sidecar_sha256", "provenance", "provenance_sha256", "later_key")  # fmt: skip


@pytest.mark.parametrize("provenance", [False, True])
def test_every_tricky_value_in_every_key_gives_the_rules_answer(
    base: dict[str, Any], monkeypatch: pytest.MonkeyPatch, provenance: bool
) -> None:
    for key in KEYS:
        for value in [*TRICKY, "removed"]:
            obj = _with_provenance(base) if provenance else copy.deepcopy(base)
            if value == "removed":
                obj["shards"][2].pop(key, None)
            else:
                obj["shards"][2][key] = value
            _agree(obj, monkeypatch)


@settings(max_examples=250, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_shard_value_set_or_removed_gives_the_rules_answer(
    base: dict[str, Any], monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    obj = copy.deepcopy(data.draw(st.sampled_from([base, _with_provenance(base)]), "dataset"))
    for _ in range(data.draw(st.integers(1, 2), "edits")):
        shard = obj["shards"][data.draw(st.integers(0, len(obj["shards"]) - 1), "shard")]
        key = data.draw(st.sampled_from(KEYS), "key")
        if data.draw(st.booleans(), "remove"):
            shard.pop(key, None)
        else:
            shard[key] = data.draw(st.sampled_from(TRICKY), "value")
    _agree(obj, monkeypatch)


def _swap(obj: dict[str, Any]) -> None:
    s = obj["shards"]
    s[1], s[2] = s[2], s[1]


def _rename(obj: dict[str, Any]) -> None:
    for s in obj["shards"]:  # every shard under another prefix: still the packer's order
        s["name"], s["sidecar"] = "x-" + s["name"], "x-" + s["sidecar"]


def _set_all(key: str, value: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    def edit(obj: dict[str, Any]) -> None:
        for s in obj["shards"]:
            s[key] = value(s)

    return edit


EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "swap": _swap,
    "duplicate": lambda o: o["shards"].insert(2, copy.deepcopy(o["shards"][1])),
    "drop first": lambda o: o["shards"].pop(0),
    "renamed": _rename,
    "other names": _set_all("name", lambda s: s["name"].replace("data-", "web_")),
    "subfolder": _set_all("name", lambda s: "sub/" + s["name"]),
    "non-ASCII names": _set_all("name", lambda s: s["name"].replace("data", "dätä")),
    "last short": lambda o: o["shards"][-1].update(tokens=o["shards"][-1]["tokens"] - 1),
    "last a sample short": lambda o: o["shards"][-1].update(tokens=o["shards"][-1]["tokens"] - 9),
    "middle short": lambda o: o["shards"][2].update(tokens=o["shards"][2]["tokens"] - 1),
    "docs mode": lambda o: o.update(mode="docs", sample_tokens=None),
    "bestfit": lambda o: o.update(mode="bestfit", pad_id=o["eos_id"]),
    "uint16": lambda o: o.update(dtype="uint16"),
    "stats documents": lambda o: o["stats"].update(documents=5),
    "stats huge int": lambda o: o["stats"].update(input_bytes=10**41),
    "stats float": lambda o: o["stats"].update(input_bytes=1.5),
    "unknown stats key": lambda o: o["stats"].update(later={"n": [1, 2.5]}),
    "later key in a shard": lambda o: o["shards"][3].update(later=1),
    "tokenizer later key": lambda o: o["tokenizer"].update(later=10**50),
    "no shards": lambda o: o.update(shards=[]),
    "shard not a dict": lambda o: o["shards"].insert(1, ["x"]),
}


@pytest.mark.parametrize("case", list(EDITS))
@pytest.mark.parametrize("provenance", [False, True])
def test_each_edit_gives_the_rules_answer(
    base: dict[str, Any], monkeypatch: pytest.MonkeyPatch, case: str, provenance: bool
) -> None:
    obj = _with_provenance(base) if provenance else copy.deepcopy(base)
    EDITS[case](obj)
    _agree(obj, monkeypatch)


# (old, new, refused): the strict parse refuses numbers of more than 40 characters.
TEXT_EDITS = {
    "duplicate key": ('"tokens": 27', '"tokens": 27, "tokens": 26', True),
    "long integer in a shard": ('"tokens": 27', '"tokens": ' + "1" * 41, True),
    "long integer elsewhere": ('"shards": [', '"x": ' + "1" * 41 + ', "shards": [', True),
    "negative 41 characters": ('"shards": [', '"x": [-' + "1" * 40 + '], "shards": [', True),
    "negative 40 characters": ('"shards": [', '"x": {"y": -' + "1" * 39 + '}, "shards": [', False),
    "40 digits": ('"shards": [', '"x": ' + "9" * 40 + ', "shards": [', False),
    "NaN": ('"tokens": 27', '"tokens": NaN', True),
    "long float": ('"shards": [', '"x": 1.' + "0" * 45 + ', "shards": [', True),
    "not JSON": ('"shards": [', '"shards": [[', True),
    # Repeated keys are told by counting colons (index._keys_unique): try to fool it.
    "duplicate nested key": ('"shards": [', '"x": {"a": 1, "a": 2}, "shards": [', True),
    "duplicate top key": ('"shards": [', '"shards": 1, "shards": [', True),
    "dropped value with a colon": ('"shards": [', '"x": "a:b", "x": "c", "shards": [', True),
    "kept value with a colon": ('"shards": [', '"x": "c", "x": "a:b", "shards": [', True),
    "escaped colon hides a key": ('"shards": [', '"x": 1, "x": "\\u003a", "shards": [', True),
    "escaped colon": ('"shards": [', '"x": "\\u003A", "shards": [', False),
    "colons in keys and values": ('"shards": [', '"x": {"k:1": ["a:b", "::"]}, "shards": [', False),
}


@pytest.mark.parametrize("case", list(TEXT_EDITS))
def test_json_edits_give_the_strict_parse_answer(
    base: dict[str, Any], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    old, new, refused = TEXT_EDITS[case]
    text = json.dumps(base)
    assert old in text
    got = _agree(text.replace(old, new, 1), monkeypatch)
    assert isinstance(got, str) == refused, got


def _pack_order_oracle(names: list[str]) -> bool:
    prefix = names[0][: -len("-000000.tar")]
    return (
        names[0].endswith("-000000.tar")
        and len(prefix) > 0
        and names == [f"{prefix}-{i:06d}.tar" for i in range(len(names))]
    )


@given(
    prefix=st.text("ab-/.%0\u00e9", min_size=1, max_size=4),
    n=st.sampled_from([1, 2, 5, 63, 64, 65, 100]),
    edit=st.sampled_from(["none", "swap", "digit", "letter", "prefix", "width", "drop"]),
    at=st.integers(0, 99),
)
@settings(max_examples=300, deadline=None)
def test_pack_order_is_told_as_the_packer_names(prefix: str, n: int, edit: str, at: int) -> None:
    """``_packer_names`` (a byte matrix when the names are ASCII and of one width) agrees
    with the names built one by one, for the packer's names and each kind of edit."""
    names = [f"{prefix}-{i:06d}.tar" for i in range(n)]
    at %= n
    if edit == "swap" and n > 1:
        names[at], names[(at + 1) % n] = names[(at + 1) % n], names[at]
    elif edit == "digit":
        names[at] = names[at][:-5] + "9.tar"
    elif edit == "letter":
        names[at] = names[at][:-6] + "a" + names[at][-5:]
    elif edit == "prefix":
        names[at] = "b" + names[at][1:]
    elif edit == "width":
        names[at] = names[at][:-4] + "0.tar"
    elif edit == "drop" and n > 1:
        del names[at]
    joined = "\n".join(names) + "\n"
    assert index_columns._packer_names(names, joined) == _pack_order_oracle(names)


def test_a_clean_index_is_parsed_once_as_text_or_bytes(base: dict[str, Any]) -> None:
    """The clean parse accepts a packed index (str, and UTF-8 bytes); UTF-16 bytes and a
    repeated key, however hidden, go to the strict parse."""
    text = json.dumps(base, indent=1)
    assert index_module._parse_clean(text, WHERE) is not None
    assert index_module._parse_clean(text.encode(), WHERE) is not None
    assert index_module._parse_clean(text.encode("utf-16"), WHERE) is None
    assert DatasetIndex.from_json(text.encode("utf-16")) == DatasetIndex.from_json(text)
    repeated = text.replace('"tokens": 27', '"tokens": 27, "tokens": 27', 1)
    assert repeated != text and index_module._parse_clean(repeated, WHERE) is None
    for data in (repeated, repeated.encode(), repeated.encode("utf-32")):
        with pytest.raises(IndexValidationError, match=r"tokens: key appears more than once"):
            DatasetIndex.from_json(data, WHERE)
    hidden = text.replace('"shards": [', '"x": 1, "x": "\\u003a", "shards": [', 1)
    assert hidden != text and index_module._parse_clean(hidden.encode(), WHERE) is None
    with pytest.raises(IndexValidationError, match=r": x: key appears more than once"):
        DatasetIndex.from_json(hidden.encode(), WHERE)


def test_the_table_behaves_as_the_tuple_of_entries(base: dict[str, Any]) -> None:
    index = DatasetIndex.from_json(json.dumps(_with_provenance(base)), WHERE)
    table = index.shards
    assert isinstance(table, ShardTable)
    entries = tuple(ShardEntry(**s) for s in _with_provenance(base)["shards"])
    assert table == entries and entries == table and tuple(table) == entries
    assert len(table) == 6 and table[2] == entries[2] and table[-1] == entries[-1]
    assert table[1:4] == entries[1:4] and isinstance(table[1:4], tuple)
    assert hash(table) == hash(entries)
    assert index.column("tokens") == [e.tokens for e in entries]
    assert index.total_tokens == sum(e.tokens for e in entries)
    # Written back byte for byte, as an index of entries made one by one.
    made = DatasetIndex(**{**vars(index), "shards": entries})
    assert made == index and made.to_json() == index.to_json()
    assert DatasetIndex.from_json(index.to_json(), WHERE) == index
