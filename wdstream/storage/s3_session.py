"""boto3 sessions that share one botocore data loader per process.

A new boto3 session loads and decodes S3's service model from botocore's JSON files again
(~85 ms of CPU here, of the ~95 ms a first client takes); botocore caches what it loaded per
*loader*, and each session makes its own. An :class:`~wdstream.storage.s3.S3Store` makes a
session for its client in each process (a forked DataLoader worker too, as boto3 sessions
are not fork-safe), so a process with many S3 stores, or each worker of one, decoded the
same files again and again. The loader holds only botocore's static model data (read-only
once loaded), so one per data path serves every session of the process; a forked worker
inherits it already filled (~11 ms for its client).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import boto3
import botocore.loaders
import botocore.session

# botocore data loaders by their data path (``AWS_DATA_PATH`` / a profile's ``data_path``).
_LOADERS: dict[str | None, Any] = {}
_LOCK = threading.Lock()


def _new_lock_in_child() -> None:
    """A forked child's lock: one held by another thread at the fork stays held there."""
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def shared_loader_session(profile: str | None) -> boto3.session.Session:
    """A new boto3 session for ``profile`` (the default chain when None) whose botocore data
    loader is this process's shared one for its data path."""
    core = botocore.session.Session(profile=profile)
    path = core.get_config_variable("data_path")
    with _LOCK:
        loader = _LOADERS.get(path)
        if loader is None:
            loader = _LOADERS[path] = botocore.loaders.create_loader(path)
        core.register_component("data_loader", loader)
        session = boto3.session.Session(botocore_session=core)
        # boto3 appends its own data folder to the loader of each session: once is enough.
        paths = loader.search_paths
        while paths.count(paths[-1]) > 1:
            paths.pop()
    return session
