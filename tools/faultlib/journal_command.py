"""The pack journal's command object (journal version 3, ``docs/FORMAT.md`` "Resume
journal"): a real ``wdstream pack`` SIGKILLed at exact points around it, and hostile or stale
journal states left for a rerun.

Kills: the CLI in a fresh process whose store operations are counted; it SIGKILLs itself
before/after writing the command object, after its first live journal, after a segment (the
segment size cut to 3 shards in both runs, so segments exist), after ``index.json``, and inside
``Journal.remove`` (after the live journal's removal, before the command object's). Over 0
workers, 2 workers (shards built in the token pool), ``--holdout 0.25``, a chat pack whose
template prints ``strftime_now`` (killed with ``--chat-now``, rerun without: the time must come
back from the command object), an output on moto's S3 server (every write a PUT) and the Ray
engine on a real 2-node ``ray.cluster_utils.Cluster`` (3 points). Then the
same command again (on S3 with ``--force-unlock``: a remote lock cannot tell a dead pack).
Hostile states on a pack killed after 2 commits: a stray command object of another command
with no live journal, the named command replaced by another pack's, empty,
cut, non-JSON, 1 GiB sparse, 100,000-deep JSON (named by sha256 or not), a fingerprint that is
no object, a version-2 journal beside another pack's command object, a ``command`` field of
every JSON type, a directory and a FIFO in its place; then ``--overwrite``. ``wdstream stats``
on each interrupted state.

Oracles outside the code under test: the uninterrupted pack's every file (sha256; a chat
pack's packed again with the ``now`` its ``index.json`` records), no ``.wdstream-pack*`` file
left after a finished pack (or the rerun refusing a complete dataset); the CLI's stderr (one
``Error:`` line naming the journal or command object, no traceback, no ``index.json``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from faultlib.common import Attempt, corpus_lines, labelled, run_cli

C, J, S0 = ".wdstream-pack-command.json", ".wdstream-pack.json", ".wdstream-pack-000000.json"
COMPLETE = "already holds a complete dataset"
NOW = "2024-05-01T10:00:00"
DATED = "{{- '<|im_start|>system\\nToday is ' + strftime_now('%d %B %Y') + '<|im_end|>\\n' -}}"
# The CLI with its store's writes and deletes counted: SIGKILL at (op, name, n, before/after).
_DRIVER = """
import json, os, signal, sys
spec = json.loads(sys.argv[1])
from wdstream.storage.base import Store
from wdstream.storage.local import LocalStore
from wdstream.storage.s3 import S3Store
import wdstream.write.journal as journal
journal.SEGMENT = spec["segment"]
kill, seen = spec["kill"], {}
def hit(op, name, when):
    if kill and [op, name, when] == [kill[0], kill[1], kill[3]]:
        seen[name] = seen.get(name, 0) + 1
        if seen[name] == kill[2]:
            os.kill(os.getpid(), signal.SIGKILL)
real_write = Store.write_bytes
def write_bytes(self, name, data):
    hit("write", name, "before"); real_write(self, name, data); hit("write", name, "after")
Store.write_bytes = write_bytes
def counted(real):
    def delete(self, name):
        hit("delete", name, "before"); real(self, name); hit("delete", name, "after")
    return delete
LocalStore.delete, S3Store.delete = counted(LocalStore.delete), counted(S3Store.delete)
from wdstream.cli import main
main(["pack", *spec["args"]], prog_name="wdstream")
"""
POINTS = [("write", C, 1, "before"), ("write", C, 1, "after"), ("write", J, 1, "after"),
          ("write", S0, 1, "after"), ("write", "index.json", 1, "after"),
          ("delete", J, 1, "after"), ("delete", C, 1, "before")]  # fmt: skip
CONFIGS = ("0 workers", "2 workers", "holdout", "chat", "s3", "ray")


class _Setup:
    """The inputs, options and references of one configuration (built once, cached)."""

    def __init__(self, work: Path, config: str) -> None:
        self.work, self.config = work / "journal-command", config
        self.work.mkdir(parents=True, exist_ok=True)
        opts = {"0 workers": ["--workers", "0"], "2 workers": ["--workers", "2"],
                "holdout": ["--workers", "0", "--holdout", "0.25"], "chat": ["--workers", "0"],
                "s3": ["--workers", "0"]}[config]  # fmt: skip
        if config == "chat":
            from faultlib.chat import _support, chat_tokenizer, conversations

            support: Any = _support()
            template, src = self.work / "dated.jinja", self.work / "chat.jsonl"
            if not src.exists():  # once: a rewrite would change the inputs' fingerprint
                template.write_text(DATED + support.CHATML_GENERATION)
                src.write_text("".join(json.dumps({"messages": m}) + "\n"
                                       for m in conversations(150, seed=7)))  # fmt: skip
            opts += ["--chat", "--tokenizer", str(chat_tokenizer(work)), "--chat-template",
                     str(template), "--seq-len", "95", "--shard-size", "6KB"]  # fmt: skip
        else:
            src = self.work / "in.jsonl"
            if not src.exists():
                src.write_text("\n".join(corpus_lines(300)) + "\n")
            opts += ["--seq-len", "63", "--shard-size", "16KB"]
        self.src, self.opts = src, opts

    def args(self, out: str, now: str | None = None) -> list[str]:
        return [str(self.src), "-o", out, "-q", *self.opts, *(["--chat-now", now] if now else [])]

    def reference(self, now: str | None = None) -> dict[str, str]:
        """sha256 of every file of the uninterrupted pack (local), cached."""
        ref = self.work / f"ref-{self.config}-{now or ''}".replace(":", "")
        if not (ref / "index.json").exists():
            shutil.rmtree(ref, ignore_errors=True)
            rc, err = drive(self.args(str(ref), now), None)
            assert rc == 0, err
        return local_tree(ref)


def drive(args: list[str], kill: tuple | None, env: dict[str, str] | None = None,
          segment: int = 3) -> tuple[int, str]:  # fmt: skip
    spec = json.dumps({"args": args, "kill": kill, "segment": segment})
    proc = subprocess.run([sys.executable, "-c", _DRIVER, spec], capture_output=True, text=True,
                          timeout=240, env=env, stdin=subprocess.DEVNULL)  # fmt: skip
    return proc.returncode, proc.stderr


def local_tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def _errors(err: str) -> list[str]:
    # What the rerun after a kill says of the lock it takes (local; S3 with --force-unlock).
    said = ("taking over the lock of a pack that is gone", "--force-unlock: removing the lock")
    return [line for line in err.strip().splitlines()
            if line.strip() and not any(s in line for s in said)]  # fmt: skip


def judge_rerun(rc: int, err: str, got: dict[str, str], want: dict[str, str]) -> str:
    """The same command after a kill: the uninterrupted pack's files, nothing else (a
    complete dataset refused as such counts when its files are the uninterrupted ones)."""
    if "Traceback" in err:
        return f"crash: {err.strip()[-300:]}"
    lines = _errors(err)
    if rc != 0 and not (len(lines) == 1 and COMPLETE in lines[0]):
        return f"crash: the rerun failed: {' | '.join(lines)[-300:]}"
    if got == want:
        return "handled"
    extra = sorted(set(got) - set(want))
    return f"silent wrong: {len(extra)} files more ({extra[:3]}), {len(set(want) - set(got))} fewer"


class _S3:
    """A moto S3 server for one attempt: the output ``s3://BUCKET/out``."""

    def __enter__(self) -> _S3:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY":
                    "testing", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_ENDPOINT_URL": f"http://{host}:{port}"}  # fmt: skip
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            self.env.pop(var, None)
        self.client = boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"],
                                   aws_access_key_id="testing", aws_secret_access_key="testing",
                                   region_name="us-east-1")  # fmt: skip
        self.client.create_bucket(Bucket="journal")
        return self

    def tree(self) -> dict[str, str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket="journal", Prefix="out/"
        )
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        return {k.removeprefix("out/"): hashlib.sha256(self.client.get_object(
            Bucket="journal", Key=k)["Body"].read()).hexdigest() for k in sorted(keys)}  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def killed(work: Path, config: str, point: tuple) -> Attempt:
    def run() -> str:
        setup = _Setup(work, "0 workers" if config == "ray" else config)
        label = f"{config}, SIGKILL {point[3]} {point[0]} of {point[1]} #{point[2]}"
        if config == "s3":
            with _S3() as s3:
                args = setup.args("s3://journal/out")
                rc, err = drive(args, point, s3.env)
                if rc != -9:
                    return labelled(label, f"crash: the kill missed ({rc}: {err[-200:]})")
                # A remote store's lock cannot tell a dead pack: the documented rerun after a
                # kill (docs/PACK.md "the lock") is the same command with --force-unlock.
                rc, err = drive([*args, "--force-unlock"], None, s3.env)
                return labelled(label, judge_rerun(rc, err, s3.tree(), setup.reference()))
        if config == "ray":
            return labelled(label, _killed_on_ray(_Setup(work, "0 workers"), point))
        out = setup.work / "out"
        shutil.rmtree(out, ignore_errors=True)
        chat = config == "chat"
        rc, err = drive(setup.args(str(out), NOW if chat else None), point)
        if rc != -9:
            return labelled(label, f"crash: the kill missed ({rc}: {err[-200:]})")
        resumes = (out / J).exists()
        rc, err = drive(setup.args(str(out)), None)  # a chat rerun is not told the time
        now = None
        if chat and (out / "index.json").exists():
            now = json.loads((out / "index.json").read_text())["stats"]["chat"]["now"]
            if resumes and now != NOW:
                return labelled(label, f"silent wrong: resumed with now {now}, not {NOW}")
        return labelled(label, judge_rerun(rc, err, local_tree(out), setup.reference(now)))

    return run


def _killed_on_ray(setup: _Setup, point: tuple) -> str:
    """The pack on a real 2-node ``ray.cluster_utils.Cluster`` started here (loopback only),
    its driver SIGKILLed at ``point``, then rerun on the same cluster; oracle: the local
    pack (the Ray engine's output is byte-identical to it, ``docs/RAY.md``)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # addresses stay on 127.0.0.1
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, object_store_memory=80 << 20,
                             node_ip_address="127.0.0.1")  # fmt: skip
        out = setup.work / "out-ray"
        shutil.rmtree(out, ignore_errors=True)
        args = [*setup.args(str(out)), "--engine", "ray", "--ray-address", cluster.address]
        rc, err = drive(args, point)
        if rc != -9:
            return f"crash: the kill missed ({rc}: {err[-200:]})"
        rc, err = drive(args, None)
        if "Traceback" not in err:  # Ray's own log lines on stderr are not the pack's
            err = "\n".join(line for line in err.splitlines() if line.startswith("Error:"))
        return judge_rerun(rc, err, local_tree(out), setup.reference())
    finally:
        cluster.shutdown()


HOSTILE = ("stray other command, no journal", "command replaced by another pack's", "empty",
           "cut", "not JSON", "1 GiB sparse", "empty, named", "cut, named", "not JSON, named",
           "100,000-deep, named", "100,000-deep live journal", "fingerprint a list, named",
           "fingerprint a string, named", "input_ctimes a string, named",
           "version 2 beside another pack's command", "command null", "command 5",
           "command list", "command object", "command true", "a directory", "a FIFO")  # fmt: skip
# States whose rerun must resume (the damage touches nothing it reads) or start afresh.
RESUMES = ("stray other command, no journal", "input_ctimes a string, named",
           "version 2 beside another pack's command")  # fmt: skip


def _damage(out: Path, other: Path, name: str) -> None:
    c, j = out / C, out / J
    live = json.loads(j.read_text())

    def named(data: bytes) -> None:
        c.write_bytes(data)
        j.write_text(json.dumps({**live, "command": hashlib.sha256(data).hexdigest()}))

    deep = b"[" * 100_000 + b"]" * 100_000
    plain = {"empty": b"", "cut": c.read_bytes()[:50], "not JSON": b"\xff\xfe not json"}
    base = name.removesuffix(", named")
    if name == "stray other command, no journal":
        shutil.copy(other / C, c)
        j.unlink()
    elif name == "command replaced by another pack's":
        shutil.copy(other / C, c)
    elif name in plain:
        c.write_bytes(plain[name])
    elif base in plain:
        named(plain[base])
    elif name == "1 GiB sparse":
        with c.open("r+b") as f:
            f.truncate(1 << 30)
    elif name == "100,000-deep, named":
        named(deep)
    elif name == "100,000-deep live journal":
        j.write_bytes(deep)
    elif name.startswith("fingerprint a "):
        named(b'{"fingerprint": [1, 2]}' if "list" in name else b'{"fingerprint": "abc"}')
    elif name == "input_ctimes a string, named":
        named(json.dumps({**json.loads(c.read_bytes()), "input_ctimes": "x"}).encode())
    elif name == "version 2 beside another pack's command":
        command = json.loads(c.read_bytes())
        j.write_text(json.dumps({**{k: v for k, v in live.items() if k != "command"},
                                 **command, "version": 2}))  # fmt: skip
        shutil.copy(other / C, c)
    elif name.startswith("command "):
        value = {"null": None, "5": 5, "list": [live["command"]], "object": {"a": 1},
                 "true": True}[name.split(" ", 1)[1]]  # fmt: skip
        j.write_text(json.dumps({**live, "command": value}))
    elif name == "a directory":
        c.unlink()
        c.mkdir()
    else:
        c.unlink()
        os.mkfifo(c)


def hostile(work: Path, name: str) -> Attempt:
    def run() -> str:
        setup = _Setup(work, "0 workers")
        base, other = setup.work / "killed-base", setup.work / "killed-other"
        for root, extra in ((base, []), (other, ["--seq-len", "31"])):
            if not (root / J).exists():  # interrupted after 2 commits
                shutil.rmtree(root, ignore_errors=True)
                drive([*setup.args(str(root)), *extra], ("write", J, 2, "after"))
        out = setup.work / "hostile"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(base, out)
        _damage(out, other, name)
        stats = run_cli(["stats", str(out)], 60, names=str(out))
        if stats != "clear error":
            return labelled(f"{name}: stats", stats)
        want = setup.reference()
        rc, err = drive(setup.args(str(out)), None)
        if name in RESUMES:
            return labelled(name, judge_rerun(rc, err, local_tree(out), want))
        lines = _errors(err)
        if "Traceback" in err or rc == 0 or len(lines) != 1 or not lines[0].startswith("Error:"):
            return labelled(name, f"crash: rc {rc}: {err.strip()[-300:]}")
        if ".wdstream-pack" not in lines[0] or (out / "index.json").exists():
            return labelled(name, f"crash: the error names no journal file: {lines[0][:300]}")
        if name == "a directory":  # what --overwrite cannot delete: the user does
            (out / C).rmdir()
        rc, err = drive([*setup.args(str(out)), "--overwrite"], None)
        outcome = judge_rerun(rc, err, local_tree(out), want)
        return "clear error" if outcome == "handled" else labelled(f"{name}: --overwrite", outcome)

    return run


def interrupted_reads(work: Path, point: tuple) -> Attempt:
    """``wdstream stats`` on an output holding only a pack killed at ``point``."""

    def run() -> str:
        setup = _Setup(work, "0 workers")
        out = setup.work / "stats"
        shutil.rmtree(out, ignore_errors=True)
        drive(setup.args(str(out)), point)
        return labelled(f"stats after {point}", run_cli(["stats", str(out)], 60, names=str(out)))

    return run


def journal_commands(work: Path, scale: float) -> Iterator[Attempt]:
    """Every kill point in every configuration (S3 and chat at fewer points at small
    scales), the hostile states, and the reads of interrupted outputs."""
    for config in CONFIGS:
        points = POINTS if scale >= 1 or config in ("0 workers", "holdout") else POINTS[1::2]
        if config == "ray":  # a cluster per attempt: the points where the journal changes
            points = [POINTS[1], POINTS[2], POINTS[5]]
        for point in points:
            yield killed(work, config, point)
    for name in HOSTILE:
        yield hostile(work, name)
    for point in POINTS[1:4]:
        yield interrupted_reads(work, point)
