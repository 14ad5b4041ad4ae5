"""Order identity (issue 25, item 4): a global-order or mixture state names the order version
and fingerprints its next step's rows; a state of another version or order is refused, one
without these fields (saved before them) still loads, and the fingerprint is pinned."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest

from wdstream import Loader, StateMismatchError
from wdstream.read.order import global_sequence
from wdstream.read.order.global_order import ORDER_VERSION
from wdstream.testing import write_synthetic_dataset

GLOBAL: dict[str, Any] = dict(seq_len=32, batch_size=2, order="global", num_workers=0, seed=3)
MIX: dict[str, Any] = dict(seq_len=16, shuffle_window=12, shuffle_lanes=2, seed=5, batch_size=4,
                           num_workers=0, weights={"a": 0.5, "b": 0.5})  # fmt: skip

# The fingerprints of this fixed synthetic data at step 5 (global) and step 3 (mixture): a
# change to which rows a step reads must change these and bump the order version.
PINNED_GLOBAL = "e83f672a39c27525"
PINNED_MIXTURE = "55be151a288ce3ef"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ident")
    write_synthetic_dataset(str(root / "a"), n_docs=30, sample_tokens=33, samples_per_shard=9)
    write_synthetic_dataset(
        str(root / "b"), n_docs=20, sample_tokens=17, samples_per_shard=5, seed=1
    )
    return {"a": str(root / "a"), "b": str(root / "b")}


def _state_after(loader: Loader, n: int) -> dict[str, Any]:
    for _ in itertools.islice(loader, n):
        pass
    return json.loads(json.dumps(loader.state_dict()))


def _global(data: dict[str, str], **kw: Any) -> Loader:
    return Loader(data["a"], **{**GLOBAL, **kw})


def _mixture(data: dict[str, str]) -> Loader:
    return Loader({"a": data["a"], "b": data["b"]}, **MIX)


def test_global_fingerprint_is_pinned(data: dict[str, str]) -> None:
    state = _state_after(_global(data), 5)
    assert state["order_version"] == ORDER_VERSION == 1
    assert state["next_rows"] == PINNED_GLOBAL


def test_mixture_fingerprint_is_pinned(data: dict[str, str]) -> None:
    state = _state_after(_mixture(data), 3)
    assert state["order_version"] == [1, 1]
    assert state["next_rows"] == PINNED_MIXTURE


@pytest.mark.parametrize("kind", ["global", "mixture"])
def test_other_order_version_is_refused_naming_both(data: dict[str, str], kind: str) -> None:
    make = (lambda: _global(data)) if kind == "global" else (lambda: _mixture(data))
    state = _state_after(make(), 3)
    state["order_version"] = 7 if kind == "global" else [7, 1]
    both = r"version 7, .* version 1:" if kind == "global" else r"\[7, 1\], .* \[1, 1\]:"
    with pytest.raises(StateMismatchError, match=rf"order_version: .*{both}"):
        make().load_state_dict(state)


@pytest.mark.parametrize("kind", ["global", "mixture"])
def test_changed_order_is_refused_naming_both_fingerprints(data: dict[str, str], kind: str) -> None:
    make = (lambda: _global(data)) if kind == "global" else (lambda: _mixture(data))
    state = _state_after(make(), 3)
    saved = state["next_rows"]
    state["next_rows"] = "0" * 16
    with pytest.raises(StateMismatchError, match=rf"order changed.*{'0' * 16}.*{saved}"):
        make().load_state_dict(state)


def test_changed_order_algorithm_is_refused(
    data: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state saved by this code, loaded by code whose rows of that step differ."""
    state = _state_after(_global(data), 5)
    monkeypatch.setattr(global_sequence, "rows_fingerprint", lambda ids: "f" * 16)
    with pytest.raises(StateMismatchError, match="next_rows: the order changed"):
        _global(data).load_state_dict(state)


@pytest.mark.parametrize("kind", ["global", "mixture"])
def test_states_without_identity_still_load(data: dict[str, str], kind: str) -> None:
    make = (lambda: _global(data)) if kind == "global" else (lambda: _mixture(data))
    full = _state_after(make(), 4)
    old = {k: v for k, v in copy.deepcopy(full).items() if k not in ("order_version", "next_rows")}
    a, b = make(), make()
    a.load_state_dict(full)
    b.load_state_dict(old)
    for x, y in zip(itertools.islice(a, 3), itertools.islice(b, 3), strict=True):
        assert all((x[k] == y[k]).all() for k in x)


def test_identity_survives_a_change_of_global_batch(data: dict[str, str]) -> None:
    state = _state_after(_global(data), 5)
    other = _global(data, batch_size=4)
    other.load_state_dict(state)  # the fingerprint is checked under the saved global batch
    again = _global(data, batch_size=4)
    again.load_state_dict(json.loads(json.dumps(other.state_dict())))
