"""What the test fork servers (tests/cli_server.py, tests/script_server.py) share: the parent's
side (one JSON request a line on the server's stdin, two JSON answers a line on its stdout:
the child's pid as it starts, then how it ended; a child past its timeout killed) and the
forked child's start and end as a fresh process's."""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import Any


class ServerLines:
    """The request and answer lines of one server process ``proc`` (stdin and stdout pipes)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pending = b""  # read from the server, not yet a whole line

    def _answer(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next line as JSON; None if none came within ``timeout`` seconds."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready = select.poll()  # not select(): a test process may hold over 1023 descriptors
        ready.register(fd, select.POLLIN)
        while b"\n" not in self.pending:
            if timeout is not None and not ready.poll(timeout * 1000):
                return None
            chunk = os.read(fd, 4096)
            assert chunk, "the test's fork server ended"
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, request: dict[str, Any], timeout: float, argv: list[str]) -> dict[str, Any]:
        """Send ``request``; return the answer saying how its child ended (``status``, the
        wait status, and what else the server adds). A child still running after ``timeout``
        seconds is killed and ``subprocess.TimeoutExpired`` raised for ``argv``."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            started = self._answer(None)
            assert started is not None
            done = self._answer(timeout)
            if done is None:
                os.kill(started["pid"], signal.SIGKILL)
                self._answer(None)
                raise subprocess.TimeoutExpired(argv, timeout)
        except subprocess.TimeoutExpired:
            raise
        except BaseException:
            # Its answers are no longer in step with the requests: end it, so that the
            # owner starts a fresh one for the next request instead of reading this one's.
            self.proc.kill()
            self.proc.wait()
            raise
        return done


def enter_child(req: dict[str, Any], stdin: str) -> None:
    """In a forked child: the request's working directory and environment, ``stdin`` read
    from that file and stdout / stderr written to the request's ``out`` / ``err`` files."""
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    for fd, path, flags in ((0, stdin, os.O_RDONLY),
                            (1, req["out"], os.O_WRONLY | os.O_TRUNC),
                            (2, req["err"], os.O_WRONLY | os.O_TRUNC)):  # fmt: skip
        new = os.open(path, flags)
        os.dup2(new, fd)
        os.close(new)


def exit_status(exc: SystemExit) -> int:
    """The exit status Python gives ``sys.exit(code)``: a message printed to stderr is 1."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def flush_std_streams() -> None:
    """Flush stdout and stderr as an ending process does (a closed one is not an error)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def serve(
    preload: Iterable[str],
    run_child: Callable[[dict[str, Any]], None],
    warm: Callable[[], object] | None = None,
) -> None:
    """A server's loop: import ``preload`` (then call ``warm``), then fork one child per
    request line on stdin (``run_child`` never returns in it), answering its pid at once and
    its ``wait4`` status and peak RSS when it ends. At the end of stdin the server ends at
    once (``os._exit``; every child was waited for): finalising an interpreter that imported
    torch, ``torch._dynamo`` and pandas took ~1 s of CPU, and the test process waits for it
    (script_server's ``close``), up to ~3.5 s at the end of a whole-suite run with every
    worker's server finalising at once."""
    for name in preload:
        importlib.import_module(name)
    if warm is not None:
        warm()
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(req)
        print(json.dumps({"pid": pid}), flush=True)
        _, status, usage = os.wait4(pid, 0)
        print(json.dumps({"status": status, "maxrss_kb": usage.ru_maxrss}), flush=True)
    flush_std_streams()
    os._exit(0)
