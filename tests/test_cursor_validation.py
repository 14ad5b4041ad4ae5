"""Broken or hostile reader states: an exact resume or a StateMismatchError, nothing else.

The property: take a real state mid-epoch, change any one field at any nesting (any JSON
value, a near miss of the saved integer, a huge or negative one), delete it, or add an
unknown key. Loading it and reading on must either give exactly the batches an intact
restore gives, or raise :class:`StateMismatchError`; never another exception, never other
batches. The configurations are those where the state holds enough to tell (see
``docs/READER.md``, "Checks on load"): several streams, or one stream with finite epochs.
"""

from __future__ import annotations

import copy
import gzip
import itertools
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wdstream import Loader, StateMismatchError, TokenDataset
from wdstream.read.order.state_fields import cursor_seal
from wdstream.read.order.text_streams import TEXT_CURSOR_KEYS
from wdstream.testing import write_synthetic_dataset

# The per-rank stream cursor (order="streams"); the global order's state: test_global_order.py.
KW = {"shuffle_window": 8, "shuffle_lanes": 3, "seed": 5, "order": "streams"}

# name: (dataset, reader, options, steps at which a state is taken)
CONFIGS: dict[str, tuple[str, str, dict[str, Any], tuple[int, ...]]] = {
    "concat-2streams-forever": ("concat", "loader", dict(streams=2, chunk_batches=2), (5, 12)),
    "docs-3streams-1epoch": ("docs", "loader", dict(streams=3, chunk_batches=3, epochs=1), (4, 8)),
    "concat-1stream-1epoch": ("concat", "loader", dict(streams=1, chunk_batches=2, epochs=1), (3,)),
    "docs-dataset-3streams": ("docs", "dataset", dict(streams=3), (7,)),
    "concat-2workers-4streams": (
        "concat", "loader", dict(streams=4, chunk_batches=2, num_workers=2,
                                 persistent_workers=True), (9,),
    ),
}  # fmt: skip
AFTER = 8  # batches compared after a restore in the endless configurations

Batch = bytes
Reader = Loader | TokenDataset


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    concat, docs = tmp_path_factory.mktemp("concat"), tmp_path_factory.mktemp("docs")
    write_synthetic_dataset(str(concat), n_docs=60, sample_tokens=17, samples_per_shard=6)
    write_synthetic_dataset(str(docs), n_docs=150, mode="docs", samples_per_shard=11)
    return {"concat": str(concat), "docs": str(docs)}


def _make(roots: dict[str, str], name: str) -> Reader:
    data, kind, opts, _ = CONFIGS[name]
    if kind == "dataset":
        return TokenDataset(roots[data], 25, 2, **KW, **opts)
    return Loader(roots[data], **{"seq_len": 30, "batch_size": 4, "num_workers": 0, **KW, **opts})


def _key(batch: dict) -> Batch:
    """A batch as bytes: equal bytes, equal batch."""
    return b"".join(batch[k].numpy().tobytes() for k in ("input_ids", "labels"))


def _take(reader: Reader, n: int) -> list[Batch]:
    """Up to ``n`` batches from a fresh ``iter()``."""
    return [_key(b) for b in itertools.islice(iter(reader), n)]


class _Case:
    """One configuration: the states a real run takes at its steps, the batches that follow
    each, and a reader that loads the edited states (reused, so every example also re-points
    a reader that already ran, persistent workers included)."""

    def __init__(self, roots: dict[str, str], name: str) -> None:
        steps = CONFIGS[name][3]
        self.endless = CONFIGS[name][2].get("epochs") is None
        ref = _make(roots, name)
        it = iter(ref)
        run: list[Batch] = []
        self.states = []
        for step in steps:
            run += [_key(b) for b in itertools.islice(it, step - len(run))]
            self.states.append(json.loads(json.dumps(ref.state_dict())))
        run += [_key(b) for b in itertools.islice(it, AFTER if self.endless else None)]
        self.want = [run[s : s + AFTER] if self.endless else run[s:] for s in steps]
        self.reader = _make(roots, name)

    def resume(self, state: Any, i: int) -> list[Batch]:
        """Batches after loading ``state``; for a finite run one more than state ``i`` has
        left, so an accepted state that runs too long shows."""
        self.reader.load_state_dict(state)
        return _take(self.reader, len(self.want[i]) + (0 if self.endless else 1))


_CASES: dict[str, _Case] = {}


def _case(roots: dict[str, str], name: str) -> _Case:
    if name not in _CASES:
        _CASES[name] = _Case(roots, name)
    return _CASES[name]


def _paths(value: Any, at: tuple = ()) -> Iterator[tuple]:
    """Every key / index path inside a JSON value."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for k, v in items:
        yield (*at, k)
        if isinstance(v, dict | list):
            yield from _paths(v, (*at, k))


def _get(state: Any, path: tuple) -> Any:
    for k in path:
        state = state[k]
    return state


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=4,
)
HUGE = st.sampled_from([2**63 - 1, 2**63, 2**70, -(2**63), -1])
# Near misses: a batch, a chunk (K is 1 to 3 here), a window or an epoch off.
DELTAS = (-3, -2, -1, 1, 2, 3)


def _edit(data: st.DataObject, state: dict) -> dict:
    """``state`` with one field replaced, deleted, or an unknown key added."""
    state = copy.deepcopy(state)
    path = data.draw(st.sampled_from(sorted(_paths(state), key=repr)), label="path")
    parent, key = _get(state, path[:-1]), path[-1]
    old = parent[key]
    op = data.draw(st.sampled_from(["replace", "huge", "delete", "add"]), label="op")
    if op == "delete":
        del parent[key]
    elif op == "add":
        target = old if isinstance(old, dict) else parent
        if isinstance(target, dict):
            target[data.draw(st.text(min_size=1, max_size=3), label="new key") + "_x"] = 0
        else:
            target.append(data.draw(JSON, label="extra item"))
    else:
        parent[key] = data.draw(HUGE if op == "huge" else JSON, label="value")
    return state


def _near_misses(state: dict) -> Iterator[dict]:
    """``state`` with one integer field off by each of ``DELTAS``: every one of them."""
    for path in sorted(_paths(state), key=repr):
        if type(_get(state, path)) is int:
            for delta in DELTAS:
                edited = copy.deepcopy(state)
                _get(edited, path[:-1])[path[-1]] += delta
                yield edited


def _resumes_exactly_or_is_refused(case: _Case, i: int, state: dict) -> None:
    try:
        got = case.resume(state, i)
    except StateMismatchError:
        return
    assert got == case.want[i], f"accepted a state that resumes elsewhere: {json.dumps(state)}"


IN_PROCESS = sorted(n for n in CONFIGS if "workers" not in n)


@pytest.mark.parametrize("name", IN_PROCESS)
def test_every_near_miss_resumes_exactly_or_is_refused(roots, name: str) -> None:
    """The likeliest corruption (an integer a little off) at every integer field."""
    case = _case(roots, name)
    for i, state in enumerate(case.states):
        for edited in _near_misses(state):
            _resumes_exactly_or_is_refused(case, i, edited)


@pytest.mark.parametrize("name", IN_PROCESS)
@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_edit_resumes_exactly_or_is_refused(roots, name: str, data) -> None:
    case = _case(roots, name)
    i = data.draw(st.integers(0, len(case.states) - 1), label="state")
    _resumes_exactly_or_is_refused(case, i, _edit(data, case.states[i]))


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_edit_with_two_workers(roots, data) -> None:
    """The same property through worker processes (persistent, re-pointed every example):
    one near miss and one arbitrary edit per example."""
    case = _case(roots, "concat-2workers-4streams")
    near = list(_near_misses(case.states[0]))
    _resumes_exactly_or_is_refused(case, 0, data.draw(st.sampled_from(near), label="near miss"))
    _resumes_exactly_or_is_refused(case, 0, _edit(data, case.states[0]))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_intact_states_resume_exactly(roots, name: str) -> None:
    """The property's other side: the very states it edits load and resume exactly."""
    case = _case(roots, name)
    for i, state in enumerate(case.states):
        assert case.resume(copy.deepcopy(state), i) == case.want[i]


# ---- the examples, each named in the message ------------------------------------
def _mid_state(roots: dict[str, str], **opts: Any) -> tuple[dict, Callable[[], Loader]]:
    def make() -> Loader:
        return Loader(roots["concat"], seq_len=30, batch_size=4, num_workers=0, **KW, **opts)

    loader = make()
    it = iter(loader)
    for _ in range(7):
        next(it)
    return json.loads(json.dumps(loader.state_dict())), make


@pytest.mark.parametrize(
    "path,value,message",
    [
        (
            ("streams", 0, "offset"),
            -1,
            r"streams\[0\]\.offset: must be in \[0, 2\*\*63\) \(got -1\)",
        ),
        (("streams", 0, "offset"), "+1", r"streams\[0\]\.offset: batch 4 of epoch 0 ends at"),
        (("streams", 1, "emitted"), 10**6, r"streams\[1\]\.emitted: batch 3 of epoch 0"),
        (("streams", 1, "window"), 10**6, r"streams\[1\]\.window"),
        (("streams", 1, "batches"), 10**6, r"streams\[1\]\.batches: epoch 0 has \d+ per stream"),
        (
            ("streams", 1, "batches"),
            True,
            r"streams\[1\]\.batches: an integer expected \(got True\)",
        ),
        (("streams", 1, "epoch"), 2**70, r"streams\[1\]\.epoch: must be in \[0, 2\*\*63\)"),
        (("streams", 1, "epoch"), 1, r"streams\[0\]\.epoch: streams served in turn"),
        (("streams", 0, "offset"), 1.0, r"streams\[0\]\.offset: an integer expected"),
        (("next_stream",), 2, r"next_stream: must be in \[0, 2\) \(got 2\)"),
        (("next_stream",), 0, r"streams\[1\]\.batches: streams served in turn"),
        (("iter_stop",), -1, r"iter_stop: must be in"),
        (("iter_stop",), 0, r"iter_stop: streams\[0\] is at batch 4 of epoch 0, past the stop"),
        (("iter_stop",), 3, r"iter_stop: more than epochs=1 after the streams' epoch 0"),
        (("chunk_left",), 2, r"chunk_left: streams\[1\] has 1 left \(got 2\)"),
        (("chunk_left",), 0, r"chunk_left: must be in \[1, 3\)"),
        (("worker",), [0, 3], r"worker\[1\]: must be in \[1, 3\) \(got 3\)"),
        (("worker",), [1, 2], r"worker: \[1, 2\] is one worker's share"),
        (("version",), 2, r"version: not a wdstream reader state of version 1 \(got 2\)"),
        (("version",), True, r"version: not a wdstream reader state of version 1 \(got True\)"),
        (("config", "seed"), 5.0, r"seed: saved 5\.0, now 5"),
        (("config", "shuffle"), 1, r"shuffle: saved 1, now True"),
        (("config", "streams"), 2**63 - 1, r"streams: saved 9223372036854775807, now 2\)"),
        (("streams",), {}, r"streams: a list of 2 cursors expected"),
        (("streams", 1), None, r"streams\[1\]: a dict expected \(got None\)"),
    ],
)
def test_hostile_field_is_named(roots, path: tuple, value: Any, message: str) -> None:
    state, make = _mid_state(roots, streams=2, chunk_batches=2, epochs=1)
    assert state["streams"][0]["batches"] == 4 and state["next_stream"] == 1  # as the cases say
    parent = _get(state, path[:-1])
    parent[path[-1]] = parent[path[-1]] + 1 if value == "+1" else value
    with pytest.raises(StateMismatchError, match=message):
        make().load_state_dict(state)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda s: s.pop("iter_stop"), r"^iter_stop: missing"),
        (lambda s: s["streams"][0].pop("offset"), r"^streams\[0\]\.offset: missing"),
        (lambda s: s["streams"][0].update(extra=1), r"^streams\[0\]\.extra: unknown key"),
        (lambda s: s.update(extra=[1]), r"^extra: unknown key"),
        (lambda s: s["config"].pop("seed"), r"^config\.seed: missing"),
        (lambda s: s["config"].update(lr=1e-3), r"^config\.lr: unknown key"),
        (lambda s: s["streams"].pop(), r"^streams: a list of 2 cursors expected"),
    ],
)
def test_missing_and_unknown_keys_are_named(roots, edit, message: str) -> None:
    state, make = _mid_state(roots, streams=2, chunk_batches=2)
    edit(state)
    with pytest.raises(StateMismatchError, match=message):
        make().load_state_dict(state)
    with pytest.raises(StateMismatchError, match=message):
        TokenDataset(roots["concat"], 30, 4, streams=2, chunk_batches=2, **KW).load_state_dict(
            state
        )


def test_not_a_state(roots) -> None:
    _, make = _mid_state(roots)
    for bad, message in [([], r"^state: a dict expected"), ({}, r"^version: not a wdstream")]:
        with pytest.raises(StateMismatchError, match=message):
            make().load_state_dict(bad)


# ---- another worker count ---------------------------------------------------------------
def test_other_num_workers_says_how_to_resume(roots) -> None:
    opts = dict(seq_len=30, batch_size=4, epochs=1, **KW)
    saved = Loader(roots["concat"], num_workers=2, **opts)
    it = iter(saved)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(saved.state_dict()))
    want = [_key(b) for b in it]
    hint = (
        r"saved with streams=2 \(the default for num_workers=2\); this reader has streams=1\. "
        r"To resume it, pass streams=2 to Loader \(then any num_workers in 0, 1, 2 gives the "
        r"same batches\), or keep num_workers=2"
    )
    with pytest.raises(StateMismatchError, match=hint):
        Loader(roots["concat"], num_workers=0, **opts).load_state_dict(state)
    # ... and following the advice resumes exactly, in process and with one worker
    for workers in (0, 1):
        again = Loader(roots["concat"], num_workers=workers, streams=2, **opts)
        again.load_state_dict(state)
        assert [_key(b) for b in again] == want


# ---- raw text: the fields the file split adds ---------------------------------------------
@pytest.fixture(scope="module")
def text_files(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("text")
    rng = random.Random(3)
    words = "alpha beta gamma delta shard token stream cursor resume".split()
    for i in range(4):
        lines = [
            json.dumps(
                {"text": f"doc {i}.{j}: " + " ".join(rng.choices(words, k=rng.randint(1, 30)))}
            )
            for j in range(30)
        ]
        raw = ("\n".join(lines) + "\n").encode()
        (d / f"p-{i}.jsonl").write_bytes(raw)
        (d / f"p-{i}.jsonl.gz").write_bytes(gzip.compress(raw))
    return str(d)


def _text_state(text_files: str, suffix: str, **opts: Any) -> tuple[dict, list[Batch], Callable]:
    def make() -> Loader:
        return Loader(f"{text_files}/p-{{0..3}}.{suffix}", tokenizer="cl100k_base", seq_len=16,
                      batch_size=2, num_workers=0, streams=2, chunk_batches=3, shuffle_window=5,
                      seed=1, **opts)  # fmt: skip

    loader = make()
    it = iter(loader)
    for _ in range(11):  # stream 1 inside its second window, which starts mid-file
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["streams"][1]["byte"] > 0 and state["streams"][1]["batches"] > 0
    return state, [_key(next(it)) for _ in range(6)], make


@pytest.mark.parametrize(
    "field,value,message,at_load",
    [
        ("file", 2, r"streams\[1\]\.file: epoch 0 gives it 2 files \(got 2\)", True),
        ("record", True, r"streams\[1\]\.record: an integer expected", True),
        ("window", -1, r"streams\[1\]\.window: must be in", True),
        ("byte", "+1", r"streams\[1\]\.byte: .*p-\d\.jsonl: reading there fails", False),
        ("byte", 10**9, r"streams\[1\]\.byte: .*p-\d\.jsonl: no document starts there", False),
        ("emitted", 10**6, r"streams\[1\]\.emitted: its window holds 5 documents", False),
        ("offset", 10**6, r"streams\[1\]\.offset: that document has \d+ tokens", False),
    ],
)
def test_text_cursor_fields(text_files: str, field: str, value: Any, message: str, at_load: bool):
    state, want, make = _text_state(text_files, "jsonl")
    intact = make()
    intact.load_state_dict(copy.deepcopy(state))
    assert _take(intact, len(want)) == want
    c = state["streams"][1]
    c[field] = c[field] + 1 if value == "+1" else value
    if type(c[field]) is int and c[field] >= 0:
        # Raw-text cursors are sealed (issue 23): the edit alone is refused naming the
        # field; the checks below the seal are tested on a state whose check is forged.
        with pytest.raises(StateMismatchError, match=rf"streams\[1\]\.{field}: differs"):
            make().load_state_dict(copy.deepcopy(state))
        _forge_checks(state)
    loader = make()
    if at_load:
        with pytest.raises(StateMismatchError, match=message):
            loader.load_state_dict(state)
        return
    loader.load_state_dict(state)  # checked when the window is re-read
    with pytest.raises(StateMismatchError, match=message):
        _take(loader, 1)


def _forge_checks(state: dict) -> None:
    """Recompute every cursor's check after an edit, as a forger would (issue 23)."""
    for t, c in enumerate(state["streams"]):
        c["check"] = cursor_seal(state["config"], t, c, TEXT_CURSOR_KEYS)


def test_text_batches_past_the_cap(text_files: str) -> None:
    state, _, make = _text_state(text_files, "jsonl", batches_per_epoch=20)
    state["streams"][0]["batches"] = 10
    _forge_checks(state)
    with pytest.raises(
        StateMismatchError, match=r"streams\[0\]\.batches: batches_per_epoch gives 10"
    ):
        make().load_state_dict(state)


def test_text_byte_past_a_compressed_file(text_files: str) -> None:
    state, _, make = _text_state(text_files, "jsonl.gz")
    state["streams"][1]["byte"] = 10**7
    _forge_checks(state)
    loader = make()
    loader.load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"streams\[1\]\.byte: .*shorter than the saved"):
        _take(loader, 1)
