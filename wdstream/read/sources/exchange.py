"""Torch workers of one loader sharing a window's ranged reads: each byte is fetched once.

In the global order every worker cuts its own chunks from every window, and a window's rows
are shuffled, so a worker's rows lie scattered over all of the window's pieces (one ranged
read per lane and shard). Reading only its own samples would take a GET per run of ~2
samples; reading the whole window in every worker fetches each byte ``num_workers`` times.
Instead the workers whose rows need a window split its pieces: each piece is fetched by one
of them, its owner, and handed to the others through files in a private folder in
``/dev/shm`` (memory, not disk)::

    window pieces     p0        p1        p2        p3         (owners by size, greedily)
    worker 0          GET p0 -> write once, hard-link as <key>.1, map p1 and p3 once linked
    worker 1          GET p1 -> ... <key>.0          map p0 and p2 once linked

A taker maps its link and unlinks it at once, so a piece's file lives from its fetch until
every taker has mapped it, and its memory until the window is dropped (as a fetched buffer
would). The owner writes each link under a temporary name and renames it into place, so a
taker never sees a partial piece; one of the wrong length (cut by another process) is
fetched by the taker itself.

A taker never depends on a piece arriving: it stops waiting, and fetches the piece itself,
when the owner marks the piece failed (its GET failed, or ``/dev/shm`` is full), when the
owner has gone on to a later window without offering it (each worker publishes the last
window it loaded), when the owner's iteration ended (it dropped its reads: a ``break``, or
its read failed; a piece it claimed may never come then), or after ``SHARE_WAIT_S``. The
bytes a taker maps are checked exactly as fetched ones are (each sample's CRC32C at its
copy), so a piece's path changes no result. A worker whose own
iteration ended takes nothing more: its reads still waiting for a peer's piece end at once.

The folder is ``wdstream-share-<pid>-<random>`` (pid: the process that made the order);
that process removes it when the order is collected or the process exits, and a new folder
first removes those of processes no longer alive.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SHARE_WAIT_S", "Needers", "ReadShare", "SharedPieces", "WindowShares",
           "remove_share_folder", "share_folder"]  # fmt: skip

Window = tuple[int, int]  # (epoch, window)
# ``(epoch, t0, t1)`` -> the torch workers whose chunks read tokens of ``[t0, t1)``.
Needers = Callable[[int, int, int], list[int]]

SHARE_WAIT_S = 60.0  # the longest a taker waits for a live owner (then fetches the piece)
_PREFIX = "wdstream-share-"
_POLL_S = (0.0005, 0.01)  # a taker's first and longest pause between looks
_ENDED = b"ended"  # a worker's progress once its iteration ended: after every window
_AFTER_ALL = (1 << 62, 0)


def share_folder(token: str) -> str:
    """The folder of the share named ``token`` (``<pid>-<random>``): in ``/dev/shm`` where
    there is one, else the temporary folder."""
    shm = Path("/dev/shm")  # noqa: S108 - memory-backed, private names, checked below
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return str(base / f"{_PREFIX}{token}")


def remove_share_folder(folder: str, owner_pid: int) -> None:
    """Remove ``folder`` if this is the process that made it (a forked torch worker holds a
    copy of the same order and must not)."""
    if os.getpid() == owner_pid:
        shutil.rmtree(folder, ignore_errors=True)


def _sweep_dead(base: Path) -> None:
    """Remove share folders of processes that no longer exist (killed before cleaning up)."""
    for entry in base.glob(f"{_PREFIX}*"):
        pid = entry.name.removeprefix(_PREFIX).split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


class ReadShare:
    """One worker's side of the share in ``folder``.

    Files, for piece ``j`` of window ``(e, w)`` handed to worker ``t``: ``e-w-j.t`` (the
    bytes), ``e-w-j.t.c`` (claimed: its owner is fetching it), ``e-w-j.t.x`` (failed: fetch
    it yourself); ``progress.v``: the last window worker ``v`` began to load, or ``ended``
    (its iteration ended: it begins no window more, see :meth:`end`).

    Args:
        folder: from :func:`share_folder`; made here when missing.
        worker: this torch worker's id.
    """

    def __init__(self, folder: str, worker: int) -> None:
        self.folder = Path(folder)
        self.worker = worker
        if not self.folder.is_dir():
            _sweep_dead(self.folder.parent)
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._tmp = 0
        self._count = threading.Lock()  # temporary names
        self._lock = threading.Lock()  # begin() against end()
        self._ended = False  # see end()
        self.taken = self.offered = 0  # pieces mapped from a peer / fetched and handed on

    def _temp(self) -> Path:
        with self._count:
            self._tmp += 1
            return self.folder / f".tmp-{os.getpid()}-{self.worker}-{self._tmp}"

    def _publish(self, path: Path, data: bytes | memoryview) -> None:
        """Write ``data`` as ``path`` atomically (a temporary name, renamed)."""
        tmp = self._temp()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def clear(self, pieces: bool) -> None:
        """Drop what an earlier iteration left for this worker: claims its owners never
        kept, failure marks, and with ``pieces`` (the iteration ends) the pieces it left
        untaken; without (an iteration begins) its own progress. A peer's ``ended`` stays:
        it may be this iteration's (a peer can begin and end a short one, a ``break`` after
        a few batches, before this worker begins it; its claims for this worker are among
        the marks dropped here, so with its mark gone too the takers waited ``SHARE_WAIT_S``
        for pieces never coming); one of the iteration before makes a taker fetch that
        peer's pieces itself until the peer begins (never wrong). As an iteration begins a
        peer may already have offered this one's pieces, so they stay (a piece's bytes are
        the same in any iteration)."""
        mine = f".{self.worker}"
        for entry in list(self.folder.iterdir()) if self.folder.is_dir() else []:
            if entry.name.startswith("progress."):
                if not pieces and entry.name.endswith(mine):
                    entry.unlink(missing_ok=True)
                continue
            name = entry.name.removesuffix(".c").removesuffix(".x")
            mark = name != entry.name
            if name.endswith(mine) and not name.startswith(".") and (mark or pieces):
                entry.unlink(missing_ok=True)

    def end(self) -> None:
        """This worker's iteration ended (its reads are being dropped): it begins no window
        more, takes nothing more (a read waiting for a peer's piece raises
        ``CancelledError`` at once), and says so in its progress, so that a peer still
        filling its last chunk stops waiting for pieces this one never claimed and fetches
        them itself (before, it waited ``SHARE_WAIT_S`` and torch killed it after 5 s)."""
        with self._lock:
            self._ended = True
        try:
            self._publish(self.folder / f"progress.{self.worker}", _ENDED)
        except OSError:
            pass  # peers then wait for the deadline, as for a worker that died

    def begin(self, window: Window, claims: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Before fetching window ``window``: claim its pieces this worker fetches for
        others (``(piece, takers)``), then say it began this window (in that order: a
        taker that sees the progress sees the claims)."""
        with self._lock:  # not after end(): its mark must stay the last progress
            if self._ended:
                return
            try:
                for j, takers in claims:
                    for t in takers:
                        self._publish(self._path(window, j, t, ".c"), b"")
                self._publish(self.folder / f"progress.{self.worker}", b"%d %d" % window)
            except OSError:
                pass  # takers then wait for the owner to move on, or the deadline: never wrong

    def _path(self, window: Window, j: int, taker: int, suffix: str = "") -> Path:
        return self.folder / f"{window[0]}-{window[1]}-{j}.{taker}{suffix}"

    def _progress(self, worker: int) -> Window | None:
        """The last window ``worker`` began, after every window once it ended; None: none
        known (it began none yet, in this iteration)."""
        try:
            text = (self.folder / f"progress.{worker}").read_bytes()
            if text == _ENDED:
                return _AFTER_ALL
            epoch, window = text.split()
        except (OSError, ValueError):
            return None
        return int(epoch), int(window)

    def offer(self, window: Window, j: int, data: memoryview, takers: Sequence[int]) -> None:
        """Hand ``data`` (piece ``j`` of ``window``, just fetched) to each of ``takers``;
        where it cannot be written (``/dev/shm`` full), mark it failed instead."""
        tmp = self._temp()
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            for t in takers:
                link = self._temp()
                os.link(tmp, link)
                os.replace(link, self._path(window, j, t))
            self.offered += 1
        except OSError:
            self.fail(window, j, takers)
        finally:
            tmp.unlink(missing_ok=True)

    def fail(self, window: Window, j: int, takers: Sequence[int]) -> None:
        """Tell ``takers`` that piece ``j`` of ``window`` will not come."""
        for t in takers:
            try:
                self._publish(self._path(window, j, t, ".x"), b"")
            except OSError:
                pass  # they stop waiting when this worker moves on, or at the deadline

    def take(self, window: Window, j: int, owner: int) -> memoryview | None:
        """Piece ``j`` of ``window`` from ``owner``, mapped; None where it will not come
        (marked failed; the owner began a later window without claiming it, or ended, even
        with the piece claimed; or after ``SHARE_WAIT_S``): the caller then fetches it.

        Raises:
            CancelledError: this worker's iteration ended (:meth:`end`).
        """
        path = self._path(window, j, self.worker)
        claim, failed = Path(f"{path}.c"), Path(f"{path}.x")
        deadline = time.monotonic() + SHARE_WAIT_S
        pause = _POLL_S[0]
        while True:
            if self._ended:
                raise CancelledError
            at = self._progress(owner)  # first: a claim made before it is seen below
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                fd = -1
            if fd >= 0:
                try:
                    size = os.fstat(fd).st_size
                    data = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else b""
                finally:
                    os.close(fd)
                for done in (path, claim):
                    done.unlink(missing_ok=True)
                self.taken += 1
                return memoryview(data)
            if failed.exists():
                for done in (failed, claim):
                    done.unlink(missing_ok=True)
                return None
            # An owner at a later window may still be fetching a piece it claimed; one whose
            # iteration ended may not: a claimed GET was left in flight as its read failed,
            # and its process then ended with it (a taker waited SHARE_WAIT_S: 60 s).
            gone = at is not None and at > window and (at == _AFTER_ALL or not claim.exists())
            if gone or time.monotonic() > deadline:
                claim.unlink(missing_ok=True)
                return None
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])


@dataclass(frozen=True)
class SharedPieces:
    """How the pieces of one window read are shared: piece ``j`` is fetched by worker
    ``owner[j]`` and handed to the workers ``takers[j]``."""

    share: ReadShare
    window: Window
    owner: list[int]
    takers: list[tuple[int, ...]]

    @classmethod
    def split(
        cls, share: ReadShare, window: Window, sizes: Sequence[int], needers: Sequence[int]
    ) -> SharedPieces:
        """Give each piece (of ``sizes`` samples) to one of ``needers``, the largest first
        to the one with the fewest samples so far: the same split in every worker."""
        load = dict.fromkeys(needers, 0)
        owner = [0] * len(sizes)
        for j in sorted(range(len(sizes)), key=lambda j: (-sizes[j], j)):
            w = min(needers, key=lambda v: (load[v], v))
            owner[j] = w
            load[w] += sizes[j]
        takers = [tuple(v for v in needers if v != o) for o in owner]
        return cls(share, window, owner, takers)

    def begin(self) -> None:
        """Claim this worker's pieces and say the window began (see :meth:`ReadShare.begin`)."""
        me = self.share.worker
        claims = [(j, t) for j, (o, t) in enumerate(zip(self.owner, self.takers, strict=True))
                  if o == me]  # fmt: skip
        self.share.begin(self.window, claims)

    def taken_first(self) -> list[int]:
        """Piece indices, those this worker fetches first: a pool busy waiting for peers'
        pieces must not hold back the fetches the peers wait for."""
        me = self.share.worker
        return sorted(range(len(self.owner)), key=lambda j: self.owner[j] != me)

    def fetch(self, j: int, get: Callable[[], memoryview], size: int | None = None) -> memoryview:
        """Piece ``j``'s bytes: fetched with ``get`` (and handed on, where this worker owns
        it), or taken from its owner (fetched with ``get`` where it does not come, or comes
        with other than ``size`` bytes: its file was cut short in ``/dev/shm``, not the
        shard)."""
        me, owner, takers = self.share.worker, self.owner[j], self.takers[j]
        if owner == me:
            try:
                data = get()
            except BaseException:
                self.share.fail(self.window, j, takers)
                raise
            self.share.offer(self.window, j, data, takers)
            return data
        if me in takers:
            got = self.share.take(self.window, j, owner)
            if got is not None and (size is None or len(got) == size):
                return got
        return get()

    def abandon(self, j: int) -> None:
        """Piece ``j`` will not be fetched, or its read failed (the window's read failed):
        release its takers (a piece already offered is taken before the mark is seen)."""
        if self.owner[j] == self.share.worker:
            self.share.fail(self.window, j, self.takers[j])

    def abandon_cancelled(self, j: int, job: Future[Any]) -> None:
        """:meth:`abandon` piece ``j`` if its fetch ``job`` was cancelled before it ran (a
        dropped fetch pool cancels those not started): it never reached the read's own
        ``abandon``, and its takers waited ``SHARE_WAIT_S`` for it."""
        if job.cancelled():
            self.abandon(j)


class WindowShares:
    """A torch worker's side of the share, with which workers need each window.

    Args:
        folder: from :func:`share_folder`.
        worker: this torch worker's id.
        needers: the workers whose chunks read a token range of an epoch.
    """

    def __init__(self, folder: str, worker: int, needers: Needers) -> None:
        self.share = ReadShare(folder, worker)
        self.share.clear(pieces=False)
        self._needers = needers

    def needs(self, epoch: int, begin: int, end: int) -> bool:
        """Whether this worker's chunks read tokens ``[begin, end)`` of ``epoch``."""
        return self.share.worker in self._needers(epoch, begin, end)

    def split(
        self, window: Window, begin: int, end: int, sizes: Sequence[int]
    ) -> SharedPieces | None:
        """How the pieces (of ``sizes`` samples) of ``window``, tokens ``[begin, end)`` of
        its epoch, are fetched: split among the workers that need it, or None where this
        worker is alone in needing it (or does not: a read-ahead of its own)."""
        who = self._needers(window[0], begin, end)
        if self.share.worker not in who or len(who) < 2:
            return None
        return SharedPieces.split(self.share, window, sizes, who)

    def end(self) -> None:
        """The iteration ends: take nothing more, and tell the peers (:meth:`ReadShare.end`)."""
        self.share.end()

    def close(self) -> None:
        """The iteration ended: drop what was left for this worker."""
        self.share.end()
        self.share.clear(pieces=True)
