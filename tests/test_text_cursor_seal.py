"""Raw-text states vouch for themselves (issue 23 item 2): every cursor carries a check of
its fields, so an edited field is refused naming it.

Before, a state of ``Loader("parts/p*.jsonl", tokenizer="cl100k_base", seq_len=32,
batch_size=4, streams=2, shuffle_window=8)`` saved after 7 batches, with ``streams[0]``'s
``offset``, ``emitted``, ``window`` or ``file`` moved by 1 or 2, loaded and yielded batches
from no position of the run (17 of 51 edits). Oracle: the uninterrupted run's batches.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import numpy as np
import pytest

from wdstream import Loader, StateMismatchError
from wdstream.read.order.text_streams import TEXT_CURSOR_KEYS

SAVED_AFTER, RUN = 7, 40


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("parts")
    rng = random.Random(7)
    words = "alpha beta gamma delta shard token stream cursor resume window offset".split()
    for i in range(4):
        lines = [
            json.dumps({"text": f"p{i} d{j}: " + " ".join(rng.choices(words, k=rng.randint(3, 60)))})
            for j in range(60)
        ]  # fmt: skip
        (d / f"p{i}.jsonl").write_text("\n".join(lines) + "\n")
    return str(d)


def _make(parts: str) -> Loader:
    return Loader(f"{parts}/p*.jsonl", tokenizer="cl100k_base", seq_len=32, batch_size=4,
                  streams=2, shuffle_window=8, num_workers=0, seed=0)  # fmt: skip


@pytest.fixture(scope="module")
def run(parts: str) -> tuple[list[np.ndarray], dict]:
    """The uninterrupted run's first RUN batches and the state after SAVED_AFTER of them."""
    loader = _make(parts)
    it = iter(loader)
    batches, state = [], None
    for i in range(RUN):
        batches.append(next(it)["input_ids"].numpy().copy())
        if i + 1 == SAVED_AFTER:
            state = json.loads(json.dumps(loader.state_dict()))
    assert state is not None
    return batches, state


def _lands_in_run(loader: Loader, run: list[np.ndarray], n: int = 4) -> int | None:
    """The step of the uninterrupted run the next ``n`` batches of ``loader`` equal, or None."""
    it = iter(loader)
    got = [next(it)["input_ids"].numpy() for _ in range(n)]
    for k in range(len(run) - n + 1):
        if all(np.array_equal(g, run[k + j]) for j, g in enumerate(got)):
            return k
    return None


def test_the_saved_state_resumes_exactly(parts: str, run: tuple[list[np.ndarray], dict]) -> None:
    batches, state = run
    loader = _make(parts)
    loader.load_state_dict(copy.deepcopy(state))
    assert _lands_in_run(loader, batches) == SAVED_AFTER
    assert all("check" in c for c in state["streams"])


@pytest.mark.parametrize("stream", [0, 1])
@pytest.mark.parametrize("field", TEXT_CURSOR_KEYS)
def test_every_small_edit_of_every_cursor_field_is_refused_naming_it_or_lands_in_the_run(
    parts: str, run: tuple[list[np.ndarray], dict], stream: int, field: str
) -> None:
    batches, state = run
    for delta in (-2, -1, 1, 2):
        bad = copy.deepcopy(state)
        c = bad["streams"][stream]
        c[field] += delta
        loader = _make(parts)
        try:
            loader.load_state_dict(bad)
        except StateMismatchError as exc:
            assert f"streams[{stream}].{field}" in str(exc), str(exc)
            continue
        assert _lands_in_run(loader, batches) is not None, (field, delta)


def test_a_cursor_moved_to_another_stream_is_refused(
    parts: str, run: tuple[list[np.ndarray], dict]
) -> None:
    _, state = run
    bad = copy.deepcopy(state)
    bad["streams"][0], bad["streams"][1] = bad["streams"][1], bad["streams"][0]
    with pytest.raises(StateMismatchError, match=r"streams\[0\]\.check: no field matches"):
        _make(parts).load_state_dict(bad)


@pytest.mark.parametrize("check", [None, "", "zz", 5, "0" * 64 + "0"])
def test_a_missing_or_malformed_check_is_refused(
    parts: str, run: tuple[list[np.ndarray], dict], check: object
) -> None:
    _, state = run
    bad = copy.deepcopy(state)
    if check is None:
        del bad["streams"][1]["check"]  # a state saved before cursors were sealed
        match = r"streams\[1\]\.check: missing: a raw-text cursor carries a check"
    else:
        bad["streams"][1]["check"] = check
        match = r"streams\[1\]\.check: a string of 64 hex digits expected"
    with pytest.raises(StateMismatchError, match=match):
        _make(parts).load_state_dict(bad)


def test_packed_stream_states_carry_no_check(tmp_path: Path) -> None:
    from wdstream.testing import write_synthetic_dataset

    write_synthetic_dataset(str(tmp_path / "d"), n_docs=30, sample_tokens=33, samples_per_shard=9)
    loader = Loader(str(tmp_path / "d"), seq_len=32, batch_size=2, order="streams", streams=2)
    next(iter(loader))
    assert all(set(c) == {"epoch", "window", "emitted", "offset", "batches"}
               for c in loader.state_dict()["streams"])  # fmt: skip
