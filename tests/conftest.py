"""Shared fixtures. Test data is built in ``tmp_path`` at run time; no binary test data.

Writer fixtures: ``corpus_docs`` (texts with recognisable content: synthetic sentences of
varying length, a few long stdlib sources, unicode) and ``write_jsonl`` to lay them out as
input files.
"""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.processes import RANK_MODULES, start_rank_server

# CI runs on a shared 2-core machine: a per-example deadline would turn a slow moment into a
# failure, and derandomised examples make a failure reproducible from the log alone.
settings.register_profile("wdstream", deadline=None, derandomize=True)
settings.load_profile("wdstream")

# Test data (``tmp_path``) on tmpfs where there is one: the writers fsync every shard,
# sidecar and index (as they must), and on this shared disk an fsync took ~10 ms, ~40 s
# of a 400-shard dataset; on tmpfs it returns at once. Set before pytest picks its
# temporary root (at the first ``tmp_path``); a root given by the caller is kept.
# Only a tmpfs with room for the suite's folders (a container's /dev/shm is often 64 MB).
_SHM_NEEDED = 8 << 30


def _roomy_tmpfs(path: str) -> bool:
    """Whether ``path`` is writable with at least ``_SHM_NEEDED`` bytes free."""
    if not os.access(path, os.W_OK | os.X_OK):
        return False
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize >= _SHM_NEEDED


if "PYTEST_DEBUG_TEMPROOT" not in os.environ and _roomy_tmpfs("/dev/shm"):
    os.environ["PYTEST_DEBUG_TEMPROOT"] = "/dev/shm"

# The README's test command runs the files on one worker more than the cores (pytest-xdist,
# ``-n auto --dist loadfile`` in setup.cfg; see pytest_xdist_auto_num_workers). A file
# runs whole on one worker (its module fixtures, such as a server, start once); the Ray
# files run one after another on one worker, as two Ray
# clusters started at once on a 2-core machine starve each other's raylets, and a test that
# stops a tokenising worker by its title could catch the other cluster's. The grouping is a
# scheduler of our own rather than ``xdist_group`` marks: pytest 9.2 no longer reads the
# ``_nodeid`` that xdist's loadgroup writes the group into, so those marks were silently
# ignored and the Ray files ran side by side. Every file that starts a cluster is in the
# group (test_ray_start_help.py's was not, and ran beside the group's on another worker).
_RAY_FILES = frozenset(
    ("test_ray_node_loss.py", "test_ray_optional.py", "test_ray_pack.py",
     "test_ray_start_help.py", "test_ray_system_kill.py")
)  # fmt: skip


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores this process may use. Many tests wait on
    other processes (servers, Ray, torchrun ranks, the CLI, bench children), and one more
    worker keeps both cores busy meanwhile: on this 2-core host the suite took 363 s with 2
    workers, 294 s with 3 and 303 s with 4 (stop 39); in session 41, 396 s with 3 and 357 s
    with 4 in one checkout, but 458 s with 4 in a fresh clone's CI run, where a deadline test
    then missed its bound by 0.55 s: more workers than cores + 1 load the timed tests more
    than they save."""
    return len(os.sched_getaffinity(0)) + 1


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the Ray files as one unit of work."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileWithRayTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray" if Path(path).name in _RAY_FILES else path

    return FileWithRayTogether(config, log)


# The slowest files first (their summed test times in a full run, slowest first): ``--dist
# loadfile`` hands files out in collection order, so a slow file collected last (the Ray
# group, alphabetically near the end) ran alone on one worker while the other had finished.
# Files not named keep their order, after these.
_SLOW_FIRST = (
    "test_doc_blocks.py",
    "test_ray_pack.py",  # the Ray group (with the other _RAY_FILES)
    "test_holdout.py",
    "test_examples.py",
    "test_bench_smoke.py",
    "test_bench_fresh.py",
    "test_chat_budget.py",
    "test_travel_attacks.py",
    "test_resume.py",
    "test_storage_cache.py",
    "test_loss_spike_example.py",
    "test_arrow_edges.py",
    "test_rawtext.py",
    "test_trust_states.py",
    "test_cli_edges.py",
    "test_pack_resume.py",
    "test_loader.py",
    "test_storage_s3.py",
    "test_pack_lock.py",
    "test_ddp_example.py",
    "test_shard_table.py",
    "test_worker_checks.py",
    "test_chat_reasoning.py",
    "test_trust_targets.py",
    "test_trust_sidecars.py",
    "test_cli.py",
    "test_local_limits.py",
    "test_remote_e2e.py",
    "test_global_order.py",
)


def _file_rank(item: pytest.Item) -> int:
    name = item.path.name
    if name in _RAY_FILES:
        name = "test_ray_pack.py"
    return _SLOW_FIRST.index(name) if name in _SLOW_FIRST else len(_SLOW_FIRST)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[None]:
    """No cyclic garbage collection while the tests are collected, then one collection and
    :func:`gc.freeze`: every xdist worker collects every file, and the collector's runs over
    the growing heap (torch, 2,000 items) were a third of a worker's ~8 CPU-s of collection;
    frozen, what collection leaves (modules, test functions, torch's objects) is no longer
    traversed by the full collections the tests' own garbage triggers."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()
        gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of :data:`_SLOW_FIRST` first, in its order; each file's tests in theirs.
    Where rank processes will start, the fork server they start from starts now (see
    :mod:`tests.processes`), before a pack's worker pool could start it without torch."""
    items.sort(key=_file_rank)  # stable: the order within a rank is kept
    rank_files = {m.rsplit(".", 1)[1] + ".py" for m in RANK_MODULES}
    if any(item.path.name in rank_files for item in items):
        start_rank_server()


_WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega shard token sample stream cursor resume"
).split()


def make_corpus(n_docs: int = 120, seed: int = 0, stdlib_files: int = 4) -> list[str]:
    """Deterministic documents: document i starts with ``doc {i}:`` and has 1..~3000 words."""
    rng = random.Random(seed)
    docs = []
    for i in range(n_docs):
        n = int(rng.paretovariate(1.2) * 20) % 3000 + 1
        body = " ".join(rng.choice(_WORDS) for _ in range(n))
        extra = rng.choice(["", " ünïcödé 日本語 🙂", "\n\n  indented\tcode()\n", " 12345 678"])
        docs.append(f"doc {i}: {body}{extra}")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(stdlib.glob("*.py"))[:stdlib_files]:
        docs.append(p.read_text(encoding="utf-8"))
    return docs


@pytest.fixture(scope="session")
def corpus_docs() -> list[str]:
    return make_corpus()


def _write_jsonl(path: Path, texts: Iterable[str], key: str = "text") -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({key: t, "meta": {"n": len(t)}}) + "\n")
    return path


@pytest.fixture
def write_jsonl() -> Callable[..., Path]:
    """``write_jsonl(path, texts, key="text")`` writes one JSON object per line."""
    return _write_jsonl


def pack_cli_corpus(d: Path, args: list[str]) -> Path:
    """:func:`make_corpus` as JSON lines under ``d``, packed by the CLI with ``args``: the
    output folder (``d / "ds"``)."""
    from click.testing import CliRunner

    from wdstream.cli import main

    src = _write_jsonl(d / "in.jsonl", make_corpus())
    out = d / "ds"
    result = CliRunner().invoke(main, ["pack", str(src), "--output", str(out), *args])
    assert result.exit_code == 0, result.output
    return out


def pack_docs_corpus(d: Path, n_docs: int, seed: int, stdlib_files: int) -> str:
    """A docs-mode pack (32 KB shards) of :func:`make_corpus` documents under ``d``; its root."""
    import wdstream

    src = d / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in make_corpus(n_docs, seed, stdlib_files))
    )
    wdstream.pack([str(src)], str(d / "out"), mode="docs", shard_size="32KB", workers=0)
    return str(d / "out")


@contextmanager
def small_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``"2m"``) mounted on a new ``folder`` (root only; the test is
    skipped where mounting is impossible), always unmounted afterwards: full-disk tests."""
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)]).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=True)
