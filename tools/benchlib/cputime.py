"""CPU time of a whole reader: the measuring process and every process under it.

A loader with workers spends CPU in processes the training loop never sees; tokens/s alone
hides it, and on a host whose cores are all busy it shows only as a lower rate. The per-row
costs of the read part (``benchlib.checksums``) are CPU seconds of the tree per delivered row.
"""

from __future__ import annotations

import os


def tree_cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds used so far by process ``pid`` (default: this one) and all
    its descendants, live ones and those already exited and reaped (whose time the kernel
    adds to their parent's ``children_*``). A descendant that exits between the listing and
    its read is counted once it has been reaped, as its parent's."""
    import psutil

    root = psutil.Process(os.getpid() if pid is None else pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total
