"""Every public exception, each naming the offending file, shard and position.

Every error a user can trigger with bad data or a bad environment derives from
:class:`WdstreamError`, so a training script can catch one type; each subclass says *where*
the problem is.
"""

from __future__ import annotations

import errno

__all__ = [
    "ChatTemplateError",
    "ConversationError",
    "CorruptShardError",
    "IncompleteDatasetError",
    "IndexValidationError",
    "InputError",
    "ListingNotSupportedError",
    "PackLockedError",
    "QuarantineLimitError",
    "RemoteReadError",
    "RemoteStoreError",
    "RemoteWriteError",
    "StateMismatchError",
    "TokenizerError",
    "WdstreamError",
    "WorkerTimeoutError",
    "shm_refusal",
]


class WdstreamError(Exception):
    """Base class for every error wdstream raises on bad input or bad state."""


class InputError(WdstreamError, ValueError):
    """A document source could not be read: names the file and the line or byte offset."""


class ConversationError(InputError):
    """A record is not a well-formed conversation, or its chat template refuses it: names the
    key and the message index (the caller adds the file and line; a bad record)."""


class ChatTemplateError(WdstreamError, ValueError):
    """A chat template cannot be found, read or compiled: names the file and the key."""


class CorruptShardError(WdstreamError, ValueError):
    """A shard or its sidecar index does not decode: names the shard and the byte offset."""


class QuarantineLimitError(CorruptShardError):
    """More rows were masked (``on_corrupt="mask"``) than ``max_quarantined`` allows: names
    the count, the limit and the last events."""


class IndexValidationError(WdstreamError, ValueError):
    """``index.json`` is not a consistent wdstream index: names the file and the key."""


class IncompleteDatasetError(WdstreamError, FileNotFoundError):
    """A dataset root has no ``index.json``: says whether a pack was interrupted there."""


class PackLockedError(WdstreamError):
    """Another pack holds the output's lock: names the owner and since when."""


class StateMismatchError(WdstreamError, ValueError):
    """A saved cursor does not belong to this dataset/configuration, or is malformed."""


class TokenizerError(WdstreamError, ValueError):
    """A tokenizer could not be loaded; the message lists every source that was tried."""


class ListingNotSupportedError(WdstreamError, NotImplementedError):
    """Plain HTTP cannot list a folder; use ``index.json`` or explicit shard URLs."""


class RemoteStoreError(WdstreamError, OSError):
    """A remote store operation failed after its retries; names the URL and the cause."""

    # ``url`` and ``cause`` have defaults so the error can be made from its message alone,
    # as a torch DataLoader does to raise a worker's error in the parent (else: RuntimeError).
    def __init__(
        self, message: str, url: str = "", cause: str = "", offset: int | None = None
    ) -> None:
        super().__init__(message)
        self.url = url
        self.cause = cause
        self.offset = offset


class RemoteReadError(RemoteStoreError):
    """A remote read failed after its retry budget: names the URL, byte offset and cause."""


class RemoteWriteError(RemoteStoreError):
    """A remote write (PUT, multipart upload, DELETE) failed after its retry budget."""


class WorkerTimeoutError(WdstreamError, TimeoutError):
    """The ``Loader``'s torch workers sent no chunk within its ``timeout``: names each
    worker's pid and state (a stopped or hung process); the workers have been ended, and the
    next ``iter()`` starts new ones from the position after the last batch handed out."""


# How the kernel refuses a file in /dev/shm: no room, no quota, no permission, read-only.
_SHM_REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS})


def shm_refusal(exc: OSError, starting: str, instead: str) -> BaseException:
    """What to raise when starting processes (``starting``: "the torch workers") failed with
    ``exc``: ``multiprocessing`` makes its queues' semaphores in ``/dev/shm`` and, refused
    there, raises a bare ``OSError`` naming no file. That case is a :class:`WdstreamError`
    saying so and what to pass ``instead``; any other error (one naming a file, too many
    open files, no memory) is ``exc`` itself, never blamed on ``/dev/shm``."""
    if exc.filename is not None or exc.errno not in _SHM_REFUSALS:
        return exc
    return WdstreamError(
        f"cannot start {starting} ({exc}): /dev/shm, where their semaphores live, is full or "
        f"unwritable; free room there, or pass {instead}"
    )
