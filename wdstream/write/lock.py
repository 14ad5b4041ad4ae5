"""The writer lock of ``pack``: one pack at a time per output, local or remote.

Two packs into one output destroy each other (the second sweeps the first's half-written
files and both journal shards of their own), so :func:`pack` holds ``.wdstream-pack.lock``
at the output root from before it touches anything until it returns. The leading dot keeps
it out of ``Store.list()``; it is never part of a finished dataset. It holds JSON naming the
owner: ``pid``, ``host``, ``started`` (UTC), a random ``token`` and ``pid_started`` (the
process's start time, to tell a reused pid).

Local folders (a store whose :meth:`~wdstream.storage.base.Store.lock_path` names a file:
the lock asks the store only that, never its class): the lock is an OS advisory lock
(``flock``) on that file, which the kernel drops when its process dies, however it dies -- a SIGKILLed pack never blocks a rerun, and
a lock the kernel still holds proves its owner is running (``--force-unlock`` cannot take
it). A file left by a dead owner (its lock dropped, its JSON still there) is taken over
when it names this host and a pid that is gone or now belongs to another process; a file
naming another host (a shared filesystem whose locks do not cross hosts) is only taken
with ``--force-unlock``.

Object stores (S3, HTTP): there is no lock that dies with its process, so a lock object
stays until released. It is created only if absent
(:meth:`~wdstream.storage.base.Store.create_if_absent`) -- S3: a conditional
``PutObject(IfNoneMatch="*")``, atomic on AWS and the S3-compatible stores that support it;
HTTP: a ``HEAD`` then a ``PUT``, which leaves a window of one round trip -- and then read
back: the pack owns the output only if the lock holds its own token. A lock left by a
killed pack stays until a rerun with ``--force-unlock`` (once you know its owner is dead)
removes it.
"""

from __future__ import annotations

import abc
import fcntl
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from wdstream.errors import PackLockedError
from wdstream.storage import Store
from wdstream.storage.local import PARTIAL_SUFFIX

__all__ = ["LOCK_NAME", "LockOwner", "OutputLock", "acquire"]

LOCK_NAME = ".wdstream-pack.lock"
_LOCK_VERSION = 1

log = logging.getLogger("wdstream.write")

_DEAD_ADVICE = "wait for it, or if it is dead run with --force-unlock"
_ALIVE_ADVICE = (
    "it is still running (it holds the OS lock on {lock}): wait for it, or stop it and "
    "rerun; --force-unlock cannot take a lock from a running process"
)


@dataclass(frozen=True)
class LockOwner:
    """Who holds an output's lock, as written in the lock file/object."""

    pid: int
    host: str
    started: str  # UTC, ISO 8601, to the second
    token: str  # random: tells this owner from any other, even with the same pid and host
    pid_started: int | None  # the process's start in clock ticks after boot (Linux), else None

    @classmethod
    def this_process(cls) -> LockOwner:
        """A new owner record for the calling process, with a fresh token."""
        return cls(
            pid=os.getpid(),
            host=socket.gethostname(),
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            token=secrets.token_hex(16),
            pid_started=_proc_stat(os.getpid())[1],
        )

    def to_bytes(self) -> bytes:
        return json.dumps({"version": _LOCK_VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def parse(cls, raw: bytes) -> LockOwner | None:
        """The owner in a lock's bytes; None if they are not a lock record (a file made by
        hand, say)."""
        try:
            obj = json.loads(raw)
            return cls(**{k: obj[k] for k in cls.__dataclass_fields__})
        except (ValueError, TypeError, KeyError):
            return None

    def is_gone(self) -> bool:
        """True only if this owner ran on this host and its process no longer runs.

        A pid that is alive but started at another time than the owner's belongs to a new
        process (pids are reused), so the owner is gone too, as it is if its process is a
        zombie (exited, not yet reaped). Another host cannot be checked.
        """
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # alive, under another user
        state, started = _proc_stat(self.pid)
        if state == "Z":
            return True
        if started is None or self.pid_started is None:
            return False  # cannot tell: a live pid is taken to be the owner
        return started != self.pid_started

    @property
    def who(self) -> str:
        return f"pid {self.pid} on host {self.host}"

    def describe(self) -> str:
        return f"since {self.started} ({self.who})"


def _proc_stat(pid: int) -> tuple[str | None, int | None]:
    """``(state, start time in clock ticks after boot)`` of process ``pid`` from /proc;
    ``(None, None)`` where that is unknown (no /proc, or no such process)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None, None


def _locked(url: str, owner: LockOwner | None, advice: str) -> PackLockedError:
    who = owner.describe() if owner is not None else "(its lock records no owner)"
    return PackLockedError(f"another pack has been writing to {url} {who}; {advice}")


class OutputLock(abc.ABC):
    """A held lock on one output; :meth:`release` gives it back (a second call does nothing)."""

    def __init__(self, store: Store, owner: LockOwner) -> None:
        self.store, self.owner = store, owner

    @abc.abstractmethod
    def verify(self) -> None:
        """Raise :class:`PackLockedError` if this lock was taken away meanwhile (removed by
        hand, or ``--force-unlock`` by another pack); called before publishing ``index.json``."""

    @abc.abstractmethod
    def release(self) -> None:
        """Remove the lock if it is still this owner's."""


def acquire(store: Store, force_unlock: bool = False) -> OutputLock:
    """Take the writer lock of ``store``'s root for this process.

    Args:
        store: the output.
        force_unlock: take over a lock whose owner cannot be checked (an object store's, or
            one written on another host); never one a running local process holds.

    Raises:
        PackLockedError: another pack holds the lock; names it, since when, and what to do.
        RemoteStoreError: the lock object could not be written or read.
    """
    path = store.lock_path(LOCK_NAME)
    if path is not None:
        return _FileLock.acquire(store, path, force_unlock)
    return _ObjectLock.acquire(store, force_unlock)


class _FileLock(OutputLock):
    """``flock`` on ``ROOT/.wdstream-pack.lock``, with the owner's record in the file.

    A lock file only ever appears under its name already written and locked (made under a
    temporary name, then linked or renamed into place), so whoever finds it locked also finds
    its owner's record.
    """

    def __init__(self, store: Store, path: Path, owner: LockOwner, fd: int) -> None:
        super().__init__(store, owner)
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, store: Store, path: Path, force_unlock: bool) -> _FileLock:
        """Lock ``path`` (the store's :meth:`~Store.lock_path` of the lock's name)."""
        while True:  # again only when the file changed under us (released, or raced to)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                lock = cls._create(store, path, lambda tmp: os.link(tmp, path))
            else:
                lock = cls._take_over(store, path, fd, force_unlock)
            if lock is not None:
                return lock

    @classmethod
    def _create(cls, store: Store, path: Path, publish: Callable[[Path], None]) -> _FileLock | None:
        """Write and lock this process's record under a temporary name, then ``publish`` it
        under the lock's name; None if that name was taken or freed meanwhile."""
        owner = LockOwner.this_process()
        tmp = path.with_name(f"{path.name}.{owner.token}{PARTIAL_SUFFIX}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a new file nobody else has open: at once
            os.write(fd, owner.to_bytes())
            os.fsync(fd)
            publish(tmp)
        except (FileExistsError, FileNotFoundError):
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        finally:
            tmp.unlink(missing_ok=True)
        return cls(store, path, owner, fd)

    @classmethod
    def _take_over(cls, store: Store, path: Path, fd: int, force_unlock: bool) -> _FileLock | None:
        """Replace the lock file open as ``fd`` if its OS lock is free and its record allows
        (see :func:`_check_left_behind`); None if it is no longer the lock file.

        Raises:
            PackLockedError: a running process holds it, or its owner may still run.
        """
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = LockOwner.parse(_read_fd(fd))
                raise _locked(store.url, owner, _ALIVE_ADVICE.format(lock=path)) from None
            if not _is_file_of(path, fd):
                return None
            previous = LockOwner.parse(_read_fd(fd))
            if previous is not None:
                _check_left_behind(store.url, previous, force_unlock)
            # Holding the old file's lock, nobody else can be replacing it.
            return cls._create(store, path, lambda tmp: os.replace(tmp, path))
        finally:
            os.close(fd)

    def verify(self) -> None:
        if self._fd is None or not _is_file_of(self.path, self._fd):
            raise PackLockedError(
                f"{self.path} was removed or replaced while this pack held it; another pack "
                f"may have written to {self.store.url}: rerun the pack"
            )

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _is_file_of(self.path, fd):
                # Removed while still locked, so whoever opens the path next makes a new file
                # (one that opened this one meanwhile sees it is gone and starts over).
                self.path.unlink()
        finally:
            os.close(fd)


def _read_fd(fd: int) -> bytes:
    return os.pread(fd, 1 << 16, 0)


def _is_file_of(path: Path, fd: int) -> bool:
    """Whether ``path`` is (still) the file open as ``fd``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _check_left_behind(url: str, previous: LockOwner, force_unlock: bool) -> None:
    """Allow taking a lock file whose OS lock is free but whose record names an owner.

    Raises:
        PackLockedError: the owner may still run (another host, or a live pid here).
    """
    if previous.is_gone():
        log.warning("taking over the lock of a pack that is gone: %s", previous.describe())
    elif force_unlock:
        log.warning("--force-unlock: taking over the lock of %s", previous.describe())
    else:
        raise _locked(url, previous, _DEAD_ADVICE)


class _ObjectLock(OutputLock):
    """A lock object created only if absent, then read back to confirm the owner."""

    def __init__(self, store: Store, owner: LockOwner) -> None:
        super().__init__(store, owner)
        self._held = True

    @classmethod
    def acquire(cls, store: Store, force_unlock: bool) -> _ObjectLock:
        if force_unlock:
            previous = _read_owner(store)
            if previous is not None:
                log.warning("--force-unlock: removing the lock of %s", previous.describe())
                store.delete(LOCK_NAME)
        owner = LockOwner.this_process()
        store.create_if_absent(LOCK_NAME, owner.to_bytes())
        current = _read_owner(store)
        if current is None or current.token != owner.token:
            raise _locked(store.url, current, _DEAD_ADVICE)
        return cls(store, owner)

    def verify(self) -> None:
        current = _read_owner(self.store)
        if current is None or current.token != self.owner.token:
            by = f" by {current.who} (--force-unlock)" if current is not None else ""
            raise PackLockedError(
                f"the lock on {self.store.url} was taken away while this pack ran{by}; "
                "the output is no longer this pack's, so it stops without publishing"
            )

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        try:
            current = _read_owner(self.store)
            if current is not None and current.token == self.owner.token:
                self.store.delete(LOCK_NAME)
        except OSError as exc:  # RemoteStoreError too; must not hide the pack's own error
            log.warning(
                "could not remove the lock %s (%s): the next pack there will need --force-unlock",
                self.store.child_url(LOCK_NAME),
                exc,
            )


def _read_owner(store: Store) -> LockOwner | None:
    try:
        return LockOwner.parse(store.read(LOCK_NAME))
    except FileNotFoundError:
        return None
