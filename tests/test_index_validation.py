"""``DatasetIndex.from_json`` refuses every inconsistent ``index.json``, naming file and key.

Edits are made to the real ``index.json`` of a real (synthetic) dataset; the hypothesis test
mutates any one value of it and requires either an ``IndexValidationError`` naming that key
or an index that still describes the dataset (``wdstream verify`` then finds any change to
what is on disk).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wdstream import Loader
from wdstream.errors import IndexValidationError
from wdstream.format.index import DatasetIndex
from wdstream.inspect import verify_dataset
from wdstream.testing import write_synthetic_dataset

WHERE = "data/index.json"
# 55 tokens in samples of 9: shards of 2, 2, 2 and 1 samples (18, 18, 18, 1 tokens).
DOC_LENS = [5, 17, 3, 9, 11, 2, 8]

Edit = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def concat_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("concat")
    write_synthetic_dataset(str(root), doc_lens=DOC_LENS, sample_tokens=9, samples_per_shard=2)
    return root


@pytest.fixture(scope="module")
def docs_v1_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    write_synthetic_dataset(
        str(root), doc_lens=DOC_LENS, mode="docs", dtype="uint16", samples_per_shard=3, version=1
    )
    return root


def _index(root: Path) -> dict[str, Any]:
    return json.loads((root / "index.json").read_text())


def _refusal(obj: dict[str, Any] | str) -> str:
    text = obj if isinstance(obj, str) else json.dumps(obj)
    with pytest.raises(IndexValidationError) as info:
        DatasetIndex.from_json(text, WHERE)
    return str(info.value)


def _set(path: str, value: Any) -> Edit:
    """An edit setting ``a.b[2].c`` style ``path`` to ``value``."""

    def edit(obj: dict[str, Any]) -> None:
        *parents, last = _steps(path)
        for step in parents:
            obj = obj[step]
        obj[last] = value

    return edit


def _steps(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for part in path.split("."):
        name, *indexes = part.split("[")
        steps += [name] + [int(i.rstrip("]")) for i in indexes]
    return steps


def _swap(obj: dict[str, Any]) -> None:
    obj["shards"][1], obj["shards"][2] = obj["shards"][2], obj["shards"][1]


def _duplicate(obj: dict[str, Any]) -> None:
    obj["shards"].insert(2, copy.deepcopy(obj["shards"][1]))


def _unset(key: str) -> Edit:
    return lambda obj: obj.pop(key)


def _also(*edits: Edit) -> Edit:
    def edit(obj: dict[str, Any]) -> None:
        for e in edits:
            e(obj)

    return edit


# (edit, the message after "data/index.json: "): the edits of issue 8 first.
EDITS: dict[str, tuple[Edit, str]] = {
    "tokens -1": (
        _set("shards[1].tokens", -1),
        "shards[1].tokens: expected an integer >= 0 and < 2**48, got -1",
    ),
    "tokens reduced": (
        _set("shards[1].tokens", 17),
        "shards[1].tokens: expected shards[1].samples x sample_tokens = 2 x 9 = 18, got 17",
    ),
    "last shard tokens past its samples": (
        _set("shards[3].tokens", 10),
        "shards[3].tokens: expected 1..9 in the last shard (shards[3].samples x sample_tokens = "
        "1 x 9, its last sample possibly short), got 10",
    ),
    "samples 0": (
        _set("shards[1].samples", 0),
        "shards[1].samples: expected an integer >= 1 and < 2**48, got 0",
    ),
    "samples -5": (
        _set("shards[1].samples", -5),
        "shards[1].samples: expected an integer >= 1 and < 2**48, got -5",
    ),
    "samples raised": (
        _set("shards[1].samples", 3),
        "shards[1].bytes: expected >= 4096 for shards[1].samples = 3 samples holding "
        "shards[1].tokens = 18 tokens of dtype 'uint32' (headers, data, end marker), got 3072",
    ),
    "duplicate entry": (
        _duplicate,
        "shards[2].name: 'data-000001.tar' is listed twice (also shards[1].name)",
    ),
    "swapped entries": (
        _swap,
        "shards[1].name: expected 'data-000001.tar' (NAME-NNNNNN.tar shards are numbered by "
        "their position, NAME as in shards[0].name), got 'data-000002.tar'",
    ),
    "swapped sidecars": (
        _also(
            _set("shards[1].sidecar", "data-000002.idx"),
            _set("shards[2].sidecar", "data-000001.idx"),
        ),
        "shards[1].sidecar: expected 'data-000001.idx' (the sidecar of shards[1].name), "
        "got 'data-000002.idx'",
    ),
    "duplicate sidecar": (
        _set("shards[2].sidecar", "data-000001.idx"),
        "shards[2].sidecar: 'data-000001.idx' is listed twice (also shards[1].sidecar)",
    ),
    "spliced prefix": (
        _also(
            _set("shards[2].name", "other-000002.tar"),
            _set("shards[2].sidecar", "other-000002.idx"),
        ),
        "shards[2].name: expected 'data-000002.tar' (NAME-NNNNNN.tar shards are numbered by "
        "their position, NAME as in shards[0].name), got 'other-000002.tar'",
    ),
    "no shards key": (_unset("shards"), "shards: missing (expected a list of at least 1 items)"),
    "no shards": (_set("shards", []), "shards: expected a list of at least 1 items, got []"),
    "shard not an object": (_set("shards[2]", 7), "shards[2]: expected an object, got 7"),
    "shard without sha256": (
        lambda o: o["shards"][0].pop("sha256"),
        "shards[0].sha256: missing (expected 64 lowercase hex digits (a sha256))",
    ),
    "tokens 10**30": (
        _set("shards[0].tokens", 10**30),
        "shards[0].tokens: expected an integer >= 0 and < 2**48, got " + str(10**30),
    ),
    "sample_tokens 10**30": (
        _set("sample_tokens", 10**30),
        "sample_tokens: expected null or an integer >= 2 and < 2**31, got "
        "1000000000000000000000000000000",
    ),
    "tokens true": (
        _set("shards[0].tokens", True),
        "shards[0].tokens: expected an integer >= 0 and < 2**48, got True",
    ),
    "tokens float": (
        _set("shards[0].tokens", 18.0),
        "shards[0].tokens: expected an integer >= 0 and < 2**48, got 18.0",
    ),
    "tokens string": (
        _set("shards[0].tokens", "18"),
        "shards[0].tokens: expected an integer >= 0 and < 2**48, got '18'",
    ),
    "bytes not a tar size": (
        _set("shards[0].bytes", 3000),
        "shards[0].bytes: expected a multiple of 512 >= 1024 and < 2**48 (a tar's size), got 3000",
    ),
    "documents past tokens": (
        _set("shards[3].documents", 2),
        "shards[3].documents: expected <= shards[3].tokens = 1 (every document has a token), got 2",
    ),
    "sha256 not hex": (
        _set("shards[0].sha256", "ab" * 31 + "zz"),
        "shards[0].sha256: expected 64 lowercase hex digits (a sha256), got '" + "ab" * 31 + "zz'",
    ),
    "dtype unknown": (_set("dtype", "int8"), "dtype: expected 'uint16' or 'uint32', got 'int8'"),
    "mode unknown": (
        _set("mode", "rows"),
        "mode: expected 'concat' or 'docs' or 'bestfit', got 'rows'",
    ),
    "mode docs with sample_tokens": (
        _set("mode", "docs"),
        "sample_tokens: expected null when mode is 'docs', got 9",
    ),
    "sample_tokens not seq_len + 1": (
        _set("seq_len", 9),
        "sample_tokens: expected seq_len + 1 = 10 when mode is 'concat', got 9",
    ),
    "concat without seq_len": (
        _set("seq_len", None),
        "seq_len: expected an integer when mode is 'concat', got null",
    ),
    "n_vocab past uint16": (
        _also(_set("dtype", "uint16"), _set("tokenizer.n_vocab", 70000)),
        "tokenizer.n_vocab: expected <= 65536 (ids that fit dtype 'uint16'), got 70000",
    ),
    "eos past the vocabulary": (
        _set("eos_id", 56),
        "eos_id: expected an id below tokenizer.n_vocab = 56, got 56",
    ),
    "bos past the dtype": (
        _set("bos_id", 2**32),
        "bos_id: expected null or an integer >= 0 and < 2**32, got 4294967296",
    ),
    "tokenizer without n_vocab": (
        lambda o: o["tokenizer"].pop("n_vocab"),
        "tokenizer.n_vocab: missing (expected an integer >= 1 and < 2**32)",
    ),
    "no checksum in v2": (
        _unset("checksum"),
        "checksum: expected 'crc32c' in a version 2 index, it is missing",
    ),
    "checksum in v1": (
        _set("version", 1),
        "checksum: expected none in a version 1 index, got 'crc32c'",
    ),
    "version true": (
        _set("version", True),
        "version: format version True, this wdstream reads versions 1, 2",
    ),
    "not wdstream": (
        _set("format", "mds"),
        "not a wdstream index (format: expected 'wdstream', got 'mds')",
    ),
    "stats documents": (
        _set("stats.documents", 8),
        "stats.documents: expected the sum of shards[*].documents = 7, got 8",
    ),
    "stats location": (
        _set("stats.skipped_locations", ["a:1: bad", 3]),
        "stats.skipped_locations[1]: expected a string, got 3",
    ),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_each_edit_is_refused_naming_file_and_key(concat_root: Path, case: str) -> None:
    edit, message = EDITS[case]
    obj = _index(concat_root)
    edit(obj)
    got = _refusal(obj)
    assert got.startswith(f"{WHERE}: {message}"), got


# (raw text substitution in the real index.json, message after "data/index.json: ")
TEXT_EDITS = {
    "NaN": ('"tokens": 18', '"tokens": NaN', "shards[0].tokens: expected a finite number"),
    "Infinity": ('"tokens": 18', '"tokens": -Infinity', "shards[0].tokens: expected a finite"),
    "1e999": ('"tokens": 18', '"tokens": 1e999', "shards[0].tokens: expected a finite number"),
    "5000 digits": (
        '"tokens": 18',
        '"tokens": ' + "9" * 5000,
        "shards[0].tokens: expected a finite number of at most 40 characters, got '999",
    ),
    "duplicate key": (
        '"tokens": 18',
        '"tokens": 18, "tokens": 17',
        "shards[0].tokens: key appears more than once",
    ),
    "lone surrogate": (
        '"name": "synthetic"',
        '"name": "\\ud800"',
        "tokenizer.name: expected a Unicode string of 1 to 4096 characters, got '\\ud800'",
    ),
    "very deep nesting": (
        '"stats": {',
        '"stats": {"x": ' + "[" * 10**5 + "]" * 10**5 + ",",
        "not valid JSON (nested too deeply)",
    ),
    "not JSON": ('"shards": [', '"shards": [[', "not valid JSON (Expecting"),
}


@pytest.mark.parametrize("case", list(TEXT_EDITS))
def test_json_that_python_accepts_is_refused(concat_root: Path, case: str) -> None:
    old, new, message = TEXT_EDITS[case]
    text = (concat_root / "index.json").read_text()
    assert old in text
    got = _refusal(text.replace(old, new, 1))
    assert got.startswith(f"{WHERE}: {message}"), got


def test_bytes_that_are_not_utf8_are_refused() -> None:
    with pytest.raises(IndexValidationError, match=f"^{WHERE}: not valid JSON \\("):
        DatasetIndex.from_json(b"\xff\xfe\x00", WHERE)


BAD_NAMES = {
    "../../other/data-000006.tar": "a '.' or '..' path component",
    "sub/../data-000001.tar": "a '.' or '..' path component",
    "./data-000001.tar": "a '.' or '..' path component",
    "/etc/data-000001.tar": "an absolute path",
    "s3://bucket/data-000001.tar": "':' (a URL scheme or a drive)",
    "C:data-000001.tar": "':' (a URL scheme or a drive)",
    "~/data-000001.tar": "'~' (a home directory)",
    "sub\\data-000001.tar": "a backslash",
    "sub//data-000001.tar": "an empty path component",
    "data-000001.tar\x00.txt": "a control character",
    "data-\ud800.tar": "a lone surrogate, not Unicode",
    "": "empty",
    "x" * 252 + ".tar": "longer than 255 bytes",
}


@pytest.mark.parametrize("name", list(BAD_NAMES))
@pytest.mark.parametrize("key", ["name", "sidecar"])
def test_names_that_leave_the_root_are_refused(concat_root: Path, name: str, key: str) -> None:
    obj = _index(concat_root)
    value = name if key == "name" else name.replace(".tar", ".idx")
    obj["shards"][1][key] = value
    suffix = ".tar" if key == "name" else ".idx"
    assert _refusal(obj) == (
        f"{WHERE}: shards[1].{key}: expected a plain relative name inside the dataset root "
        f"ending in {suffix!r}, got {value!r} ({BAD_NAMES[name]})"
    )


def _safe_name(name: str) -> bool:
    """The name rule of docs/FORMAT.md, written out independently of the implementation."""
    parts = name.split("/")
    return (
        name.endswith(".tar")
        and len(name.encode("utf-8", "surrogatepass")) <= 255
        and not any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) < 0xE000 for c in name)
        and not any(c in name for c in "\\:")
        and not name.startswith(("/", "~"))
        and all(part not in ("", ".", "..") for part in parts)
    )


@settings(max_examples=500, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    stem=st.text(alphabet="./\\:~ab_ \x00\x7f\u00e9\ud800", max_size=12)
    | st.integers(245, 256).map(lambda n: "a" * n)  # around 255 bytes
    | st.integers(123, 128).map(lambda n: "\u00e9" * n)  # 2 bytes a character
)
def test_a_name_is_accepted_exactly_when_it_is_safe(concat_root: Path, stem: str) -> None:
    obj = _index(concat_root)
    obj["shards"][0]["name"] = name = stem + ".tar"
    try:
        DatasetIndex.from_json(json.dumps(obj), WHERE)
    except IndexValidationError as exc:
        assert str(exc).startswith(f"{WHERE}: shards[0].name: expected a plain relative name")
        assert not _safe_name(name), str(exc)
    else:
        assert _safe_name(name)


def test_names_in_subfolders_and_other_tools_names_are_accepted(concat_root: Path) -> None:
    obj = _index(concat_root)
    for i, shard in enumerate(obj["shards"]):
        shard["name"], shard["sidecar"] = f"train/part_{i}.tar", f"train/part_{i}.idx"
    index = DatasetIndex.from_json(json.dumps(obj), WHERE)
    assert [s.name for s in index.shards] == [f"train/part_{i}.tar" for i in range(4)]


def test_unknown_keys_are_allowed_and_dropped(concat_root: Path) -> None:
    obj = _index(concat_root)
    obj["created_by"] = "a newer wdstream"
    obj["shards"][0]["language"] = "en"
    index = DatasetIndex.from_json(json.dumps(obj), WHERE)
    assert index == DatasetIndex.from_json((concat_root / "index.json").read_text())


def _outside_copy(root: Path, tmp_path: Path, name: str) -> Path:
    """A copy of ``root`` whose shard 1 is ``name``: a byte-identical copy outside it."""
    data = tmp_path / "data"
    shutil.copytree(root, data)
    shutil.copytree(root, tmp_path / "other")
    obj = _index(data)
    obj["shards"][1]["name"] = name
    obj["shards"][1]["sidecar"] = name.replace(".tar", ".idx")
    (data / "index.json").write_text(json.dumps(obj))
    return data


@pytest.mark.parametrize("outside", ["../other/data-000001.tar", "{tmp}/other/data-000001.tar"])
def test_a_shard_outside_the_root_is_never_read(
    concat_root: Path, tmp_path: Path, outside: str
) -> None:
    name = outside.format(tmp=tmp_path)
    data = _outside_copy(concat_root, tmp_path, name)
    why = "an absolute path" if name.startswith("/") else "a '.' or '..' path component"
    want = (
        f"{data}/index.json: shards[1].name: expected a plain relative name inside the dataset "
        f"root ending in '.tar', got {name!r} ({why})"
    )
    with pytest.raises(IndexValidationError) as info:
        next(iter(Loader(str(data), seq_len=8, batch_size=2, num_workers=0, epochs=1)))
    assert str(info.value) == want
    report = verify_dataset(str(data))
    assert not report.ok and report.problems == [want]


def test_loader_refuses_an_edited_index(concat_root: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(concat_root, data)
    obj = _index(data)
    obj["shards"][1]["tokens"] = 17
    (data / "index.json").write_text(json.dumps(obj))
    with pytest.raises(IndexValidationError, match=r"shards\[1\]\.tokens: expected shards"):
        next(iter(Loader(str(data), seq_len=8, batch_size=2, num_workers=0, epochs=1)))


# -- any one value mutated --------------------------------------------------------------------

DELETE = object()
# Keys that describe the dataset without deciding what is read: a change to them that the
# index accepts is a different description, not a different dataset.
DESCRIPTIVE = ("tokenizer", "eos_id", "bos_id", "stats", "seq_len")


def _paths(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every key path in a JSON value (the root excluded)."""
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    found = []
    for key, item in items:
        found.append(path + (key,))
        found += _paths(item, path + (key,))
    return found


def _path_text(path: tuple[str | int, ...]) -> str:
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [s for item in items for s in _strings(item)]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


def _near(old: Any, original: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values close to ``old``: the ones a validation is most likely to let through."""
    if type(old) is int:
        return st.sampled_from([old - 1, old + 1, old + 512, -old, 2 * old, 0, 1, 2**48])
    if isinstance(old, str):
        return st.sampled_from(_strings(original)) | st.sampled_from(
            ["../" + old, "/" + old, old.upper(), old + "x", "", old.replace("0", "1", 1)]
        )
    return st.just(old)


def _check_one_mutation(root: Path, path: tuple[str | int, ...], new: Any) -> None:
    """The property: refused naming the key, or an index that still describes the dataset."""
    original = _index(root)
    mutated = copy.deepcopy(original)
    parent = mutated
    for step in path[:-1]:
        parent = parent[step]
    named = path
    if new is DELETE:
        del parent[path[-1]]
        named = path[:-1] if isinstance(path[-1], int) else path  # later items moved up
    else:
        parent[path[-1]] = new
    try:
        index = DatasetIndex.from_json(json.dumps(mutated), WHERE)
    except IndexValidationError as exc:
        message, key = str(exc), _path_text(named)
        assert message.startswith(f"{WHERE}: "), message
        # A rule over every shard names them all: shards[*].documents.
        assert key in message or re.sub(r"\[\d+\]", "[*]", key) in message, message
        return
    assert DatasetIndex.from_json(index.to_json(), WHERE) == index
    if index == DatasetIndex.from_json(json.dumps(original)) or path[0] in DESCRIPTIVE:
        return
    if new is DELETE and path == ("shards", len(original["shards"]) - 1):
        # The one edit nothing can see: dropping a last shard that starts no document
        # leaves a shorter, consistent dataset (index.json records no total but documents).
        assert original["shards"][-1]["documents"] == 0
        return
    # The index now says something else about the shards: verify must find out.
    saved = (root / "index.json").read_text()
    (root / "index.json").write_text(json.dumps(mutated))
    try:
        report = verify_dataset(str(root))
    finally:
        (root / "index.json").write_text(saved)
    assert not report.ok, (path, new)


@pytest.mark.parametrize("dataset", ["concat_root", "docs_v1_root"])
def test_deleting_any_key_is_refused_or_harmless(
    dataset: str, request: pytest.FixtureRequest
) -> None:
    root: Path = request.getfixturevalue(dataset)
    for path in _paths(_index(root)):
        _check_one_mutation(root, path, DELETE)


@pytest.mark.parametrize("dataset", ["concat_root", "docs_v1_root"])
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_one_value_mutated_is_refused_naming_it_or_still_consistent(
    dataset: str, request: pytest.FixtureRequest, data: st.DataObject
) -> None:
    root: Path = request.getfixturevalue(dataset)
    original = _index(root)
    path = data.draw(st.sampled_from(_paths(original)), label="path")
    old: Any = original
    for step in path:
        old = old[step]
    new = data.draw(st.just(DELETE) | JSON_VALUES | _near(old, original), label="new")
    _check_one_mutation(root, path, new)
