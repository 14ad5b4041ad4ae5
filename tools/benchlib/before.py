"""The code before: another commit of wdstream checked out beside this one, so a part can
measure the old and the new code in the same run, rounds interleaved (``--before COMMIT``).

The checkout is a detached ``git worktree`` in the run's work dir; a child given its path as
``code_root`` (:func:`benchlib.runner.run_child`) imports ``wdstream`` from it. The bench's
own code, datasets and peers stay this commit's: only the library under test changes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchlib.common import ROOT

__all__ = ["checkout", "remove"]


def checkout(commit: str, where: Path) -> tuple[str, str]:
    """Check ``commit`` out at ``where``; its path and short hash.

    Raises:
        subprocess.CalledProcessError: ``commit`` is not a commit of this repository.
    """
    short = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", f"{commit}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), short],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return str(where), short


def remove(where: str) -> None:
    """Remove the checkout (and git's record of it)."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", where],
        check=False, capture_output=True,
    )  # fmt: skip
