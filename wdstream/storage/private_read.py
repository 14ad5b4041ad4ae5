"""A file's bytes read into this process's own memory, never mapped.

Files that other processes can write (the node cache's blocks) are read with
:func:`read_private` instead of ``mmap``: a page of a shared mapping whose file another
process cuts short (``truncate``, ``cp`` or ``open(..., "wb")`` over it, ``rsync
--inplace``), or whose disk fails to read it, is not an exception but a ``SIGBUS`` that
kills the process on its next access, long after any check (a training process at 0
workers; a torch worker, which torch reports as "out of shared memory"). A private copy can
only come back short, which the callers' checks then see.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["read_private"]


def read_private(fd: int) -> memoryview:
    """The bytes of the regular file open as ``fd``, from its start, in a private buffer
    (allocated once at the file's size, not zeroed): fewer when it is cut short meanwhile,
    never more. The descriptor's offset is left unchanged (``pread``)."""
    size = os.fstat(fd).st_size
    buf = np.empty(size, dtype=np.uint8)
    view = buf.data.cast("B")
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got:]], got)
        if n == 0:
            break  # cut short since the fstat: the caller's checks see the length
        got += n
    return view[:got]
