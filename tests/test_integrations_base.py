"""What the integrations share: ``TrackedBatches`` keeps the state after the last batch
trained on while the trainer draws ahead (a plain loader loop is the oracle), and each
framework is imported only by its own module, a missing one a one-line error."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import wdstream
from wdstream.integrations.base import TrackedBatches, per_rank_state
from wdstream.testing import write_synthetic_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("base") / "data")
    write_synthetic_dataset(root, n_docs=60)
    return root


def _loader(data: str, **options: object) -> wdstream.Loader:
    return wdstream.Loader(data, seq_len=64, batch_size=2, num_workers=0, epochs=None, **options)  # type: ignore[arg-type]


def _plain(data: str, n: int) -> tuple[list[torch.Tensor], list[dict]]:
    """The first ``n`` batches of a plain loop, and the state after each."""
    loader = _loader(data)
    it = iter(loader)
    batches, states = [], []
    for _ in range(n):
        batches.append(next(it)["input_ids"])
        states.append(loader.state_dict())
    return batches, states


def test_state_is_after_the_last_batch_trained_not_drawn(data: str) -> None:
    batches, states = _plain(data, 6)
    tracked = TrackedBatches(_loader(data))
    assert tracked.state_dict() == _loader(data).state_dict()  # before any batch
    it = iter(tracked)
    drawn = [next(it)["input_ids"] for _ in range(3)]  # drawn ahead, like a prefetching trainer
    assert all(torch.equal(a, b) for a, b in zip(drawn, batches, strict=False))
    assert tracked.waiting == 3
    tracked.mark_trained()
    assert tracked.state_dict() == states[0] != tracked.loader.state_dict()
    tracked.mark_trained()
    assert tracked.state_dict() == states[1]

    # A new iterator (a trainer's next epoch) draws the untrained batch again, then goes on.
    again = [b["input_ids"] for _, b in zip(range(3), iter(tracked), strict=False)]
    assert all(torch.equal(a, b) for a, b in zip(again, batches[2:5], strict=True))

    tracked.load_state_dict(states[4])
    assert tracked.waiting == 0 and tracked.state_dict() == states[4]
    assert torch.equal(next(iter(tracked))["input_ids"], batches[5])


def test_mark_trained_without_a_drawn_batch_is_refused(data: str) -> None:
    with pytest.raises(RuntimeError, match="no batch was drawn"):
        TrackedBatches(_loader(data)).mark_trained()


def test_per_rank_state(data: str) -> None:
    assert not per_rank_state(_loader(data, rank=1, world_size=2).state_dict())
    assert per_rank_state(_loader(data, order="streams", rank=1, world_size=2).state_dict())


@pytest.mark.parametrize(
    ("module", "framework", "install"),
    [("hf", "transformers", "transformers>=4.45"), ("lightning", "lightning", "lightning>=2.2")],
)
def test_a_missing_framework_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, module: str, framework: str, install: str
) -> None:
    # What `import` sees when the framework is absent, even if an earlier test imported it.
    for name in [m for m in sys.modules if m == framework or m.startswith(f"{framework}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, framework, None)
    monkeypatch.delitem(sys.modules, f"wdstream.integrations.{module}", raising=False)
    with pytest.raises(ImportError) as caught:
        importlib.import_module(f"wdstream.integrations.{module}")
    message = str(caught.value)
    assert message == (f"wdstream.integrations.{module} needs {framework}, which is not "
                       f"installed: pip install '{install}'")  # fmt: skip
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_the_package_imports_no_framework() -> None:
    code = ("import sys, wdstream.integrations, wdstream.integrations.base; "
            "print(sorted(m for m in ('transformers', 'lightning') if m in sys.modules))")  # fmt: skip
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root, timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"
