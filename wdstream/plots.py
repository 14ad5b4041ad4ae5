"""``wdstream stats --plot FILE.png``: a dataset's or a mixture's numbers as one picture.

Every number drawn comes from the stats code (:func:`wdstream.inspect_stats.scan_dataset`,
:func:`wdstream.read.mixture.inspect.mixture_stats` with a run); this module only bins and
draws them, and returns what it drew so a test can hold it against the shards::

    dataset (2 to 5 panels)                      mixture (2 panels, steps on x)
    +--------------------+-------------------+   +--------------------------------+
    | document lengths   | tokens per shard  |   | share of rows per source       |
    +--------------------+-------------------+   +--------------------------------+
    | padding per row    | tokens per role,  |   | epochs of each source read     |
    | (bestfit)          | supervised (chat) |   | (the stop rule's step marked)  |
    +--------------------+-------------------+   +--------------------------------+
    | template problems  |
    | (chat)             |
    +--------------------+

A role no conversation has (no tokens) gets no bar, and is named under the panel instead of
a "0.0 % supervised" bar; a one-shard dataset has one tick, 0, and "1 shard".

matplotlib is an optional dependency (``pip install 'wdstream[plot]'``). Figures are drawn
with the object API on the Agg canvas (no pyplot, no display, no global backend switched),
so plotting works on a headless node and leaves a notebook's backend alone. The file is
written by :func:`wdstream.plot_target.save_png` (a new file renamed over the path: no
symlink followed); ``wdstream stats`` first checks the path is no file of a dataset
(:func:`wdstream.plot_target.check_plot_target`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from wdstream.inspect_stats import DatasetScan
from wdstream.plot_target import save_png
from wdstream.words import count

__all__ = ["BINS_PER_OCTAVE", "plot_dataset", "plot_mixture", "require_matplotlib"]

BINS_PER_OCTAVE = 4  # document-length histogram: bins of 2**(1/4) in width, on a log axis
_ROLE_COLOURS = ("#4c72b0", "#dd8452")  # all tokens, supervised tokens


def require_matplotlib() -> None:
    """Raise one clear line when matplotlib is missing (checked before any data is read).

    Raises:
        ImportError: naming the extra to install.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(
            "--plot needs matplotlib, which is not installed: pip install 'wdstream[plot]'"
        ) from None


def _figure(rows: int, cols: int, size: tuple[float, float]) -> tuple[Any, Any]:
    """A figure on the Agg canvas and its axes (a 2-d array)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _length_edges(lengths: np.ndarray) -> np.ndarray:
    """Bin edges from the power of two at or below the shortest of ``lengths`` to past the
    longest, ``BINS_PER_OCTAVE`` per doubling."""
    shortest, longest = (int(lengths.min()), int(lengths.max())) if len(lengths) else (1, 1)
    lo = math.floor(math.log2(max(shortest, 1)))
    hi = math.log2(max(longest, 1)) + 1 / BINS_PER_OCTAVE
    n = max(1, math.ceil((hi - lo) * BINS_PER_OCTAVE))
    return np.asarray(2.0 ** (lo + np.arange(n + 1) / BINS_PER_OCTAVE))


def _plain_ticks(axis: Any) -> None:
    """Tick labels as plain numbers with thousands separators (1,024 rather than 2^10)."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def plot_dataset(scan: DatasetScan, path: str | Path, title: str) -> dict[str, Any]:
    """Draw ``scan`` into the PNG ``path``: document lengths (log-binned), tokens per shard,
    a best-fit dataset's padding per row, and a chat dataset's tokens and supervised tokens
    per role.

    Returns:
        What was drawn: ``doc_lengths`` (``edges``, ``counts``), ``shard_tokens``,
        ``shard_ticks`` (the shard axis' tick positions), ``row_padding`` (``edges``,
        ``counts``; None outside bestfit), ``roles`` (``{role: {"tokens", "supervised"}}``
        of the roles with tokens; None outside chat datasets), ``assistant_turns``
        (``count``, ``unsupervised``: the line in the roles panel; None outside chat
        datasets and in packs made before it was counted), ``problems`` (``{kind: count}``
        of the template's problems and refusals; None outside chat datasets), and
        ``titles``, the panels' titles.
    """
    s = scan.stats
    chat = (s["loss_mask"] or {}).get("chat")
    panels = 2 + (scan.row_padding is not None) + 2 * (chat is not None)
    rows, cols = (1, panels) if panels <= 3 else (2, 2) if panels == 4 else (2, 3)
    fig, axes = _figure(rows, cols, (6 * cols, 4.5 * rows))
    flat = list(axes.flat)
    drawn: dict[str, Any] = {"row_padding": None, "roles": None, "assistant_turns": None,
                             "problems": None}  # fmt: skip

    edges = _length_edges(scan.doc_lengths)
    counts, _ = np.histogram(scan.doc_lengths, bins=edges)
    drawn["doc_lengths"] = {"edges": edges.tolist(), "counts": counts.tolist()}
    ax = flat[0]
    ax.stairs(counts, edges, fill=True, color=_ROLE_COLOURS[0])
    ax.set_xscale("log", base=2)
    from matplotlib.ticker import LogLocator

    ax.xaxis.set_major_locator(LogLocator(base=4))  # powers of 4: labels that do not collide
    _plain_ticks(ax.xaxis)
    ax.axvline(s["doc_len_mean"], color="black", linestyle="--",
               label=f"mean {s['doc_len_mean']:,.1f}")  # fmt: skip
    if s["mode"] != "docs":
        ax.axvline(s["seq_len"] + 1, color="red", linestyle=":",
                   label=f"row {s['seq_len'] + 1:,} tokens")  # fmt: skip
    ax.set(title=f"Document lengths ({s['documents']:,} documents)", ylabel="documents",
           xlabel="tokens per document (EOS/BOS included, log scale)")  # fmt: skip
    ax.legend()

    tokens = scan.shard_tokens
    drawn["shard_tokens"] = tokens.tolist()
    ax = flat[1]
    ax.bar(np.arange(len(tokens)), tokens, width=0.8 if len(tokens) <= 64 else 1.0,
           color=_ROLE_COLOURS[0])  # fmt: skip
    ax.axhline(float(tokens.mean()), color="black", linestyle="--")
    ax.set(title=f"Tokens per shard ({count(len(tokens), 'shard')}, mean "
                 f"{tokens.mean():,.0f}: dashed)",
           xlabel="shard (pack order)", ylabel="tokens")  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    # The axis spans the bars (a lone bar at 0 would get ticks at -0.4..0.4 otherwise),
    # with ticks on shard numbers only, never fractions.
    ax.set_xlim(-0.5, len(tokens) - 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    drawn["shard_ticks"] = [
        int(t) for t in ax.get_xticks() if -0.5 <= t <= len(tokens) - 0.5
    ]  # fmt: skip
    _plain_ticks(ax.yaxis)

    at = 2
    if scan.row_padding is not None:
        drawn["row_padding"] = _padding(flat[at], scan.row_padding, s)
        at += 1
    if chat is not None:
        drawn["roles"] = _roles(flat[at], chat["roles"])
        drawn["assistant_turns"] = _lost_turns(flat[at], chat.get("assistant_turns"))
        drawn["problems"] = _problems(flat[at + 1], chat)
        at += 2
    for ax in flat[at:]:
        ax.set_axis_off()
    drawn["titles"] = [ax.get_title() for ax in flat[:at]]
    fig.suptitle(f"{title}: mode {s['mode']}, seq_len {s['seq_len']}, {s['tokenizer']['name']}")
    save_png(fig, path)
    return drawn


def _padding(ax: Any, padding: np.ndarray, s: dict[str, Any]) -> dict[str, Any]:
    """Histogram of padding tokens per best-fit row (one bin per token up to 64 bins)."""
    top = int(padding.max(initial=0)) + 1
    step = max(1, math.ceil(top / 64))
    edges = np.arange(0, top + step, step)
    counts, _ = np.histogram(padding, bins=edges)
    # A log count axis: most rows end nearly full, and the few emptier ones still show.
    ax.bar(edges[:-1], counts, width=step, align="edge", log=True, color=_ROLE_COLOURS[1])
    ax.set(title=f"Padding per row ({s['padding_pct']:.2f} % of all tokens, mean "
                 f"{padding.mean() if len(padding) else 0:.1f} per row)",
           xlabel="padding tokens in the row", ylabel="rows (log scale)")  # fmt: skip
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def _lost_turns(ax: Any, turns: dict[str, Any] | None) -> dict[str, int] | None:
    """The assistant turns without loss, as their own line in the roles panel (red if any)."""
    if turns is None:
        return None
    lost, count = turns["unsupervised"], turns["count"]
    ax.text(0.98, 0.03, f"assistant turns without loss: {lost:,} of {count:,}", ha="right",
            transform=ax.transAxes, color="red" if lost else "black", fontsize=9)  # fmt: skip
    return {"count": count, "unsupervised": lost}


def _roles(ax: Any, roles: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Each role's tokens, with its supervised tokens drawn over them; a role without
    tokens is named in the axis label, not drawn as a "0.0 %" bar."""
    names = [r for r in roles if roles[r]["tokens"]]
    empty = [r for r in roles if not roles[r]["tokens"]]
    total = [roles[r]["tokens"] for r in names]
    sup = [roles[r]["supervised"] for r in names]
    y = np.arange(len(names))
    ax.barh(y, total, color=_ROLE_COLOURS[0], label="tokens")
    ax.barh(y, sup, height=0.5, color=_ROLE_COLOURS[1], label="supervised (carry loss)")
    for i, r in enumerate(names):
        ax.annotate(f" {roles[r]['supervised_pct']:.1f} % supervised", (total[i], i),
                    va="center", fontsize=9)  # fmt: skip
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.margins(x=0.35)
    _plain_ticks(ax.xaxis)
    none = f" (no tokens: {', '.join(empty)})" if empty else ""
    ax.set(title="Tokens per role (chat)", xlabel=f"tokens{none}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    return {r: {"tokens": t, "supervised": u} for r, t, u in zip(names, total, sup, strict=True)}


def _problems(ax: Any, chat: dict[str, Any]) -> dict[str, int]:
    """The template's problems (records with each kind, :mod:`wdstream.write.chataudit`) and
    the conversations it refused, one bar each; "none" written when there are none."""
    counts = {kind: int(p["count"]) for kind, p in chat["problems"].items()}
    counts["refused"] = int(chat["template_refused"]["count"])
    names = list(counts)
    y = np.arange(len(names))
    ax.barh(y, [counts[k] for k in names], color=_ROLE_COLOURS[1])
    for i, k in enumerate(names):
        ax.annotate(f" {counts[k]:,}", (counts[k], i), va="center", fontsize=9)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    ax.margins(x=0.2)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # counts, never fractions
    _plain_ticks(ax.xaxis)
    if not any(counts.values()):
        ax.text(0.5, 0.5, "no template problems", transform=ax.transAxes, ha="center")
    ax.set(title="Template problems (chat)", xlabel="count (wdstream stats lists examples)")
    return counts


def plot_mixture(stats: dict[str, Any], path: str | Path, title: str) -> dict[str, Any]:
    """Draw a mixture's run (``stats["run"]``, :func:`mixture_stats` with ``steps``) into the
    PNG ``path``: each source's share of rows over the steps, and the epochs of each source
    read by each step (the stop rule's step marked when the run reaches it).

    Returns:
        What was drawn: ``steps``, and per source its ``weight`` and ``epochs`` at each step.
    """
    run = stats["run"]
    assert run is not None, "plot_mixture needs mixture_stats(..., steps=N)"
    fig, axes = _figure(2, 1, (11, 7.5))
    top, bottom = axes[0, 0], axes[1, 0]
    steps = run["steps"]
    drawn: dict[str, Any] = {"steps": steps, "sources": {}}
    for name, r in run["sources"].items():
        line = top.step(steps, r["weight"], where="post", label=name, linewidth=2)[0]
        bottom.plot(steps, r["epochs"], color=line.get_color(),
                    label=f"{name} ({r['rows_per_epoch']:,} rows per epoch)")  # fmt: skip
        drawn["sources"][name] = {"weight": r["weight"], "epochs": r["epochs"]}
    stop = run["stop_step"]
    for ax in (top, bottom):
        if stop is not None and stop <= steps[-1]:
            ax.axvline(
                stop,
                color="red",
                linestyle=":",
                label=f"{stats['stop']}: the run stops at step {stop:,}",
            )
        ax.set_xlim(0, steps[-1])
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    top.set_ylim(0, 1.05)
    top.set(title="Share of each step's rows per source (the schedule)", ylabel="share of rows")
    bottom.set_ylim(bottom=0)
    bottom.set(title="Epochs of each source read by the step", xlabel="step",
               ylabel="source epochs")  # fmt: skip
    fig.suptitle(f"{title}: {steps[-1]:,} steps of {run['global_batch']:,} rows, "
                 f"seq_len {run['seq_len']}")  # fmt: skip
    save_png(fig, path)
    return drawn
