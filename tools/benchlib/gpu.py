"""GPU: does a training step ever wait for wdstream? (``--gpu`` or ``--parts gpu``)

A GPT-2-small-shaped model (``benchlib.gpt``; the dataset's cl100k vocabulary, bf16
autocast, fused AdamW) trains on CUDA, fed in interleaved rounds by ``Loader(device="cuda")``
at 2 and 4 workers and, as the baseline, by batches already resident on the GPU (read once
before, cycled). Per run: the step time over the measured steps (the device synchronised at
both ends), and the time the training stream waits on input: a CUDA event recorded on the
training stream just before ``next(loader)`` and one just after it returns (after the
loader made the stream wait for its copy), their GPU-side gap summed over the steps. The
host may run steps ahead of the GPU, so the host's time in ``next()`` is reported apart: it
costs the GPU nothing while the queue of launched work is longer. Round 0 of each worker
count then profiles a few more steps (``torch.profiler``) to see whether the host-to-device
copies overlap compute kernels and which stream they ran on (``benchlib.gpu_trace``).

Without CUDA the part returns ``skipped: no CUDA device`` at once. ``--gpu-device cpu
--gpu-tiny`` runs the same code on the CPU with a tiny model for the smoke test only (on a
CPU the "wait" is the time in ``next()``; there is no copy to overlap).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchlib import gpu_trace
from benchlib.common import BATCH, SEQ_LEN
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, table

if TYPE_CHECKING:
    import torch

    from benchlib.cli import Bench

GOAL = 0.99  # loader step time vs resident batches (issue 26)
WORKERS = (2, 4)
NO_CUDA = "skipped: no CUDA device"
TINY_SEQ, TINY_BATCH = 64, 4
RESIDENT = 64  # batches read once and kept on the device, cycled


def _mark(dev: torch.device) -> Any:
    """A point on the training stream: a timing event on CUDA, the clock on a CPU."""
    import torch

    if dev.type != "cuda":
        return time.perf_counter()
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def _gap_ms(a: Any, b: Any) -> float:
    return (b - a) * 1000 if isinstance(a, float) else float(a.elapsed_time(b))


def _sync(dev: torch.device) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _step(model: Any, opt: Any, batch: dict[str, Any], dev: torch.device) -> Any:
    import torch

    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = model(batch["input_ids"], batch["labels"])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def _train(model: Any, opt: Any, batches: Iterator[Any], steps: int, warmup: int,
           dev: torch.device) -> dict[str, Any]:  # fmt: skip
    """``warmup`` steps, then ``steps`` timed ones; no host sync inside the timed loop."""
    import torch

    marks, host_next, total = [], 0.0, torch.zeros((), device=dev)
    t0 = time.perf_counter()
    for i in range(warmup + steps):
        if i == warmup:
            _sync(dev)
            t0 = time.perf_counter()
        before, h = _mark(dev), time.perf_counter()
        batch = next(batches)
        if i >= warmup:
            host_next += time.perf_counter() - h
            marks.append((before, _mark(dev)))
        total += _step(model, opt, batch, dev)
    _sync(dev)
    seconds = time.perf_counter() - t0
    waits = [_gap_ms(a, b) for a, b in marks]
    loss = total.item() / (warmup + steps)
    if not loss == loss or loss <= 0:  # NaN or nonsense: the numbers would mean nothing
        raise RuntimeError(f"training diverged: mean loss {loss}")
    return {
        "step_s": seconds / steps,
        "wait_ms": statistics.fmean(waits),
        "wait_max_ms": max(waits),
        "wait_frac": sum(waits) / 1000 / seconds,
        "host_next_ms": host_next / steps * 1000,
        "loss": loss,
    }


def _profile(model: Any, opt: Any, batches: Iterator[Any], steps: int,
             dev: torch.device) -> dict[str, Any]:  # fmt: skip
    """``steps`` more steps under ``torch.profiler``; the trace's copy/compute summary."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            _step(model, opt, next(batches), dev)
        _sync(dev)
    with tempfile.TemporaryDirectory(prefix="wdstream-bench-trace-") as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        trace = json.loads(Path(path).read_text())
    return {"steps": steps, **gpu_trace.summarize(trace)}


def _resident(root: str, seq_len: int, batch: int, dev: torch.device) -> list[dict[str, Any]]:
    """``RESIDENT`` batches of the dataset, moved to ``dev`` before any timing."""
    import wdstream

    loader = wdstream.Loader(root, seq_len=seq_len, batch_size=batch, num_workers=0)
    keep = ("input_ids", "labels")
    return [{k: b[k].to(dev) for k in keep} for b in itertools.islice(loader, RESIDENT)]


def child_gpu(root: str, device: str, tiny: bool, workers: list[int], steps: int, warmup: int,
              repeats: int, profile_steps: int) -> dict[str, Any]:  # fmt: skip
    """Per ``"resident"`` and ``"loader/W"``: one training run per round."""
    import torch

    import wdstream
    from benchlib import gpt  # imports torch: here, not where the bench's CLI imports this module

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        return {"skipped": NO_CUDA}
    vocab = int(json.loads((Path(root) / "index.json").read_text())["tokenizer"]["n_vocab"])
    shape, seq_len, batch = gpt.GPT2_SMALL, SEQ_LEN, BATCH
    if tiny:
        shape, seq_len, batch = gpt.TINY, TINY_SEQ, TINY_BATCH
    model = gpt.build(shape, vocab, seq_len, dev)
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=fused)
    resident = _resident(root, seq_len, batch, dev)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "cuda": torch.version.cuda if dev.type == "cuda" else None,
        "torch": torch.__version__,
        "params": sum(p.numel() for p in model.parameters()),
        "shape": f"{shape.layers} layers, width {shape.width}, {shape.heads} heads",
        "vocab": vocab, "seq_len": seq_len, "batch": batch, "steps": steps, "warmup": warmup,
    }  # fmt: skip
    contenders = ["resident"] + [f"loader/{w}" for w in workers]
    for rnd, name in interleave(contenders, repeats):
        batches: Iterator[Any] = itertools.cycle(resident)
        try:
            if name != "resident":
                w = int(name.split("/")[1])
                loader = wdstream.Loader(root, seq_len=seq_len, batch_size=batch, seed=rnd,
                                         num_workers=w, device=dev)  # fmt: skip
                batches = iter(loader)
            res = _train(model, opt, batches, steps, warmup, dev)
            if rnd == 0 and name != "resident" and profile_steps:
                res["trace"] = _profile(model, opt, batches, profile_steps, dev)
        except Exception as exc:  # the row says what failed; the other rows still run
            res = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # stops the loader's workers now, not at garbage collection
        res["round"] = rnd
        out.setdefault(name, []).append(res)
    return out


def _dataset(b: Bench) -> str | None:
    """The wdstream dataset of the run (packed now if the pack part did not run)."""
    root = b.path("wdstream:tiktoken")
    if not os.path.exists(root):
        res = run_child("pack", tool="wdstream:tiktoken", files=b.r["corpus"]["files"],
                        out=root, threads=b.cores)  # fmt: skip
        if "error" in res:
            return None
    return root


def measure(b: Bench) -> dict[str, Any]:
    a = b.args
    root = _dataset(b)
    if root is None:
        return {"error": "no dataset (its pack failed)"}
    res = run_child("gpu", timeout=1800, root=root, device=a.gpu_device, tiny=a.gpu_tiny,
                    workers=list(WORKERS), steps=a.gpu_steps, warmup=a.gpu_warmup,
                    repeats=a.repeats, profile_steps=a.gpu_profile_steps)  # fmt: skip
    b.log(f"gpu: {res.get('skipped') or b.brief(res, 'wall_s')}")
    return res


def _overlap(runs: list[dict[str, Any]]) -> str | None:
    t = next((x["trace"] for x in runs if "trace" in x), None)
    if t is None:
        return None
    if not t["h2d_copies"]:
        return f"no H2D copy in {t['steps']} profiled steps"
    side = {True: "on a side stream", False: "on a compute stream", None: "?"}
    frac = t["h2d_overlap_frac"]
    return (f"{t['h2d_copies']} copies, {t['h2d_ms']:.2f} ms, {frac:.0%} under compute, "
            f"{side[t['copies_off_compute_streams']]} (streams {t['copy_streams']} vs "
            f"{t['compute_streams']})")  # fmt: skip


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    head = ["## GPU: does the training step wait for input?", ""]
    x = r.get("gpu")
    if not x:
        return head + ["Not run (`--gpu`; on by default where CUDA is available).", ""]
    if "skipped" in x or "error" in x:
        status = x.get("skipped") or x["error"]
        rows = [[f"`Loader(device=...)`, {w} workers", None, None, None, None, None, status]
                for w in WORKERS]  # fmt: skip
        return head + [table(_HEADER, rows), ""]
    base = x.get("resident")
    b = value_spread(base, "step_s")
    rows = [["batches resident on the device (cycled)", b.mid * 1000 if b else None,
             "baseline", None, None, None, first_error(base) or "ok"]]  # fmt: skip
    cuda = x["device"] != "cpu"  # a CPU run is the smoke test's: no goal, no note
    goals = []
    for w in WORKERS:
        runs = x.get(f"loader/{w}") or []
        s, wait = value_spread(runs, "step_s"), value_spread(runs, "wait_ms")
        host = value_spread(runs, "host_next_ms")
        ratio = ratio_spread(runs, base, "step_s", inverse=True)
        goals.append(goal(f"{w} workers", ratio, GOAL))
        if cuda and ratio and ratio.mid < GOAL:
            notes.append(f"gpu, {w} workers: a step fed by the Loader runs at {ratio.fmt()} "
                         "the speed of one on resident batches.")  # fmt: skip
        worst = value_spread(runs, "wait_max_ms")
        waits = f"{wait.mid:.3f} (worst step {worst.hi:.2f})" if wait and worst else None
        rows.append([f"`Loader(device=...)`, {w} workers", s.mid * 1000 if s else None, ratio,
                     waits, host.mid if host else None, _overlap(runs),
                     first_error(runs) or "ok"])  # fmt: skip
    tokens = x["batch"] * x["seq_len"]
    device = f"**{x['device']}** (CUDA {x['cuda']}" if cuda else "**cpu** (smoke-test run"
    verdict = (
        ["Goal (step time, resident / Loader): " + "; ".join(goals) + ".", ""]
        if cuda
        else ["A CPU run only exercises the code: its numbers say nothing about a GPU.", ""]
    )
    return head + [
        f"Device: {device}, torch {x['torch']}). Model: GPT-2-style, "
        f"{x['shape']}, vocabulary {x['vocab']:,} (the dataset's), {x['params'] / 1e6:.0f} M "
        f"parameters, bf16 autocast, {'fused ' if cuda else ''}AdamW; batches of "
        f"{x['batch']} x {x['seq_len']} "
        f"({tokens:,} tokens). {x['steps']} timed steps after {x['warmup']} untimed ones; the "
        "device is synchronised at both ends, not inside. Wait: GPU-side gap between CUDA "
        "events recorded on the training stream just before `next()` and just after it, "
        "mean per step (the stream idle for input); host in `next()`: the CPU's time in "
        "`next()`, hidden while the GPU has queued work. Overlap: a `torch.profiler` trace "
        "of a few more steps in round 0: host-to-device copy time during which a compute "
        "kernel ran, and the copy's stream. Ratios: per round, median (min–max).",
        "",
        table(_HEADER, rows),
        "",
        *verdict,
    ]


_HEADER = ["fed by", "step ms", "vs resident", "wait ms/step (GPU)", "host ms in next()",
           "H2D copies vs compute (profiler)", "status"]  # fmt: skip
