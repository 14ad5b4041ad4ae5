"""Where ``wdstream stats --plot FILE`` may write its picture, and the write itself.

A picture never lands on data: ``--plot DS/index.json`` once replaced the dataset's own index
and exited 0, and a ``--plot`` path that was a symlink overwrote the file it pointed to. The
rules, checked before the dataset is read (:func:`check_plot_target`)::

    a symlink (or anything but a regular file) at FILE      refused, always
    an existing file of a dataset (FILE inside a dataset     refused, always (unless it is
      root given, or beside an index.json / pack journal;     a PNG picture already)
      the mixture spec itself)
    an existing file that is not a PNG                       refused unless overwrite=True
    a new file, or an existing PNG                           written

The write (:func:`save_png`) goes to a new temporary file beside FILE (``O_EXCL``, which
follows no link) renamed over FILE: a rename replaces a link itself, never its target, and
a reader of FILE sees the old picture or the new one, never half of one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

__all__ = ["PNG_MAGIC", "check_plot_target", "save_png"]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_DATASET_MARKS = ("index.json", ".wdstream-pack.json", ".wdstream-pack.lock")


def _is_png(path: str) -> bool:
    """Whether the regular file ``path`` starts as a PNG does (opened without following a
    link)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        return os.read(fd, len(PNG_MAGIC)) == PNG_MAGIC
    finally:
        os.close(fd)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _dataset_file(target: Path, protected: list[str]) -> str | None:
    """What dataset ``target`` (an existing file) belongs to, or None."""
    parent = target.parent.resolve()
    where = parent / target.name
    for given in protected:
        if "://" in given:
            continue  # a remote dataset: no local file of it to overwrite
        root = Path(given).resolve()
        if root.is_file() and root == where:
            return f"it is the mixture spec {given}"
        if root.is_dir() and _inside(where, root):
            return f"it is inside the dataset {given}"
    marks = [m for m in _DATASET_MARKS if (parent / m).exists()]
    return f"its folder holds a dataset ({marks[0]})" if marks else None


def check_plot_target(plot: str, protected: list[str], overwrite: bool = False) -> None:
    """Refuse a ``--plot`` path that would overwrite data (the module's rules).

    Args:
        plot: the picture's path.
        protected: the dataset roots and mixture spec being read (URLs are skipped).
        overwrite: write over an existing file that is not a PNG (never a dataset's).

    Raises:
        ValueError: naming the path and why (the CLI prints it as one ``Error:`` line).
    """
    target = Path(os.path.abspath(plot))
    if not target.parent.is_dir():
        raise ValueError(f"--plot {plot}: the folder {target.parent} does not exist")
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return  # a new file
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(f"--plot {plot}: a symlink; the picture follows no link: give the path "
                         "it should be written to")  # fmt: skip
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"--plot {plot}: not a regular file (a folder, a pipe, a device)")
    if _is_png(str(target)):
        return  # a picture: replaced by the new one
    owner = _dataset_file(target, protected)
    if owner is not None:
        raise ValueError(f"--plot {plot}: {owner}: a picture is never written over a dataset's "
                         "files; give a path outside it")  # fmt: skip
    if not overwrite:
        raise ValueError(f"--plot {plot}: an existing file that is not a PNG picture; pass "
                         "--overwrite-plot to replace it, or give another path")  # fmt: skip


def save_png(fig: Any, path: str | Path) -> None:
    """Draw ``fig`` into a new temporary file beside ``path`` and rename it over ``path``
    (no symlink at ``path`` is followed: see the module docstring).

    Raises:
        ValueError: ``path`` is a symlink.
        OSError: the folder cannot be written (naming it).
    """
    target = Path(os.path.abspath(path))
    if target.is_symlink():
        raise ValueError(f"{path}: a symlink; the picture follows no link")
    tmp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "wb") as out:
            fig.savefig(out, format="png", dpi=100)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
