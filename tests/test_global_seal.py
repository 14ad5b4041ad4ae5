"""Global-order states vouch for their position (issue 23): an edit of a field that places
the state (``origin``, ``step``, the saved global batch, ``iter_stop``) is refused naming the
field, or lands in the uninterrupted run (the oracle, recorded once)."""

from __future__ import annotations

import copy
import hashlib
import json

import numpy as np
import pytest

from wdstream import Loader, StateMismatchError
from wdstream.testing import write_synthetic_dataset

FIELDS = [("config", "global_batch"), ("step",), ("origin", "step"), ("origin", "epoch"),
          ("origin", "row")]  # fmt: skip


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    root = str(tmp_path_factory.mktemp("seal") / "d")
    write_synthetic_dataset(root, n_docs=30, sample_tokens=33, samples_per_shard=9)

    def make() -> Loader:
        return Loader(root, seq_len=32, batch_size=2, order="global", num_workers=0, seed=3)

    loader = make()
    it = iter(loader)
    run = [next(it)["input_ids"].numpy().copy() for _ in range(3 * len(loader))]
    loader = make()
    it = iter(loader)
    for _ in range(5):
        next(it)
    return make, run, json.loads(json.dumps(loader.state_dict()))


def _lands(loader: Loader, run: list[np.ndarray]) -> bool:
    it = iter(loader)
    got = [next(it)["input_ids"].numpy() for _ in range(4)]
    return any(
        all(np.array_equal(g, run[k + j]) for j, g in enumerate(got)) for k in range(len(run) - 3)
    )


@pytest.mark.parametrize("path", FIELDS, ids=".".join)
def test_edits_of_placing_fields_are_refused_naming_them(setup: tuple, path: tuple) -> None:
    make, run, state = setup
    intact = make()
    intact.load_state_dict(copy.deepcopy(state))
    assert _lands(intact, run)
    for delta in (-2, -1, 1, 2):
        bad = copy.deepcopy(state)
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] += delta
        loader = make()
        try:
            loader.load_state_dict(bad)
        except StateMismatchError as exc:
            assert ".".join(path) in str(exc), str(exc)
            continue
        assert _lands(loader, run), (path, delta)


def test_a_state_without_check_loads_only_in_the_old_form(setup: tuple) -> None:
    """A state saved before issue 23 (no check; its dataset named by a 16-hex fingerprint
    of the root) still loads; a newer state whose check was removed claims that older form
    while naming its dataset by content, and is refused (issue 33 item 7)."""
    make, run, state = setup
    stripped = {k: v for k, v in state.items() if k != "check"}
    with pytest.raises(StateMismatchError, match="check: missing: a state that carries"):
        make().load_state_dict(stripped)
    root = make().dataset.source.urls[0][0]
    ident = [
        [s["name"], s["sha256"]] for s in json.loads(open(f"{root}/index.json").read())["shards"]
    ]
    legacy = hashlib.sha256(repr(ident).encode()).hexdigest()[:16]
    old = {k: v for k, v in stripped.items() if k not in ("order_version", "next_rows")}
    old["config"] = {**old["config"], "dataset": legacy}
    loader = make()
    loader.load_state_dict(old)
    assert _lands(loader, run)
