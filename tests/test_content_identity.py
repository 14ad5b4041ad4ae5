"""A state names its dataset by content: the same shards however they are opened resume
exactly; changed data is refused by name (the key, the shard); old path-named states load
only when opened as they were saved.

The oracle of every resume is the uninterrupted run over the dataset root. The data: 12
shards of 6 samples of 17 tokens (token t is the integer t), and variants of it built from
the real shard writer: one shard spliced in from a pack of the same tokens with other
document boundaries, that whole pack (a re-pack), a pack at another ``seq_len``, the index
naming another tokenizer.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.servers import FileServer
from wdstream import Loader, StateMismatchError
from wdstream.read.batches.buckets import BucketedBatches
from wdstream.storage import open_store
from wdstream.testing import rewrite_index, write_synthetic_dataset

pytest_plugins = ["tests.fixtures_remote"]

KW: dict[str, Any] = dict(seq_len=16, batch_size=3, num_workers=0, seed=4, shuffle_window=8,
                          shuffle_lanes=2)  # fmt: skip
SAVED_AT, AFTER = 3, 6  # the state is taken after 3 steps; 6 steps are compared after it
SHARDS = 12


def _names(root: Path, ids: list[int]) -> list[str]:
    return [str(root / f"data-{i:06d}.tar") for i in ids]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The dataset and its variants (see the module docstring)."""
    base = tmp_path_factory.mktemp("identity")
    d = {k: base / k for k in ("root", "repack", "seq32", "copy", "changed", "tokenizer", "bare")}
    write_synthetic_dataset(str(d["root"]), doc_lens=[40] * 30, sample_tokens=17,
                            samples_per_shard=6)  # fmt: skip
    write_synthetic_dataset(str(d["repack"]), doc_lens=[20] * 60, sample_tokens=17,
                            samples_per_shard=6)  # fmt: skip
    write_synthetic_dataset(str(d["seq32"]), doc_lens=[40] * 30, sample_tokens=33,
                            samples_per_shard=3)  # fmt: skip
    for k in ("copy", "changed", "tokenizer", "bare"):
        shutil.copytree(d["root"], d[k])
    # One shard of another pack of the same tokens (other document boundaries), with its
    # index entry: a dataset whose shard 2 changed and whose index vouches for it.
    for ext in ("tar", "idx"):
        shutil.copy(d["repack"] / f"data-000002.{ext}", d["changed"] / f"data-000002.{ext}")
    _edit_index(
        d["changed"], lambda ix: ix["shards"].__setitem__(2, _index(d["repack"])["shards"][2])
    )
    _edit_index(
        d["tokenizer"], lambda ix: ix["tokenizer"].update(name="other", ranks_sha256="ab" * 32)
    )
    (d["bare"] / "index.json").unlink()  # shards read by their sidecars alone
    return d


def _index(root: Path) -> dict[str, Any]:
    return json.loads((root / "index.json").read_text())


def _edit_index(root: Path, edit: Any) -> None:
    index = _index(root)
    edit(index)
    index["stats"]["documents"] = sum(s["documents"] for s in index["shards"])
    rewrite_index(str(root), index)  # index.json and its shard table agree


def _batches(loader: Loader, n: int) -> list[dict[str, torch.Tensor]]:
    return list(itertools.islice(loader, n))


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        assert all(torch.equal(x[k], y[k]) for k in x)


def _saved(source: Any, **kw: Any) -> tuple[dict[str, Any], list[dict[str, torch.Tensor]]]:
    """The state after SAVED_AT steps of an uninterrupted run over ``source`` (through
    JSON, as a checkpoint carries it) and the run's next AFTER batches."""
    loader = Loader(source, **{**KW, **kw})
    it = iter(loader)
    for _ in range(SAVED_AT):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    return state, [next(it) for _ in range(AFTER)]


def _refusal(source: Any, state: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(StateMismatchError) as info:
        Loader(source, **{**KW, **kw}).load_state_dict(state)
    return str(info.value)


def _upload(local: Path, url: str) -> None:
    store = open_store(url)
    for p in sorted(local.iterdir()):
        store.write_bytes(p.name, p.read_bytes())


@pytest.mark.parametrize("order", ["global", "streams"])
def test_the_same_shards_however_opened_resume_exactly(
    data: dict[str, Path], s3_bucket: str, order: str
) -> None:
    root = data["root"]
    state, want = _saved(str(root), order=order)
    assert len(json.dumps(state["config"]["dataset"])) < 300  # a few hashes, any shard count
    s3 = f"s3://{s3_bucket}/mirror/ds"
    _upload(data["copy"], s3)
    with FileServer(data["copy"]) as http:
        openings = {
            "glob": str(root / "*.tar"),
            "brace": str(root / f"data-{{000000..{SHARDS - 1:06d}}}.tar"),
            "list": _names(root, list(range(SHARDS))),
            "copy": str(data["copy"]),
            "http": http.base_url,
            "s3": s3,
        }
        for how, source in openings.items():
            fresh = Loader(source, **KW, order=order)
            assert fresh.state_dict()["config"]["dataset"] == state["config"]["dataset"], how
            fresh.load_state_dict(state)
            _same(_batches(fresh, AFTER), want)
        # And the other way round: a state saved over HTTP resumes from a glob of the copy.
        state_http, want_http = _saved(http.base_url, order=order)
    assert state_http == state
    glob = Loader(str(data["copy"] / "*.tar"), **KW, order=order)
    glob.load_state_dict(state_http)
    _same(_batches(glob, AFTER), want_http)


def test_shards_without_an_index_resume_by_their_sidecars(
    data: dict[str, Path], tmp_path: Path
) -> None:
    state, want = _saved(str(data["bare"] / "*.tar"))
    mirror = tmp_path / "mirror"
    shutil.copytree(data["bare"], mirror)
    fresh = Loader(_names(mirror, list(range(SHARDS))), **KW)
    fresh.load_state_dict(state)
    _same(_batches(fresh, AFTER), want)
    # The same shards with their index.json mean more (tokenizer, ids): another dataset.
    assert "kind" in _refusal(str(data["root"]), state)
    # A sidecar that changed (another pack's shard 2) is named.
    for ext in ("tar", "idx"):
        shutil.copy(data["repack"] / f"data-000002.{ext}", mirror / f"data-000002.{ext}")
    message = _refusal(str(mirror / "*.tar"), state)
    assert f"shard 2 ({mirror / 'data-000002.tar'}) is not the saved dataset's shard 2" in message


def test_changed_data_is_refused_naming_what_differs(data: dict[str, Path]) -> None:
    root = data["root"]
    state, _ = _saved(str(root))
    cases = {
        "a changed shard": (
            str(data["changed"]),
            f"config.dataset: shard 2 ({data['changed'] / 'data-000002.tar'}) is not the saved "
            "dataset's shard 2",
        ),
        "a re-pack": (str(data["repack"]), "config.dataset: several of its 12 shards differ"),
        "another tokenizer": (
            str(data["tokenizer"]),
            "config.dataset: another dataset: its tokenizer differs from the saved one's",
        ),
        "another seq_len": (
            str(data["seq32"]),
            "config.dataset: another dataset: its seq_len, sample_tokens differ",
        ),
        "a shard added": (
            _names(root, list(range(SHARDS)) + [0]),
            f"the saved dataset has 12 shards, this one 13: shard 12 ({root / 'data-000000.tar'}) "
            "was added",
        ),
        "a shard removed": (
            _names(root, [i for i in range(SHARDS) if i != 5]),
            f"the saved dataset has 12 shards, this one 11: the saved dataset's shard 5 is not "
            f"here (it was after {root / 'data-000004.tar'} and before {root / 'data-000006.tar'})",
        ),
        "shards reordered": (
            _names(root, [1, 0, *range(2, SHARDS)]),
            "config.dataset: the same 12 shards in another order",
        ),
    }
    for what, (source, message) in cases.items():
        got = _refusal(source, state)
        assert message in got, (what, got)


def test_a_shard_added_to_a_subset_is_named(data: dict[str, Path]) -> None:
    root = data["root"]
    state, want = _saved(_names(root, [0, 1, 2, 3, 4]))
    message = _refusal(_names(root, [0, 1, 2, 9, 3, 4]), state)
    assert f"shard 3 ({root / 'data-000009.tar'}) was added" in message
    fresh = Loader(_names(data["copy"], [0, 1, 2, 3, 4]), **KW)  # the same five, elsewhere
    fresh.load_state_dict(state)
    _same(_batches(fresh, AFTER), want)


def _legacy_fingerprint(root: Path) -> str:
    """How states named a dataset root before content identity: 16 hex of SHA-256 over the
    repr of ``[[name, sha256], ...]`` of its index.json's shards (written out here, from the
    index itself, as the old reader computed it)."""
    ident = [[s["name"], s["sha256"]] for s in _index(root)["shards"]]
    return hashlib.sha256(repr(ident).encode()).hexdigest()[:16]


@pytest.mark.parametrize("order", ["global", "streams"])
def test_an_old_state_loads_only_when_opened_as_saved(data: dict[str, Path], order: str) -> None:
    root = data["root"]
    state, want = _saved(str(root), order=order)
    old = {**state, "config": {**state["config"], "dataset": _legacy_fingerprint(root)}}
    if order == "global":
        del old["check"]  # states of that time carried no check (it covers the config)
    fresh = Loader(str(root), **KW, order=order)
    fresh.load_state_dict(old)
    _same(_batches(fresh, AFTER), want)
    message = _refusal(str(root / "*.tar"), old, order=order)
    assert message.startswith("config.dataset: the state names its dataset the old way")
    assert "opened exactly as that run opened it" in message


def test_a_mixture_names_each_source_by_content(data: dict[str, Path]) -> None:
    mix = {"a": str(data["root"]), "b": str(data["seq32"])}
    weights = {"a": 0.6, "b": 0.4}
    state, want = _saved(mix, weights=weights)
    moved = {"a": str(data["copy"] / "*.tar"), "b": str(data["seq32"] / "*.tar")}
    fresh = Loader(moved, **KW, weights=weights)
    fresh.load_state_dict(state)
    _same(_batches(fresh, AFTER), want)
    message = _refusal({"a": str(data["changed"]), "b": mix["b"]}, state, weights=weights)
    assert message.startswith("config.sources[0][1] (source 'a'): shard 2 (")
    assert "is not the saved dataset's shard 2" in message


def test_raw_text_resumes_from_a_copy_and_names_a_changed_file(tmp_path: Path) -> None:
    lines = [json.dumps({"text": f"document {i} " + "word " * (i % 7 + 3)}) for i in range(60)]
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    for f in range(3):
        (a / f"part-{f}.jsonl").write_text("\n".join(lines[f * 20 : (f + 1) * 20]) + "\n")
    shutil.copytree(a, b)
    text = dict(tokenizer="cl100k_base", streams=2, chunk_batches=2)
    state, want = _saved(str(a / "*.jsonl"), **text)
    fresh = Loader(str(b / "*.jsonl"), **KW, **text)
    fresh.load_state_dict(state)
    _same(_batches(fresh, AFTER), want)
    with (b / "part-1.jsonl").open("a") as f:
        f.write(json.dumps({"text": "one more"}) + "\n")
    message = _refusal(str(b / "*.jsonl"), state, **text)
    assert f"file 1 ({b / 'part-1.jsonl'}) is not the saved dataset's file 1" in message


def test_a_malformed_dataset_field_is_refused_by_path(data: dict[str, Path]) -> None:
    state, _ = _saved(str(data["root"]))
    dataset = state["config"]["dataset"]
    for key, value, why in [
        ("digest", "x" * 16, r"config.dataset.digest: a string of 16 hex digits"),
        ("shards", -1, r"config.dataset.shards: a shard count expected"),
        ("slices", dataset["slices"][:-8], r"config.dataset.slices: a string of"),
        ("extra", 1, r"config.dataset.extra: unknown key"),
    ]:
        bad = {**state, "config": {**state["config"], "dataset": {**dataset, key: value}}}
        with pytest.raises(StateMismatchError, match=why):
            Loader(str(data["root"]), **KW).load_state_dict(bad)
    bad = {**state, "config": {**state["config"], "dataset": [1, 2]}}
    with pytest.raises(StateMismatchError, match=r"config.dataset: a dataset identity"):
        Loader(str(data["root"]), **KW).load_state_dict(bad)


def test_bucketed_batches_resume_from_a_glob(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    write_synthetic_dataset(str(root), n_docs=40, mode="docs", samples_per_shard=7)
    opts: dict[str, Any] = dict(seq_len=64, max_tokens=256, seed=3, pool=8)
    ref = BucketedBatches(str(root), **opts)
    it = iter(ref)
    for _ in range(SAVED_AT):
        next(it)
    state = json.loads(json.dumps(ref.state_dict()))
    want = [next(it) for _ in range(AFTER)]
    fresh = BucketedBatches(str(root / "*.tar"), **opts)
    fresh.load_state_dict(state)
    _same(list(itertools.islice(iter(fresh), AFTER)), want)
    with pytest.raises(StateMismatchError, match=r"config.dataset: .* shard 4 is not here"):
        BucketedBatches(_names(root, [0, 1, 2, 3, 5]), **opts).load_state_dict(state)
