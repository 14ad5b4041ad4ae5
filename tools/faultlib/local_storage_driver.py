"""One attempt of ``faultlib.local_storage``, run as a fresh process (in a mount namespace of
its own where it needs a small tmpfs): serves the dataset over the tests' HTTP file server,
reads it with the node cache or the workers' piece exchange while a fault hits local
storage from batch ``at`` on, and prints one JSON outcome line.

Usage: ``python local_storage_driver.py '{"root": ..., "cache": ..., "workers": 2, ...}'``.
Faults (from batch ``at``; before the loader opens the dataset where ``at`` < 0): ``fill`` (a file fills the filesystem of ``target``), ``clear`` (the contents of
``target`` removed, again and again), ``cut`` (block or piece files under ``target``
truncated in place, again and again), ``fifo`` (block files replaced by named pipes, again
and again), ``none`` (the filesystem as the caller set it up).
Oracle: the same Loader over the local folder, no cache, no workers: every batch equal
(``torch.equal``), and the second half read again from the state saved at the middle.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

KW = {"seq_len": 1024, "batch_size": 8, "shuffle": True, "seed": 3, "epochs": 1}


def _fill(target: str, stop: threading.Event) -> None:
    """Write a file under ``target`` until its filesystem is full (then keep it full)."""
    with open(os.path.join(target, ".filler"), "ab") as f:
        while not stop.is_set():
            try:
                f.write(b"\0" * 65536)
                f.flush()
            except OSError:
                break


def _again_and_again(fn: object, stop: threading.Event) -> None:
    while not stop.wait(0.02):
        fn()  # type: ignore[operator]


def _clear(target: str) -> None:
    for entry in glob.glob(os.path.join(target, "*")):
        shutil.rmtree(entry, ignore_errors=True)


def _cut(pattern: str, frac: float) -> None:
    for path in glob.glob(pattern):
        try:
            os.truncate(path, int(os.path.getsize(path) * frac))
        except OSError:
            pass  # gone meanwhile


def _fifo(pattern: str) -> None:
    for path in glob.glob(pattern):
        try:
            os.unlink(path)
            os.mkfifo(path)
        except OSError:
            pass  # gone or made meanwhile


def _fault(spec: dict, stop: threading.Event) -> threading.Thread:
    fault, target = spec["fault"], spec["target"]
    if fault == "fill":
        job = threading.Thread(target=_fill, args=(target, stop))
    elif fault == "clear":
        job = threading.Thread(target=_again_and_again, args=(lambda: _clear(target), stop))
    elif fault == "fifo":
        job = threading.Thread(target=_again_and_again, args=(lambda: _fifo(target), stop))
    else:
        cut = lambda: _cut(target, spec["frac"])  # noqa: E731 - a glob pattern
        job = threading.Thread(target=_again_and_again, args=(cut, stop))
    job.daemon = True
    job.start()
    return job


def main() -> None:
    import torch
    from servers import FileServer

    from wdstream import Loader, WdstreamError

    spec = json.loads(sys.argv[1])
    want = [b["input_ids"] for b in Loader(spec["root"], num_workers=0, **KW)]
    opts = {"num_workers": spec["workers"], **KW}
    if spec["cache"]:
        opts["cache_dir"] = spec["cache"]
    stop = threading.Event()
    if spec["at"] < 0:  # before the loader opens the dataset (a fill runs until full)
        job = _fault(spec, stop)
        if spec["fault"] == "fill":
            job.join()
    try:
        with FileServer(spec["root"]) as server, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "cache full": said once, not the outcome
            if spec.get("prefill"):
                sum(1 for _ in Loader(server.base_url, **opts))  # an epoch fills the cache
            loader = Loader(server.base_url, **opts)
            got, mid, state = [], len(want) // 2, None
            for i, batch in enumerate(loader):
                if i == spec["at"] and spec["fault"] != "none":
                    _fault(spec, stop)
                got.append(batch["input_ids"])
                if i == mid:
                    state = loader.state_dict()
            again = Loader(server.base_url, **opts)
            again.load_state_dict(state)
            resumed = [b["input_ids"] for b in again]
    except WdstreamError as exc:
        print(json.dumps(f"clear error: {exc}"[:300]))
        return
    except OSError as exc:
        said = "clear error" if exc.filename or "/" in str(exc) else "crash"
        print(json.dumps(f"{said}: {type(exc).__name__}: {exc}"[:300]))
        return
    except Exception as exc:  # noqa: BLE001 - a torch worker killed (SIGBUS), anything else
        print(json.dumps(f"crash: {type(exc).__name__}: {exc}"[:300]))
        return
    finally:
        stop.set()
    same = len(got) == len(want) and all(map(torch.equal, got, want))
    same = same and len(resumed) == len(want) - mid - 1
    same = same and all(map(torch.equal, resumed, want[mid + 1 :]))
    print(json.dumps("handled" if same else "silent wrong: batches differ from the local read"))


if __name__ == "__main__":
    main()
