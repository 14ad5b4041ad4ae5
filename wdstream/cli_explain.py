"""``wdstream explain`` below its click command: which steps (``--step N`` or ``--steps A:B``),
one dataset or a mixture spec, and the output, text or JSON Lines (one record per row)::

    wdstream explain data/ --steps 41200:41300 --state ckpt.json --format jsonl > spike.jsonl
    {"step": 41200, "data_step": 41200, "row": 0, "rank": 0, "rank_row": 0, "epoch": 0, ...,
     "pieces": [{"shard": "data-000123.tar", ..., "file": "corpus/part-007.jsonl", "line": 52114,
                 "span": [0, 1733], "doc_span": [4096, 5829]}]}

The steps are checked before anything is printed, so a bad range is one ``Error:`` line and
no partial output (the click group turns the ``ValueError`` into that line).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["explain_output", "load_state", "parse_steps"]

_E = TypeVar("_E")


def parse_steps(step: int | None, steps: str | None) -> range:
    """The steps asked for: ``--step N`` alone, or ``--steps A:B`` (``A`` to ``B - 1``, as a
    Python slice).

    Raises:
        ValueError: neither or both given, or a range that is not ``A:B`` with ``A < B``.
    """
    if (step is None) == (steps is None):
        raise ValueError("give one of --step N or --steps A:B")
    if step is not None:
        return range(step, step + 1)
    assert steps is not None
    a, sep, b = steps.partition(":")
    try:
        first, end = int(a), int(b)
    except ValueError:
        first, end = 0, 0
        sep = ""
    if not sep or end <= first:
        raise ValueError(
            f"--steps: expected A:B with integers A < B (steps A to B - 1), got {steps!r}"
        )
    return range(first, end)


def load_state(path: str | None) -> dict[str, Any] | None:
    """The saved Loader state in the JSON file ``path`` (None: no state).

    Raises:
        ValueError: naming the file, if it is not JSON.
    """
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        try:
            state: dict[str, Any] = json.load(f)
        except ValueError as exc:
            raise ValueError(f"{path}: not a JSON Loader state ({exc})") from exc
    return state


def explain_output(
    dataset: str, steps: range, fmt: str, store_options: dict[str, Any], **query: Any
) -> Iterator[str]:
    """The lines ``wdstream explain`` prints for ``steps`` of ``dataset`` (a packed root or a
    mixture spec): per step the text of ``explanation_lines`` (steps apart by a blank line),
    or with ``fmt == "jsonl"`` one JSON record per row. ``query`` holds the
    :class:`~wdstream.read.step_query.StepQuery` options.

    Every step is checked before the first line is made (see ``explain_steps``), and the
    reader options first, as the Loader checks them.

    Raises:
        ValueError: an option out of range
            (:func:`~wdstream.read.option_checks.check_read_options`), a bad step.
    """
    from wdstream.read.mixture.spec import is_mixture
    from wdstream.read.option_checks import check_read_options

    check_read_options(**query)

    if is_mixture(dataset):
        from wdstream.read.mixture import inspect as mix

        exps = mix.explain_mixture_steps(dataset, steps, **query, **store_options)
        return _lines(exps, mix.mixture_explanation_lines, mix.mixture_explanation_records, fmt)
    from wdstream.read import provenance as prov

    one = prov.explain_steps(dataset, steps, **query, **store_options)
    return _lines(one, prov.explanation_lines, prov.explanation_records, fmt)


def _lines(
    exps: Iterator[_E],
    lines: Callable[[_E], list[str]],
    records: Callable[[_E], list[dict[str, Any]]],
    fmt: str,
) -> Iterator[str]:
    """Each explanation's text (steps apart by a blank line) or its JSON records."""
    for k, exp in enumerate(exps):
        if fmt == "jsonl":
            for record in records(exp):
                yield json.dumps(record, ensure_ascii=False)
            continue
        if k:
            yield ""
        yield from lines(exp)
