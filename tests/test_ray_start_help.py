"""The driver tokenising pieces itself while the workers start (``StartHelp``): whichever
pieces it takes, the output is the local engine's byte for byte.

When the driver takes pieces depends on when the cluster's first result comes back, so the
test forces it: every other piece the driver may take (the rule's cap kept), mixed with the
workers' pieces from the first piece on. One Ray node of 2 CPUs on loopback.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ray_support import NODE, PACK_OPTS, digests, ray_driver, write_corpus

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when Ray is imported

from wdstream.ray.pieces import InputPiece  # noqa: E402
from wdstream.ray.start_help import StartHelp  # noqa: E402
from wdstream.write.pack import pack  # noqa: E402


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """One Ray node of 2 CPUs on 127.0.0.1, this process its driver."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 2,
                                                     "include_dashboard": False})  # fmt: skip
    try:
        with ray_driver(c.address):
            yield
    finally:
        c.shutdown()


@pytest.mark.parametrize(
    ("mode", "backend"), [("concat", "auto"), ("bestfit", "auto"), ("concat", "tiktoken")]
)  # tiktoken: the workers build the encoding from the ranks the driver ships
def test_pieces_the_driver_tokenises_give_the_local_engines_bytes(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, backend: str
) -> None:
    (tmp_path / "in").mkdir()
    corpus = write_corpus(tmp_path / "in")
    opts: dict[str, Any] = {
        "mode": mode, "backend": backend, "on_error": "skip", "lines": True, **PACK_OPTS,
    }  # fmt: skip
    pack([str(corpus)], str(tmp_path / "local"), **opts)
    taken: list[int] = []
    tokenize = StartHelp.tokenize

    def every_other(self: StartHelp, piece: InputPiece | None, queue: Any) -> bool:
        return piece is not None and self.left > 0 and len(queue) % 2 == 0

    def counted(self: StartHelp, i: int, piece: InputPiece) -> Any:
        taken.append(i)
        return tokenize(self, i, piece)

    monkeypatch.setattr(StartHelp, "wanted", every_other)
    monkeypatch.setattr(StartHelp, "tokenize", counted)
    pack([str(corpus)], str(tmp_path / "ray"), engine="ray", **opts)
    assert len(taken) >= 2 and 0 in taken  # the first piece too
    assert digests(tmp_path / "ray") == digests(tmp_path / "local")


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_the_driver_takes_a_piece_only_while_a_full_window_has_no_result(
    ray_local: None,
) -> None:
    import numpy as np
    import ray

    from wdstream.ray.tasks import PieceJob

    recipe: Any = (str, ())  # never built: the driver takes no piece here
    job = PieceJob([], "text", True, "skip", "strict", 1 << 20, recipe, None, None, "uint32")
    piece = InputPiece(0, 0, None, True, None, 1000)
    helper = StartHelp(job, None, window=2, most=3)  # type: ignore[arg-type]
    waiting = [ray.remote(num_cpus=0)(_sleep).remote(60) for _ in range(2)]
    queue = [(i, ref, None) for i, ref in enumerate(waiting)]
    assert not helper.wanted(piece, queue[:1])  # the window is not full yet
    assert helper.wanted(piece, queue)
    assert not helper.wanted(InputPiece(0, 0, None, True, None, 5 << 20), queue)  # too big
    helper.left = 0
    assert not helper.wanted(piece, queue)  # its most taken
    helper.left = 3
    done = (2, ray.put(np.zeros(1)), None)  # a cluster result back
    assert not helper.wanted(piece, [*queue, done])
    assert not helper.wanted(piece, queue)  # off for good
    for ref in waiting:
        ray.cancel(ref, force=True)
