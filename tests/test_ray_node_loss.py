"""A Ray node lost mid-pack: its tasks are retried on the node left, and the output is still
byte-identical to the local engine's.

Its own cluster (a head with no CPUs, so every task runs on one of two worker nodes of one
CPU each, all on 127.0.0.1): the test stops a tokenising worker mid-task (SIGSTOP, see
:func:`tests.ray_support.frozen_task`), removes its node with every process of that node
killed (raylet, workers, object store), waits until Ray counts the node dead, and the task
is retried on the other node. Token arrays that lived in the lost node's object store are
rebuilt from lineage.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ray_support import (
    NODE,
    digests,
    frozen_task,
    inputs_with_long_task,
    pack_in_thread,
    proc_stat,
    ray_driver,
    wait_exited,
    write_corpus,
)

# Read by Ray when it is imported: "0" keeps every address on the loopback interface. Ray is
# imported by the tests (~0.3 CPU-s), not at collection, which every xdist worker does.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


# How soon the head's GCS counts a node whose raylet stopped answering as dead: Ray's
# defaults (a check every 3 s, dead after 5 failed ones in a row) made the test wait ~15 s
# for it after the node was removed; here ~5 s (a check a second, the same 5 failures). A
# check fails when its call is refused (the node is gone) or has no answer within
# ``health_check_timeout_ms`` (10 s, Ray's default, kept): a live node slowed by a loaded
# host still answers in time, so the nodes left are not counted dead.
HEALTH_CHECKS = {"health_check_period_ms": 1000}


@pytest.fixture(scope="module")
def two_worker_nodes() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={**NODE, "num_cpus": 0,
                                                     "include_dashboard": False,
                                                     "_system_config": HEALTH_CHECKS})  # fmt: skip
    c.add_node(**NODE)
    c.add_node(**NODE)
    c.wait_for_nodes()
    try:
        with ray_driver(c.address):
            yield c
    finally:
        c.shutdown()


def _node_running(cluster: Any, worker_pid: int) -> Any:
    """The cluster node whose raylet started worker ``worker_pid``."""
    raylet = int(proc_stat(worker_pid)[1])
    for node in cluster.worker_nodes:
        if any(p.process.pid == raylet for p in node.all_processes.get("raylet", [])):
            return node
    raise AssertionError(f"worker {worker_pid} belongs to no worker node (raylet {raylet})")


def _wait_alive_nodes(n: int, timeout: float = 60) -> None:
    import ray

    deadline = time.monotonic() + timeout
    while len([x for x in ray.nodes() if x["Alive"]]) != n:
        assert time.monotonic() < deadline, f"Ray still counts {ray.nodes()} nodes"
        time.sleep(0.1)


def test_node_lost_mid_pack_is_retried_and_output_identical(
    two_worker_nodes: Any, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    inputs, reference = inputs_with_long_task(write_corpus(corpus), tmp_path)
    errors: list[BaseException] = []
    thread = pack_in_thread(inputs, tmp_path / "out", errors)
    worker = frozen_task()
    node = _node_running(two_worker_nodes, worker)
    two_worker_nodes.remove_node(node, allow_graceful=False)
    # A lost machine takes its processes with it; a stopped worker cannot notice its raylet
    # is gone, so it goes with the node here.
    os.kill(worker, signal.SIGKILL)
    wait_exited(worker, "its node was removed")
    _wait_alive_nodes(2)  # the head and one worker node: Ray saw the loss
    thread.join(timeout=180)
    assert not thread.is_alive() and not errors, errors
    assert digests(tmp_path / "out") == digests(reference)
