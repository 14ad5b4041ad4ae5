"""``python -m wdstream.cli ARGS`` in a child process, forked from one server per test process
that imported the CLI's modules once.

Each command is still a process of its own (its exit status, an abort's signal, its stdout
and stderr, its peak RSS as ``wait4`` reports it), with the caller's working directory,
environment and no stdin; what it no longer does is start Python and import wdstream, click,
numpy and tiktoken again: ~0.3 s of CPU of the ~0.6 s a small ``pack`` takes here, for each
of the suite's many CLI children. The server runs this file as a script; it reads one JSON
request a line on stdin and answers on stdout with the child's pid, then its status
(``python -c "from tests.cli_server import _serve; _serve()"``, started at the first command).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# What a CLI child imports anyway (the commands' own modules, the tokenizers' and templates'
# libraries), imported once by the server. No torch: a forked child's peak RSS starts at the
# server's (test_chat_budget bounds it), and a fresh ``wdstream`` process does not load it.
PRELOAD = ("wdstream.cli", "wdstream.cli_pack", "wdstream.cli_stats", "wdstream.cli_explain",
           "wdstream.write.writer", "tiktoken", "tiktoken_ext.openai_public", "jinja2")  # fmt: skip


def _run_child(req: dict[str, Any]) -> None:
    """In the forked child: become ``python -m wdstream.cli ARGV`` and exit with its status."""
    import runpy
    import traceback

    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    for fd, path, flags in ((0, req["stdin"], os.O_RDONLY),
                            (1, req["out"], os.O_WRONLY | os.O_TRUNC),
                            (2, req["err"], os.O_WRONLY | os.O_TRUNC)):  # fmt: skip
        new = os.open(path, flags)
        os.dup2(new, fd)
        os.close(new)
    sys.argv = [str(ROOT / "wdstream" / "cli.py"), *req["argv"]]
    sys.path[0] = req["cwd"]  # as ``python -m`` puts the working directory first
    # as in ``python -m``: the package imported, its ``cli`` module not (it runs as __main__)
    sys.modules.pop("wdstream.cli", None)
    code = 0
    try:
        runpy.run_module("wdstream.cli", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # as a process ending normally does
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:  # as Python ends on an uncaught KeyboardInterrupt: by the signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _serve() -> None:
    """The server: preload, then fork one child per request line, answering its pid at once
    and its ``wait4`` status and peak RSS when it ends."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(req)
        print(json.dumps({"pid": pid}), flush=True)
        _, status, usage = os.wait4(pid, 0)
        print(json.dumps({"status": status, "maxrss_kb": usage.ru_maxrss}), flush=True)


class _Server:
    """This test process's server, started at its first command."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending = b""  # read from the server, not yet a whole line

    def _started(self) -> subprocess.Popen[bytes]:
        if self.proc is None or self.proc.poll() is not None:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
            code = "from tests.cli_server import _serve; _serve()"
            self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, cwd=ROOT, env=env)  # fmt: skip
            self.pending = b""
            atexit.register(self.proc.kill)
        return self.proc

    def _answer(self, fd: int, timeout: float | None) -> dict[str, Any] | None:
        """The server's next line as JSON; None if none came within ``timeout`` seconds."""
        while b"\n" not in self.pending:
            if timeout is not None and not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 4096)
            assert chunk, "the CLI server ended"
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(
        self,
        argv: list[str],
        cwd: Path,
        timeout: float,
        stdin: str = os.devnull,
        env: dict[str, str] | None = None,
    ) -> tuple[int, str, str, int]:
        """``(returncode, stdout, stderr, peak RSS in KiB)`` of one command: in ``cwd``, with
        this process's environment and ``env``, reading the file ``stdin``."""
        with self.lock, tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp, "out"), Path(tmp, "err")
            out.touch()
            err.touch()
            proc = self._started()
            assert proc.stdin is not None and proc.stdout is not None
            req = {"argv": argv, "cwd": str(cwd), "env": {**os.environ, **(env or {})},
                   "stdin": stdin, "out": str(out), "err": str(err)}  # fmt: skip
            proc.stdin.write(json.dumps(req).encode() + b"\n")
            proc.stdin.flush()
            fd = proc.stdout.fileno()
            started = self._answer(fd, None)
            assert started is not None
            done = self._answer(fd, timeout)
            if done is None:
                os.kill(started["pid"], signal.SIGKILL)
                self._answer(fd, None)
                raise subprocess.TimeoutExpired(["wdstream", *argv], timeout)
            rc = os.waitstatus_to_exitcode(done["status"])
            return rc, out.read_text(), err.read_text(), done["maxrss_kb"]


_SERVER = _Server()


def run_cli(
    *args: str,
    timeout: float = 120,
    cwd: Path | None = None,
    stdin: str = os.devnull,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m wdstream.cli ARGS`` in a child process (forked from the server) in ``cwd``
    (this process's by default), reading the file ``stdin``, with this process's environment
    and ``env``: as ``subprocess.run(..., capture_output=True, text=True)`` returns it."""
    rc, out, err, _ = _SERVER.run(list(args), cwd or Path.cwd(), timeout, stdin, env)
    return subprocess.CompletedProcess([sys.executable, "-m", "wdstream.cli", *args], rc, out, err)


def run_cli_peak(*args: str, timeout: float = 120) -> tuple[int, str, int]:
    """``(returncode, stderr, peak RSS in MiB)`` of ``wdstream ARGS`` in a child process."""
    rc, _, err, peak_kb = _SERVER.run(list(args), Path.cwd(), timeout)
    return rc, err, peak_kb // 1024
