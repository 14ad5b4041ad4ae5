"""Does the host-to-device copy overlap compute? Read off a ``torch.profiler`` trace.

The profiler's Chrome trace (``export_chrome_trace``) lists each GPU activity as a complete
event (``"ph": "X"``, ``ts``/``dur`` in microseconds) with its CUDA stream in
``args.stream``: compute kernels under ``cat: "kernel"``, copies under ``cat: "gpu_memcpy"``
(a host-to-device one is named ``Memcpy HtoD ...``). The summary is the copies' time, the
part of it during which some compute kernel ran (the union of kernel intervals), and which
streams the copies and the kernels ran on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _intervals(events: Iterable[Mapping[str, Any]], cat: str, name: str = "") -> list[Any]:
    """``(start, end, stream)`` of the complete events of ``cat`` whose name has ``name``."""
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == cat and name in str(e.get("name", "")):
            start = float(e["ts"])
            stream = (e.get("args") or {}).get("stream", e.get("tid"))
            out.append((start, start + float(e.get("dur", 0.0)), stream))
    return out


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _covered(a: float, b: float, union: list[tuple[float, float]]) -> float:
    """Length of ``[a, b]`` inside the (sorted, disjoint) ``union``."""
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in union if x < b and y > a)


def summarize(trace: Mapping[str, Any]) -> dict[str, Any]:
    """Host-to-device copies against compute kernels in one profiler trace.

    ``h2d_overlap_frac``: the copies' time during which a kernel ran (None without copies);
    ``copies_off_compute_streams``: every copy ran on a stream no kernel ran on (a side
    stream), None without copies or kernels.
    """
    events = trace.get("traceEvents") or []
    kernels = _intervals(events, "kernel")
    copies = _intervals(events, "gpu_memcpy", "HtoD")
    union = _union([(a, b) for a, b, _ in kernels])
    copy_us = sum(b - a for a, b, _ in copies)
    overlap_us = sum(_covered(a, b, union) for a, b, _ in copies)
    copy_streams = sorted({s for _, _, s in copies}, key=str)
    compute_streams = sorted({s for _, _, s in kernels}, key=str)
    return {
        "kernels": len(kernels),
        "kernel_ms": sum(b - a for a, b in union) / 1000,
        "h2d_copies": len(copies),
        "h2d_ms": copy_us / 1000,
        "h2d_overlap_ms": overlap_us / 1000,
        "h2d_overlap_frac": overlap_us / copy_us if copy_us else None,
        "copy_streams": copy_streams,
        "compute_streams": compute_streams,
        "copies_off_compute_streams": (
            not set(copy_streams) & set(compute_streams) if copies and kernels else None
        ),
    }
