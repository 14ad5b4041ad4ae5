"""Read with per-sample CRC32C checks on vs off (format v2), from the read part's runs.

``wdstream.Loader`` checks every sample's CRC32C (stored in the shard's sidecar) as it reads
it; ``checksums=False`` turns that off. Both are contenders of the read part, so they ran in
the same interleaved rounds as the 0-worker memmap baseline: the on/off ratio is taken per
round (the same round's two runs), and so is each one's ratio to memmap.

Tokens/s hides what the checks cost where every core is busy (2 workers and the training
loop on a 2-core host): the table also gives the checks' CPU per delivered row, the CPU
seconds of the reader's whole process tree (training process and workers,
:func:`benchlib.cputime.tree_cpu_s`) per row of the same timed batches, checks on minus off
in each round.
"""

from __future__ import annotations

from typing import Any

from benchlib.common import WORKERS
from benchlib.read import BASELINE
from benchlib.rounds import Runs, Spread, by_round, first_error, ratio_spread, spread, value_spread
from benchlib.tables import goal, millions, table

ON, OFF = "wdstream", "wdstream-nocrc"
GOAL_ON_OFF = 0.95  # checks may cost at most 5 %
GOAL_VS_MEMMAP = {0: 1.0}  # at 0 workers both must keep up with memmap
GOAL_CPU_US = {2: 0.5}  # the checks' CPU per delivered row, µs (issue 26: was ~1.1)


def cpu_per_row_us(runs: Runs | None) -> dict[int, float]:
    """CPU µs of the reader's process tree per delivered row, by round."""
    return {
        r: x["cpu_s"] / x["rows"] * 1e6
        for r, x in by_round(runs).items()
        if x.get("cpu_s") is not None and x.get("rows")
    }


def check_cpu_us(on: Runs | None, off: Runs | None) -> Spread | None:
    """The checks' CPU per delivered row: checks on minus off, per round (µs)."""
    a, b = cpu_per_row_us(on), cpu_per_row_us(off)
    return spread([a[r] - b[r] for r in sorted(a.keys() & b.keys())])


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    head = ["## Read: per-sample checksums", ""]
    runs = r.get("read")
    if not runs:
        return head + ["Not run.", ""]
    base = runs.get(BASELINE)
    rows, goals = [], []
    for w in WORKERS:
        on, off = runs.get(f"{ON}/{w}"), runs.get(f"{OFF}/{w}")
        v_on, v_off = value_spread(on, "tokens_per_s"), value_spread(off, "tokens_per_s")
        on_off = ratio_spread(on, off, "tokens_per_s")
        on_mm = ratio_spread(on, base, "tokens_per_s")
        off_mm = ratio_spread(off, base, "tokens_per_s")
        cpu = check_cpu_us(on, off)
        cpu_off = spread(list(cpu_per_row_us(off).values()))
        rows.append(
            [
                w,
                millions(v_on.mid) if v_on else None,
                millions(v_off.mid) if v_off else None,
                on_off,
                on_mm,
                off_mm,
                cpu.fmt(" µs") if cpu else None,
                cpu_off.fmt(" µs", 1) if cpu_off else None,
                first_error(on) or first_error(off) or "ok",
            ]
        )
        if w in GOAL_CPU_US:
            want = GOAL_CPU_US[w]
            # A spread reaching below zero is the host's noise, not a cost: not judged.
            judged = cpu if cpu and cpu.lo >= 0 else None
            name = f"checks' CPU per row, {w} workers"
            if cpu and judged is None:
                name += f" (on - off {cpu.fmt(' µs')}: below the noise of tree CPU here)"
            goals.append(goal(name, judged, want, True, " µs"))
            if cpu and cpu.mid > want:
                notes.append(
                    f"read, {w} workers: the CRC32C checks cost {cpu.fmt(' µs')} of CPU per "
                    f"delivered row (whole process tree, on minus off per round; goal ≤ {want} µs)."
                )
        goals.append(goal(f"on/off, {w} workers", on_off, GOAL_ON_OFF))
        if w in GOAL_VS_MEMMAP:
            goals.append(goal(f"on vs memmap, {w} workers", on_mm, GOAL_VS_MEMMAP[w]))
            goals.append(goal(f"off vs memmap, {w} workers", off_mm, GOAL_VS_MEMMAP[w]))
        if on_off and on_off.mid < GOAL_ON_OFF:
            notes.append(
                f"read, {w} workers: CRC32C checks cost wdstream {1 - on_off.mid:.0%} of its "
                f"tokens/s (on/off {on_off.fmt()})."
            )
    return head + [
        "wdstream `Loader` on the same v2 dataset with its per-sample CRC32C checks on (the "
        "default) and off (`checksums=False`); both rows are runs of the read table, "
        "interleaved with the 0-worker memmap baseline in every round. Ratios: per round, "
        "median (min–max). CPU per row: CPU seconds of the reader's whole process tree "
        "(training process + workers, all threads) over the timed batches, per delivered row "
        "(`[1, 2049]`); the checks' cost is checks on minus off in the same round, median "
        "(min–max). The host's other load moves the CPU a row costs by more than the checks "
        "do, so single rounds can come out negative.",
        "",
        table(
            [
                "workers",
                "checks on M tokens/s",
                "checks off M tokens/s",
                "on / off",
                "on vs memmap, 0 workers",
                "off vs memmap, 0 workers",
                "checks' CPU µs per row (on − off)",
                "CPU µs per row, checks off",
                "status",
            ],
            rows,
        ),
        "",
        "Goals: " + "; ".join(goals) + ".",
        "",
    ]
