"""Remote, real server: wdstream reading ``http://`` from an nginx the bench starts itself.

moto (the S3 rows) is a Python server and bounds its own rows; nginx from the system
packages (``apt-get install nginx-light``) serves the dataset folder with ``sendfile`` and
answers ``Range`` natively, so these rows measure wdstream's HTTP path, not the server. The
child starts nginx as the current user with its own config in a temporary folder (listen
127.0.0.1 on a free port, root = the dataset folder, access log in that folder), reads
epoch 0 with fresh ``Loader`` objects (no cache: wdstream keeps none without ``cache_dir``)
from local disk and from nginx in interleaved rounds, counts the GETs nginx logged during
each read, and stops nginx at the end. Without an ``nginx`` binary the rows say so.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchlib.common import BATCH, SEQ_LEN, TOKENS_PER_BATCH
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, millions, ms, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

GOAL = 0.8  # nginx vs local disk, first epoch (issue 26)
AMPLIFICATION_GOAL = 1.1  # GETs and bytes per rank, 2 workers over 0 (issue 26)
NOT_INSTALLED = "skipped: nginx not installed"
_LOG_FORMAT = "$request_method $status $body_bytes_sent"


def nginx_binary() -> str | None:
    """The ``nginx`` executable: on ``PATH``, or where Debian puts it (``/usr/sbin``, often
    not on a non-root user's ``PATH``); None when it is not installed."""
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None


class Nginx:
    """An nginx serving ``root`` read-only on 127.0.0.1, for one ``with`` block.

    Everything it writes (config, pid, error and access logs, temp folders) is in its own
    temporary folder. :meth:`requests` parses the access-log lines since the last call.
    """

    def __init__(self, root: str, binary: str) -> None:
        self.root = str(Path(root).resolve())
        self.binary = binary
        self.tmp = Path(tempfile.mkdtemp(prefix="wdstream-bench-nginx-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def _config(self) -> str:
        t = self.tmp
        # temp paths of the modules this build has (a directive of a missing one is an error)
        built = subprocess.run([self.binary, "-V"], capture_output=True, text=True).stderr
        temps = [f"client_body_temp_path {t}/body;"] + [
            f"{m}_temp_path {t}/{m};"
            for m in ("proxy", "fastcgi", "uwsgi", "scgi")
            if f"--without-http_{m}_module" not in built
        ]
        # as root, nginx would hand its workers to ``nobody``, who cannot read a 0700
        # temp dir: name the current user (a non-root master ignores ``user`` with a warning)
        user = f"user {pwd.getpwuid(os.geteuid()).pw_name};" if os.geteuid() == 0 else ""
        return f"""{user}
worker_processes 2;
error_log {t}/error.log warn;
lock_file {t}/nginx.lock;
events {{ worker_connections 256; }}
http {{
    {" ".join(temps)}
    log_format bench '{_LOG_FORMAT}';
    access_log {t}/access.log bench;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{self.port};
        root {self.root};
        location / {{ }}
    }}
}}
"""

    def __enter__(self) -> Nginx:
        with socket.socket() as s:  # a free port (nginx binds it a moment later)
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        conf = self.tmp / "nginx.conf"
        conf.write_text(self._config())
        cmd = [self.binary, "-p", str(self.tmp), "-e", str(self.tmp / "error.log"), "-c",
               str(conf), "-g", f"daemon off; pid {self.tmp}/nginx.pid;"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        err = (self.tmp / "error.log").read_text(errors="replace").strip().splitlines()
        self.__exit__()
        raise RuntimeError(f"nginx did not start: {err[-1] if err else 'no error log'}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # fast shutdown of master and workers
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def requests(self) -> dict[str, int]:
        """GETs, other requests, error answers (status >= 400) and body bytes sent, from the
        access-log lines written since the last call.

        nginx writes a request's line just after its answer has gone out, so a client can
        hold the answer before the line is there (seen: the 404 of a test's second GET
        missing): the log is read once its size has not moved for 50 ms (at most 2 s)."""
        log = self.tmp / "access.log"
        size, deadline = log.stat().st_size, time.monotonic() + 2
        while time.monotonic() < deadline:
            time.sleep(0.05)
            size, was = log.stat().st_size, size
            if size == was:
                break
        with log.open("rb") as f:
            f.seek(self._log_offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self._log_offset += end
        out = {"gets": 0, "others": 0, "errors": 0, "bytes": 0}
        for line in data[:end].decode().splitlines():
            method, status, sent = line.split()
            out["gets" if method == "GET" else "others"] += 1
            out["errors"] += int(status) >= 400
            out["bytes"] += int(sent)
        return out


def _first_epochs(
    source: str, workers: int, min_seconds: float, min_passes: int = 2
) -> dict[str, Any]:
    """Epoch 0 with fresh ``Loader`` objects, at least ``min_passes`` times and until
    ``min_seconds`` of reading.

    ``tokens_per_s``: after each loader's first batch (its start-up is the first-batch
    rows' business), ``tokens_per_s_with_start``: from constructing it.
    """
    import wdstream

    passes, tokens, after_first, total, firsts = 0, 0, 0.0, 0.0, []
    while passes < min_passes or total < min_seconds:
        t0 = time.perf_counter()
        loader = wdstream.Loader(source, seq_len=SEQ_LEN, batch_size=BATCH, shuffle=True,
                                 seed=0, num_workers=workers, epochs=1)  # fmt: skip
        n, t1 = 0, t0
        for _ in loader:
            n += 1
            if n == 1:
                t1 = time.perf_counter()
        t2 = time.perf_counter()
        passes, tokens = passes + 1, tokens + (n - 1) * TOKENS_PER_BATCH
        after_first, total = after_first + (t2 - t1), total + (t2 - t0)
        firsts.append(t1 - t0)
    return {
        "tokens_per_s": tokens / after_first,
        "tokens_per_s_with_start": (tokens + passes * TOKENS_PER_BATCH) / total,
        "first_batch_s": sorted(firsts)[len(firsts) // 2],
        "passes": passes,
        "epoch_batches": n,
    }


def child_nginx(root: str, workers: list[int], repeats: int, min_seconds: float) -> dict[str, Any]:
    """Per ``"local/W"`` and ``"nginx/W"``: one first-epoch result per round."""
    binary = nginx_binary()
    if binary is None:
        return {"skipped": NOT_INSTALLED}
    out: dict[str, Any] = {"nginx_version": _version(binary)}
    with Nginx(root, binary) as server:
        for source in (root, server.url):  # imports, page cache, connections: not measured
            _first_epochs(source, 0, 0.0, min_passes=1)
        server.requests()
        contenders = [(w, src) for w in workers for src in ("local", "nginx")]
        for rnd, (w, src) in interleave(contenders, repeats):
            try:
                res = _first_epochs(root if src == "local" else server.url, w, min_seconds)
            except Exception as exc:  # the row says what failed; the other rows still run
                res = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            if src == "nginx":
                seen = server.requests()
                passes = res.get("passes", 1)
                res.update({k: v / passes for k, v in seen.items()})  # per epoch
                if seen["errors"] and "error" not in res:
                    res["error"] = f"nginx answered {seen['errors']} request(s) with an error"
            res["round"] = rnd
            out.setdefault(f"{src}/{w}", []).append(res)
    return out


def _version(binary: str) -> str:
    err = subprocess.run([binary, "-v"], capture_output=True, text=True).stderr.strip()
    return err.rsplit("/", 1)[-1] if "/" in err else err


def measure(b: Bench) -> dict[str, Any]:
    a = b.args
    root = b.path("wdstream:tiktoken")
    if not os.path.exists(root):
        return {"error": "no dataset (its pack failed)"}
    res = run_child("nginx", timeout=300, root=root, workers=b.workers, repeats=a.repeats,
                    min_seconds=a.min_seconds)  # fmt: skip
    b.log(f"remote nginx: {res.get('skipped') or b.brief(res, 'wall_s')}")
    return res


def section(x: dict[str, Any] | None, notes: list[str]) -> list[str]:
    """The nginx rows: a sub-section of the remote part."""
    head = ["### HTTP from a real server (nginx)", ""]
    if not x:
        return head + ["Not run.", ""]
    if "error" in x and "skipped" not in x:
        return head + [f"Not measured: {x['error']}", ""]
    rows, goals = [], []
    for w in (0, 2):
        local, runs = x.get(f"local/{w}"), x.get(f"nginx/{w}")
        if "skipped" in x:
            rows.append([w, "HTTP nginx", None, None, None, None, None, None, x["skipped"]])
            continue
        if runs is None:
            continue
        v, lv = value_spread(runs, "tokens_per_s"), value_spread(local, "tokens_per_s")
        first, gets = value_spread(runs, "first_batch_s"), value_spread(runs, "gets")
        mb = value_spread(runs, "bytes")
        vs_local = ratio_spread(runs, local, "tokens_per_s")
        goals.append(goal(f"nginx vs local disk, {w} workers", vs_local, GOAL))
        if vs_local and vs_local.mid < GOAL:
            notes.append(f"remote, {w} workers: from nginx on loopback wdstream reads the first "
                         f"epoch at {vs_local.fmt()} of its local-disk rate.")  # fmt: skip
        rows += [
            [w, "local disk", millions(lv.mid) if lv else None, "baseline", None, None, None,
             None, first_error(local) or "ok"],
            [w, "HTTP nginx", millions(v.mid) if v else None, vs_local,
             ratio_spread(runs, local, "tokens_per_s_with_start"), ms(first.mid) if first else None,
             f"{gets.mid:.0f}" if gets else None, f"{mb.mid / 1e6:.1f}" if mb else None,
             first_error(runs) or "ok"],
        ]  # fmt: skip
    text = [
        f"wdstream `Loader` reading `http://127.0.0.1:PORT/` from nginx "
        f"{x.get('nginx_version', '')} (system package, started by the bench: its own config, "
        "`sendfile on`, root = the wdstream dataset folder, `Range` answered by nginx itself) "
        "against the same dataset on local disk (warm page cache for both). Epoch 0 of fresh "
        "loaders (`epochs=1`, no cache), repeated until the minimum time; M tokens/s after "
        'each loader\'s first batch, "with start" from constructing it. GETs and MB: what '
        "nginx logged per epoch. Ratios: per round, median (min–max).",
        "",
        table(
            [
                "workers",
                "source",
                "M tokens/s",
                "vs local",
                "vs local, with start",
                "first batch ms",
                "GETs",
                "MB sent",
                "status",
            ],
            rows,
        ),  # fmt: skip
        "",
    ]
    zero, two = x.get("nginx/0"), x.get("nginx/2")
    if zero and two:  # one rank: what the rank fetches per epoch, 2 workers against none
        goals += [goal("GETs per epoch, 2 workers / 0", ratio_spread(two, zero, "gets"),
                       AMPLIFICATION_GOAL, True),
                  goal("bytes per epoch, 2 workers / 0", ratio_spread(two, zero, "bytes"),
                       AMPLIFICATION_GOAL, True)]  # fmt: skip
    if goals:
        text += ["Goals (nginx vs local disk, first epoch; what a rank fetches at 2 workers "
                 "against 0): " + "; ".join(goals) + ".", ""]  # fmt: skip
    return head + text
