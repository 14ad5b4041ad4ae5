"""What the writer lock asks of a store, on every backend: create-if-absent and the local
lock file. The lock (``wdstream.write.lock``) uses only these, never a store's class."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_storage_contract import store  # noqa: F401 - the every-backend fixture
from wdstream.storage import Store, open_store
from wdstream.storage.base import ForwardingStore

pytest_plugins = ["tests.fixtures_remote"]
pytestmark = pytest.mark.timeout(60)


def test_create_if_absent_writes_once(store: Store) -> None:  # noqa: F811
    store.create_if_absent(".owner", b"first")
    store.create_if_absent(".owner", b"second")  # exists: left alone
    assert store.read(".owner") == b"first"
    store.delete(".owner")
    store.create_if_absent(".owner", b"third")
    assert store.read(".owner") == b"third"


def test_lock_path_only_where_flock_works(store: Store, tmp_path: Path) -> None:  # noqa: F811
    path = store.lock_path(".lock")
    if store.url.startswith(("s3://", "http")):
        assert path is None
    else:
        assert path == tmp_path / "local" / ".lock"
    assert ForwardingStore(store).lock_path(".lock") == path


def test_local_create_if_absent_leaves_no_temporary(tmp_path: Path) -> None:
    local = open_store(str(tmp_path / "d"), create=True)
    local.create_if_absent("x", b"1")
    local.create_if_absent("x", b"2")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["x"]
