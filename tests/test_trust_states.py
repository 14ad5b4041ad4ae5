"""Issue 33 items 7 and 8: states that claim an older form, and mixture specs that name
nothing or read nothing.

Item 7. A state vouches for itself with ``check``, and every field it carries must be
covered: a global state whose ``skips`` were edited and whose check was cut back to the
placing fields alone (the form before skips were sealed) used to load, and ``data_step``
moved by the edit; a mixture state had no check at all. The oracle is the uninterrupted
run, and the states travel as JSON files, loaded by another process.

Item 8. A source named ``''`` and a weight of 0 or ``-0.0`` in static weights were accepted
silently; they are refused naming the source, by the Loader and by ``wdstream explain`` run
as a process, while a 0 inside a schedule piece stays legal.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cli_server import run_cli
from tests.script_server import run_python
from wdstream import Loader
from wdstream.read.order.global_seal import SEALED, seal
from wdstream.testing import write_synthetic_dataset

OPTS: dict[str, Any] = dict(seq_len=16, shuffle_window=12, shuffle_lanes=2, seed=5)
W = {"a": 0.5, "b": 0.5}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("states")
    write_synthetic_dataset(str(root / "a"), n_docs=30, sample_tokens=33, samples_per_shard=9)
    write_synthetic_dataset(str(root / "b"), n_docs=20, sample_tokens=17, samples_per_shard=5,
                            seed=1)  # fmt: skip
    return {"a": str(root / "a"), "b": str(root / "b")}


def _ids(loader: Loader, n: int) -> list[list[list[int]]]:
    return [b["input_ids"].tolist() for b in itertools.islice(loader, n)]


def _run(source: Any, weights: Any = None) -> tuple[dict[str, Any], list, list]:
    """A run of 4 batches, 2 steps skipped, 2 more: its state (through JSON), and the
    uninterrupted run's next 3 batches and data steps of training steps 0..8."""
    kw = dict(batch_size=4, num_workers=0, **OPTS, **({"weights": weights} if weights else {}))
    loader = Loader(source, **kw)  # type: ignore[arg-type]
    _ids(loader, 4)
    loader.skip_steps(2)
    _ids(loader, 2)
    state = json.loads(json.dumps(loader.state_dict()))
    return state, _ids(loader, 3), [loader.data_step(t) for t in range(9)]


_RESUME = """
import json, sys, itertools
from wdstream import Loader
source, weights, path = json.loads(sys.argv[1])
kw = dict(batch_size=4, num_workers=0, seq_len=16, shuffle_window=12, shuffle_lanes=2, seed=5)
if weights:
    kw["weights"] = weights
results = []
for state in json.loads(open(path).read()):
    loader = Loader(source, **kw)
    try:
        loader.load_state_dict(state)
    except Exception as exc:
        results.append({"error": type(exc).__name__ + ": " + str(exc)})
        continue
    ids = [b["input_ids"].tolist() for b in itertools.islice(loader, 3)]
    results.append({"ids": ids, "steps": [loader.data_step(t) for t in range(9)]})
print(json.dumps(results))
"""


def _resume_all(
    tmp_path: Path, source: Any, weights: Any, states: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Load each of ``states`` (written to a JSON file) into a new Loader of one process of
    its own, which made no Loader before: its error or next batches, in order. One process
    for all (not one each), a Loader built anew for every state; forked from
    :mod:`tests.script_server`'s server, which imported the Loader's modules and torch
    (~2.5 s of CPU a fresh process spent on them)."""
    path = tmp_path / "states.json"
    path.write_text(json.dumps(states))
    args = json.dumps([source, weights, str(path)])
    res = run_python("-c", _RESUME, args, preload=("wdstream.read.torch.loader",), timeout=300)
    assert res.returncode == 0, res.stderr
    results: list[dict[str, Any]] = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(results) == len(states)
    return results


def test_a_global_state_cut_back_to_an_older_check_is_refused(
    data: dict[str, str], tmp_path: Path
) -> None:
    state, after, steps = _run(data["a"])
    older = [  # skips kept, or edited, under the older check
        {**state, "skips": skips, "check": seal(state, SEALED)}
        for skips in ([[4, 2]], [[4, 3]], [[3, 2]])
    ]
    removed = {k: v for k, v in state.items() if k != "skips"}  # skips and their tag gone
    removed["check"] = state["check"][: 8 * len(SEALED)]
    legacy = {**state, "check": _legacy_check(state)}  # saved before the form was in the key
    bare = {k: v for k, v in state.items() if k not in ("check", "skips")}
    got = _resume_all(tmp_path, data["a"], None, [state, *older, removed, legacy, bare])
    assert got[0] == {"ids": after, "steps": steps}  # intact: the uninterrupted run
    for refused in got[1:4]:
        assert refused["error"].startswith(
            "StateMismatchError: skips: is not covered by the state's check"
        )
    assert got[4]["error"].startswith(
        "StateMismatchError: skips: missing: the state's check was made"
    )
    assert got[5] == {"ids": after, "steps": steps}
    # "saved before issue 23", but named by content
    assert got[6]["error"].startswith("StateMismatchError: check: missing")


def _legacy_check(state: dict[str, Any]) -> str:
    """The check a global state with skips got before its form was part of the key."""
    from wdstream.read.order.global_seal import sealed_fields
    from wdstream.read.order.state_fields import cursor_seal

    config, fields = sealed_fields(state)
    return cursor_seal(config, 0, fields, tuple(fields))


def test_a_mixture_state_vouches_for_every_field(data: dict[str, str], tmp_path: Path) -> None:
    state, after, steps = _run(data, W)
    assert len(state["check"]) == 8 * 7  # six placing fields and skips
    edits: list[tuple[dict[str, Any], str]] = [
        ({"skips": [[4, 3]]}, "skips: differs from the value the state's check was made with"),
        ({"skips": [[3, 2]]}, "skips: differs from the value"),
        ({"step": state["step"] + 1}, "step: differs from the value"),
        ({"quarantined": 2}, "quarantined: is not covered by the state's check"),
        ({"check": state["check"][:48]}, "skips: is not covered by the state's check"),
        ({"check": state["check"][:40]}, "check: a string of 56 hex digits expected"),
    ]
    removed = {k: v for k, v in state.items() if k != "skips"}
    removed["check"] = state["check"][:48]
    unsealed = {k: v for k, v in state.items() if k != "check"}
    edited = [{**state, **edit} for edit, _ in edits]
    got = _resume_all(tmp_path, data, W, [state, *edited, removed, unsealed])
    assert got[0] == {"ids": after, "steps": steps}
    for (edit, message), refused in zip(edits, got[1 : 1 + len(edits)], strict=True):
        assert refused["error"] == f"StateMismatchError: {refused['error'].split(': ', 1)[1]}"
        assert message in refused["error"], (edit, refused)
    assert got[-2]["error"].startswith(
        "StateMismatchError: skips: missing: the state's check was made"
    )
    assert got[-1]["error"].startswith(
        "StateMismatchError: check: missing: a mixture state carrying skips"
    )


def test_a_mixture_state_without_check_is_refused_unless_sealed_by_hand(
    data: dict[str, str], tmp_path: Path
) -> None:
    """Without ``check`` a state saved before sealing cannot be told from one whose skips and
    check were removed: refused; sealing it explicitly (the opt-in) resumes it exactly."""
    from wdstream.read.mixture.seal import mixture_seal

    loader = Loader(data, batch_size=4, num_workers=0, weights=W, **OPTS)
    _ids(loader, 3)
    state = {k: v for k, v in loader.state_dict().items() if k != "check"}
    bare, sealed = _resume_all(tmp_path, data, W, [state, {**state, "check": mixture_seal(state)}])
    assert bare["error"].startswith("StateMismatchError: check: missing: a mixture state carries")
    assert sealed["ids"] == _ids(loader, 3)


def _spec(tmp_path: Path, body: dict[str, Any]) -> Path:
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(body))
    return path


@pytest.mark.parametrize(
    ("sources", "weights", "message"),
    [
        ({"": "a", "b": "b"}, {"": 1, "b": 1}, "source 0 is named ''"),
        ({" ": "a", "b": "b"}, {" ": 1, "b": 1}, "source 0 is named ' '"),
        ({"a": "a", "b": "b"}, {"a": 0, "b": 1}, "source 'a' has weight 0: a static mixture"),
        ({"a": "a", "b": "b"}, {"a": 1, "b": -0.0}, "source 'b' has weight -0.0"),
        ({"a": "a", "b": "b"}, {"a": 0.0, "b": 1}, "source 'a' has weight 0.0"),
    ],
)
def test_static_specs_that_read_nothing_are_refused(
    data: dict[str, str], tmp_path: Path, sources: dict, weights: dict, message: str
) -> None:
    resolved = {k: data[v] for k, v in sources.items()}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Loader(resolved, weights=weights, batch_size=4, **OPTS)
    spec = _spec(tmp_path, {"sources": resolved, "weights": weights})
    with pytest.raises(ValueError, match=rf"mix.json: .*{message}"):
        Loader(str(spec), batch_size=4, **OPTS)
    res = run_cli("explain", str(spec), "--step", "0", "--batch-size", "4", "--seq-len", "16",
                  timeout=300)  # fmt: skip
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert message in res.stderr + res.stdout


def test_a_zero_weight_inside_a_schedule_piece_stays_legal(data: dict[str, str]) -> None:
    pieces = [(0, {"a": 1, "b": 0}), (3, {"a": 1, "b": 1})]
    loader = Loader(data, weights=pieces, batch_size=4, num_workers=0, **OPTS)
    sources = [b["source"].tolist() for b in itertools.islice(loader, 5)]
    assert all(s == 0 for batch in sources[:3] for s in batch)
    assert any(s == 1 for batch in sources[3:] for s in batch)
    assert np.array_equal(np.unique(sum(sources, [])), [0, 1])
