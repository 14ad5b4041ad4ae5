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
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.server_lines import ServerLines, enter_child, exit_status, flush_std_streams, serve

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

    enter_child(req, req["stdin"])
    sys.argv = [str(ROOT / "wdstream" / "cli.py"), *req["argv"]]
    sys.path[0] = req["cwd"]  # as ``python -m`` puts the working directory first
    # as in ``python -m``: the package imported, its ``cli`` module not (it runs as __main__)
    sys.modules.pop("wdstream.cli", None)
    code = 0
    try:
        runpy.run_module("wdstream.cli", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exit_status(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # as a process ending normally does
    flush_std_streams()
    if code < 0:  # as Python ends on an uncaught KeyboardInterrupt: by the signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _warm() -> None:
    """Load cl100k in the server, the tokenizer most of the tests' commands use (~0.18 s of
    CPU a child; ~40 MB more of a child's peak RSS, which test_chat_budget bounds at 1 GB).
    A child still resolves the name through wdstream's loader (tiktoken caches the
    encoding); where it cannot be loaded, the child that needs it says why."""
    from wdstream.tokenizers.load import load_tokenizer

    try:
        load_tokenizer("cl100k_base")
    except Exception:  # noqa: BLE001 - reported by the child that needs it
        pass


def _serve() -> None:
    """The server: preload, then fork one child per request line."""
    serve(PRELOAD, _run_child, warm=_warm)


class _Server:
    """This test process's server, started at its first command."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lines: ServerLines | None = None

    def _started(self) -> ServerLines:
        if self.lines is None or self.lines.proc.poll() is not None:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
            code = "from tests.cli_server import _serve; _serve()"
            proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, cwd=ROOT, env=env)  # fmt: skip
            atexit.register(proc.kill)
            self.lines = ServerLines(proc)
        return self.lines

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
            req = {"argv": argv, "cwd": str(cwd), "env": {**os.environ, **(env or {})},
                   "stdin": stdin, "out": str(out), "err": str(err)}  # fmt: skip
            done = self._started().run(req, timeout, ["wdstream", *argv])
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
