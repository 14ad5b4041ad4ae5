"""``python SCRIPT ARGS`` (or ``python -c CODE ARGS``) in a child process forked from a server
that imported a given list of modules once: for the tests whose children start torch.

Each run is still a process of its own, with a fresh ``__main__`` (the script's globals start
empty: a name it does not import or define is still a ``NameError``), its exit status, stdout
and stderr, the caller's working directory and environment, no stdin, and its threads and
``atexit`` handlers run as a process ending normally runs them. What it no longer does is
import torch (~1.4 s of CPU here) and ``torch._dynamo`` (~1.5 s, imported by the first
optimizer a script makes) itself. So a server preloads only what its children's scripts
import anyway, before doing anything else: a module the server imported that a script's own
imports would not have brought in could hide a missing import in that script.

One server at a time in each test process, for one preload list and environment, started at
the first run that asks for them, reading one JSON request a line on stdin and answering on
stdout with the child's pid, then its wait status; it ends when the test process closes
its stdin (and is waited for, so its children's CPU time is counted in the test process's as
a fresh child's would be).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.server_lines import ServerLines, enter_child, exit_status, flush_std_streams, serve

ROOT = Path(__file__).resolve().parents[1]


def _run_child(req: dict[str, Any]) -> None:
    """In the forked child: become ``python ARGV`` and exit with its status."""
    import traceback
    import types

    enter_child(req, os.devnull)
    argv = req["argv"]
    main = types.ModuleType("__main__")
    if argv[0] == "-c":
        source, filename = argv[1], "<string>"
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
    else:
        filename = os.path.abspath(argv[0])
        source = Path(filename).read_text(encoding="utf-8")
        main.__file__ = filename
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.realpath(filename))
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(source, filename, "exec"), main.__dict__)
    except SystemExit as exc:
        code = exit_status(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # as interpreter exit joins threads
    atexit._run_exitfuncs()
    flush_std_streams()
    os._exit(code)


def _serve(preload: list[str]) -> None:
    """The server: import ``preload``, then fork one child per request line."""
    serve(preload, _run_child)


class _Server:
    """One server of this test process."""

    def __init__(self, preload: tuple[str, ...], env: dict[str, str]) -> None:
        self.lock = threading.Lock()
        code = f"from tests.script_server import _serve; _serve({list(preload)!r})"
        path = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=ROOT,
                                     env={**env, "PYTHONPATH": path})  # fmt: skip
        self.lines = ServerLines(self.proc)
        atexit.register(self.close)

    def close(self) -> None:
        """End the server (its stdin closed) and wait for it; kill it if a child it waits for
        (left by an interrupted run) does not end within 30 s."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> tuple[int, str, str]:
        """``(returncode, stdout, stderr)`` of ``python ARGV`` in ``cwd`` with ``env``."""
        with self.lock, tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            out.touch()
            err.touch()
            req = {"argv": argv, "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
            done = self.lines.run(req, timeout, [sys.executable, *argv])
            rc = os.waitstatus_to_exitcode(done["status"])
            return rc, out.read_text(), err.read_text()


_SERVER: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], _Server] = {}


def run_python(
    *argv: str,
    preload: tuple[str, ...],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` in a child forked from the server that imported ``preload``, in ``cwd``
    (this process's by default), with this process's environment and ``env`` (the server
    too: what torch reads when it is imported, such as ``OMP_NUM_THREADS``): as
    ``subprocess.run(..., capture_output=True, text=True)`` returns it."""
    full_env = {**os.environ, **(env or {})}
    key = (preload, tuple(sorted((env or {}).items())))
    if key not in _SERVER or _SERVER[key].proc.poll() is not None:
        for other in _SERVER.values():  # one server at a time: each holds torch's memory
            other.close()
        _SERVER.clear()
        _SERVER[key] = _Server(preload, full_env)
    rc, out, err = _SERVER[key].run(list(argv), cwd or Path.cwd(), full_env, timeout)
    return subprocess.CompletedProcess([sys.executable, *argv], rc, out, err)
