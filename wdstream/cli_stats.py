"""``wdstream stats`` below its click command: one dataset or a mixture spec, as text, JSON
or a picture (``--plot FILE.png``, :mod:`wdstream.plots`)::

    wdstream stats data/ --plot data.png
    wdstream stats mix.toml --steps 20000 --batch-size 64 --plot mix.png

Each output is made from one pass of the stats code; the picture draws the same numbers the
text prints. A missing matplotlib is found before the dataset is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from wdstream.words import count

__all__ = ["stats_output"]


def stats_output(
    root: str,
    as_json: bool,
    plot: str | None,
    steps: int | None,
    store_options: dict[str, Any],
    overwrite_plot: bool = False,
    **query: Any,
) -> Iterator[tuple[str, bool]]:
    """The lines ``wdstream stats`` prints, each with whether it is a warning (stderr);
    with ``plot``, the picture is written there first and its line comes last.

    Args:
        root: a packed dataset or a mixture spec (.json / .toml).
        as_json: print the stats as one JSON object.
        plot: a PNG path to draw into, or None.
        steps: a mixture: follow its first ``steps`` steps (``query`` holds
            ``batch_size``, ``world_size``, ``seq_len``).
        store_options: passed to the stores.
        overwrite_plot: ``plot`` may replace an existing file that is not a PNG (never a
            dataset's file, never through a symlink: :mod:`wdstream.plot_target`).

    Raises:
        ValueError: ``steps`` for a single dataset, or without ``batch_size``; reader
            options out of range (:func:`~wdstream.read.option_checks.check_read_options`);
            a ``plot`` path that would overwrite data or follow a symlink.
        ImportError: ``plot`` without matplotlib.
    """
    from wdstream.read.mixture.spec import is_mixture
    from wdstream.read.option_checks import check_read_options

    check_read_options(**query)
    mixture = is_mixture(root)
    if plot is not None:
        from wdstream.plot_target import check_plot_target
        from wdstream.plots import require_matplotlib

        require_matplotlib()
        check_plot_target(plot, _local_data(root, mixture), overwrite_plot)
    if mixture:
        return _mixture(root, as_json, plot, steps, store_options, query)
    if steps is not None:
        raise ValueError("--steps is for a mixture spec (.json / .toml), not one dataset")
    return _dataset(root, as_json, plot, store_options)


def _local_data(root: str, mixture: bool) -> list[str]:
    """The dataset roots (and mixture spec) a picture must not be written over."""
    if not mixture:
        return [root]
    from wdstream.read.mixture.spec import read_spec

    return [root, *read_spec(root).sources.values()]


def _dataset(
    root: str, as_json: bool, plot: str | None, store_options: dict[str, Any]
) -> Iterator[tuple[str, bool]]:
    from wdstream.inspect_stats import mask_lines, scan_dataset
    from wdstream.storage import open_store

    scan = scan_dataset(open_store(root, **store_options))
    s = scan.stats
    if plot is not None:
        from wdstream.plots import plot_dataset

        plot_dataset(scan, plot, root)
    if as_json:
        yield json.dumps(s, indent=1, sort_keys=True), False
    else:
        yield from ((line, False) for line in _dataset_lines(root, s))
        if s["loss_mask"] is not None:
            yield from mask_lines(s["loss_mask"])
        input_stats = s["input_stats"]
        if input_stats:
            yield (
                f"input: {input_stats.get('input_bytes', 0) / 1e6:,.1f} MB, "
                f"{count(input_stats.get('empty_documents_skipped', 0), 'empty document')} "
                f"skipped, {count(input_stats.get('records_skipped', 0), 'bad record')} skipped",
                False,
            )
    if plot is not None and not as_json:
        yield f"plot: {plot}", False


def _dataset_lines(root: str, s: dict[str, Any]) -> list[str]:
    """The counts, what the mode did to documents, and the document-length histogram."""
    lines = [
        f"{root}: {count(s['shards'], 'shard')}, {count(s['samples'], 'sample')}, "
        f"{count(s['documents'], 'document')}, {count(s['tokens'], 'token')}, "
        f"{s['bytes'] / 1e6:,.1f} MB ({s['tokenizer']['name']}, mode {s['mode']})"
    ]
    if s["rows"] is not None:
        lines.append(
            f"rows {s['rows']:,}; documents split across rows {s['documents_split']:,} "
            f"({s['documents_split_pct']:.2f} %); padding {s['padding_pct']:.2f} % of tokens"
        )
    lines.append(f"document length (tokens), mean {s['doc_len_mean']:.1f}:")
    top = max(s["doc_len_histogram"].values(), default=1)
    for bucket, n in s["doc_len_histogram"].items():
        lines.append(f"  {bucket:>17} {n:>9,} {'#' * max(1, round(40 * n / top))}")
    return lines


def _mixture(
    spec: str,
    as_json: bool,
    plot: str | None,
    steps: int | None,
    store_options: dict[str, Any],
    query: dict[str, Any],
) -> Iterator[tuple[str, bool]]:
    from wdstream.read.mixture.inspect import mixture_stats, mixture_stats_lines

    if plot is not None and steps is None:
        raise ValueError("--plot of a mixture draws a run: give --steps N and --batch-size B")
    if steps is not None and query.get("batch_size") is None:
        raise ValueError(
            "--steps needs --batch-size (rows per rank; with --world-size, the global batch "
            "that makes a step)"
        )
    s = mixture_stats(spec, steps, **query, **store_options)
    if plot is not None:
        from wdstream.plots import plot_mixture

        plot_mixture(s, plot, spec)
    if as_json:
        yield json.dumps(s, indent=1, sort_keys=True), False
        return
    yield from ((line, False) for line in mixture_stats_lines(s))
    if plot is not None:
        yield f"plot: {plot}", False
