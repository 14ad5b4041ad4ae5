"""A mixture's description: sources by name, weights or a schedule, the stop rule.

Given in code (``Loader({"web": "s3://b/web/", "code": "data/code/"}, weights={...})``) or
as a spec file, JSON or TOML, that ``Loader``, ``wdstream stats`` and ``wdstream explain``
all read, so training and inspection see the same mixture::

    # mix.toml                                 // mix.json
    stop = "first_exhausted"  # optional       {"sources": {"web": "s3://b/web/",
    [sources]                                                "code": "code/"},
    web = "s3://b/web/"                         "schedule": [
    code = "code/"        # next to the file      {"step": 0, "weights": {"web": 0.7, "code": 0.3}},
    [[schedule]]                                  {"step": 9000, "weights": {"web": 0.2, "code": 0.8}}]}
    step = 0
    weights = { web = 0.7, code = 0.3 }
    [[schedule]]
    step = 9000
    weights = { web = 0.2, code = 0.8 }

``weights = {...}`` instead of ``[[schedule]]`` is one piece from step 0. A relative local
source path is taken from the spec file's folder. TOML is read with ``tomllib`` (Python
3.11+); on 3.10 a ``.toml`` spec is an error that says to use JSON.
"""

from __future__ import annotations

import json
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_SPEC_BYTES",
    "STOP_RULES",
    "MixtureSpec",
    "check_names",
    "check_static_weights",
    "is_mixture",
    "mixture_spec",
    "read_spec",
]

STOP_RULES = (None, "first_exhausted", "all_exhausted")
_SPEC_KEYS = {"sources", "weights", "schedule", "stop"}
# Thousands of sources and schedule pieces fit in far less; past this a file is no spec.
MAX_SPEC_BYTES = 1 << 20


@dataclass(frozen=True)
class MixtureSpec:
    """Sources (name -> dataset URL, in order), raw weights or schedule, the stop rule."""

    sources: dict[str, str]
    weights: Any
    stop: str | None = None

    @property
    def names(self) -> list[str]:
        return list(self.sources)


def is_mixture(source: Any) -> bool:
    """A mapping of sources, or a path to a ``.json`` / ``.toml`` spec file."""
    if isinstance(source, Mapping):
        return True
    return isinstance(source, str | Path) and str(source).endswith((".json", ".toml"))


def _load(path: Path) -> Any:
    """The parsed spec file; a file too large or nested too deeply to be a spec is refused
    before (size) or while (depth) it is parsed, never a ``RecursionError`` or a long parse.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file: too large, nested too deeply, or not valid JSON/TOML.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: mixture spec file not found")
    size = path.stat().st_size
    if size > MAX_SPEC_BYTES:
        raise ValueError(
            f"{path}: {size:,} bytes is too large for a mixture spec (at most "
            f"{MAX_SPEC_BYTES:,}); a spec lists sources and weights"
        )
    try:
        return _parse(path)
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a mixture spec") from None


def _parse(path: Path) -> Any:
    if path.suffix == ".toml":
        if sys.version_info < (3, 11):
            raise ValueError(
                f"{path}: reading TOML needs Python 3.11+ (tomllib); write the spec as JSON"
            )
        import tomllib

        try:
            return tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML: {exc}") from None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None


def check_names(names: list[str], where: str = "") -> None:
    """Refuse a source name that names nothing: empty or only whitespace (a batch's
    ``source``, a state's ``config.sources`` and every message would carry it unseen).

    Raises:
        ValueError: naming the source by its position.
    """
    for j, name in enumerate(names):
        if not name.strip():
            raise ValueError(
                f"{where}source {j} is named {name!r}: a source needs a name that is not "
                "empty or blank (batches, states and messages name it)"
            )


def check_static_weights(weights: Any, where: str = "") -> None:
    """Refuse a weight of 0 (or -0.0) in a static mixture (``weights`` a mapping, one piece
    from step 0): such a source is opened, counted in the state and named in every message
    but never gives a row. Leave it out of the sources instead. A weight of 0 inside a
    schedule piece stays legal: it leaves a source out of that piece only.

    Raises:
        ValueError: naming the source.
    """
    if not isinstance(weights, Mapping):
        return  # a schedule, or malformed: parse_weights names what is wrong
    zero = [isinstance(w, numbers.Real) and not isinstance(w, bool) and w == 0
            for w in weights.values()]  # fmt: skip
    if all(zero):
        return  # no weight at all: parse_weights says they must sum to a positive total
    for name, w in weights.items():
        if isinstance(w, numbers.Real) and not isinstance(w, bool) and w == 0:
            raise ValueError(
                f"{where}weights: source {name!r} has weight {w!r}: a static mixture never "
                "reads it; remove it from the sources (a weight of 0 is legal only inside a "
                "schedule piece, where it leaves the source out of that piece)"
            )


def _resolve(base: Path, url: str) -> str:
    """A relative local path is taken from the spec file's folder."""
    if "://" in url or Path(url).is_absolute():
        return url
    return str(base / url)


def read_spec(path: str | Path) -> MixtureSpec:
    """Read a mixture spec file (see the module docstring).

    Raises:
        FileNotFoundError: if there is no such file.
        ValueError: naming the file and the key for a malformed spec.
    """
    path = Path(path)
    raw = _load(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a spec is a table/object with 'sources', got {raw!r}")
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r}; a spec has {sorted(_SPEC_KEYS)}")
    sources = raw.get("sources")
    if not isinstance(sources, dict) or not sources:
        raise ValueError(f"{path}: 'sources' must map names to dataset URLs, got {sources!r}")
    bad = [k for k, v in sources.items() if not isinstance(v, str)]
    if bad:
        raise ValueError(f"{path}: source {bad[0]!r} must be a URL or path, got "
                         f"{sources[bad[0]]!r}")  # fmt: skip
    check_names(list(sources), f"{path}: ")
    if ("weights" in raw) == ("schedule" in raw):
        raise ValueError(f"{path}: give exactly one of 'weights' and 'schedule'")
    weights = raw["weights"] if "weights" in raw else raw["schedule"]
    if "weights" in raw:
        check_static_weights(weights, f"{path}: ")
    stop = raw.get("stop")
    if stop not in STOP_RULES:
        raise ValueError(f"{path}: stop must be one of {STOP_RULES[1:]} (or left out), got "
                         f"{stop!r}")  # fmt: skip
    base = path.parent
    return MixtureSpec({k: _resolve(base, v) for k, v in sources.items()}, weights, stop)


def mixture_spec(source: Any, weights: Any, stop: str | None) -> MixtureSpec:
    """The spec of ``Loader(source, weights=..., stop=...)`` for a mixture ``source``.

    Raises:
        ValueError: for weights or a stop rule given both in a spec file and as arguments,
            an unknown stop rule, or a malformed spec.
    """
    if stop not in STOP_RULES:
        raise ValueError(f"stop must be one of {STOP_RULES}, got {stop!r}")
    if isinstance(source, Mapping):
        if not source:
            raise ValueError("a mixture needs at least one source")
        bad = [k for k, v in source.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise ValueError(f"sources map names to dataset URLs; got {bad[0]!r}: "
                             f"{source[bad[0]]!r}")  # fmt: skip
        check_names(list(source))
        check_static_weights(weights)
        return MixtureSpec(dict(source), weights, stop)
    spec = read_spec(source)
    if weights is not None:
        raise ValueError(f"{source}: the spec file gives the weights; do not pass weights= too "
                         "(edit the file's schedule to change them)")  # fmt: skip
    if stop is not None and spec.stop is not None and stop != spec.stop:
        raise ValueError(f"{source}: stop={stop!r} differs from the spec's {spec.stop!r}")
    return MixtureSpec(spec.sources, spec.weights, stop or spec.stop)
