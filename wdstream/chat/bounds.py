"""The size checks of :mod:`wdstream.chat.budget`: whether an operation a chat template asks
for would make a value past the bounds, judged from its arguments before it runs (or from its
result, for operations that cannot grow their input much).

A value may hold :data:`MAX_RENDER_CHARS` characters, a container :data:`MAX_ITEMS` items, an
integer about 20,000 digits. Past a bound the check raises :class:`RenderBudgetError`.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any, cast

from jinja2.utils import generate_lorem_ipsum

__all__ = [
    "MAX_ITEMS",
    "MAX_RENDER_CHARS",
    "RenderBudgetError",
    "MAX_INT_BITS",
    "check_format",
    "check_percent",
    "checked",
    "filter_checks",
    "method_checks",
    "size_of",
    "too_big",
    "value_arg",
]

MAX_RENDER_CHARS = 1 << 24  # characters of any value, and of a render's output
MAX_ITEMS = 1 << 20  # items of a list, tuple, dict or set a template makes
MAX_INT_BITS = 1 << 16  # an int a template computes (about 20,000 digits)
_ITEMWISE = frozenset({"list", "sort", "unique", "reverse", "groupby", "dictsort", "map",
                       "select", "reject", "selectattr", "rejectattr", "sum", "min", "max",
                       "items", "wordcount", "batch", "slice", "random", "first", "last"})  # fmt: skip
_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


class RenderBudgetError(Exception):
    """A render went past one of the module's bounds (the message says which)."""


def too_big(what: str, size: int, limit: int = MAX_RENDER_CHARS) -> RenderBudgetError:
    """The error for a value of ``size`` past ``limit``."""
    unit = "items" if limit == MAX_ITEMS else "characters"
    return RenderBudgetError(
        f"{what} would make {size:,} {unit}: that passes {limit:,} {unit}, the bound on what "
        "a chat template may make"
    )


def size_of(value: Any, limit: int = MAX_RENDER_CHARS, depth: int = 0) -> int:
    """About how many characters ``str(value)`` has: strings by length, containers by the
    sum over their items (stopping once past ``limit``), numbers by digits."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 1
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple, set, frozenset)):
        if depth > 32:
            return limit + 1
        total = 2 * len(value)
        for item in value:
            total += size_of(item, limit, depth + 1)
            if total > limit:
                break
        return total
    return 32


def checked(value: Any, what: str) -> Any:
    """``value`` if its own size is within bounds (strings: characters; containers: items)."""
    if isinstance(value, (str, bytes)):
        if len(value) > MAX_RENDER_CHARS:
            raise too_big(what, len(value))
    elif isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > MAX_ITEMS:
        raise too_big(what, len(value), MAX_ITEMS)
    return value


def _int_arg(args: tuple[Any, ...], kwargs: dict[str, Any], at: int, key: str, default: Any) -> Any:
    return args[at] if len(args) > at else kwargs.get(key, default)


def _check_width(width: Any, what: str) -> None:
    if isinstance(width, int) and width > MAX_RENDER_CHARS:
        raise too_big(what, width)


def check_percent(fmt: str, args: Any) -> None:
    """``fmt % args`` stays within bounds: no width or precision past the bound, no ``*``
    widths taken from ``args`` past it, and the arguments themselves within it."""
    for match in _WIDTH.finditer(fmt):
        for group in match.groups():
            if group and group != "*" and int(group) > MAX_RENDER_CHARS:
                raise too_big("a '%' format", int(group))
    values = args if isinstance(args, tuple) else (args,)
    for value in values:
        _check_width(value, "a '%' format")
    size = len(fmt) + size_of(values)
    if size > MAX_RENDER_CHARS:
        raise too_big("a '%' format", size)


def check_format(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``fmt.format(...)`` stays within bounds: format specs with no width past the bound
    and no nested field (a width taken from the arguments), arguments within the bound."""
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error
    for _, _, spec, _ in parsed:
        if spec and "{" in spec:
            raise RenderBudgetError("a format spec with a nested field (a computed width)")
        for digits in re.findall(r"\d+", spec or ""):
            if int(digits) > MAX_RENDER_CHARS:
                raise too_big("a format spec", int(digits))
    size = len(fmt) + size_of(args) + size_of(list(kwargs.values()))
    if size > MAX_RENDER_CHARS:
        raise too_big("str.format", size)


def _check_replace(s: Any, old: Any, new: Any, count: Any = -1) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        found = s.count(old) if old else len(s) + 1
        if isinstance(count, int) and count >= 0:
            found = min(found, count)
        size = len(s) + found * (len(new) - len(old))
        if size > MAX_RENDER_CHARS:
            raise too_big("replace", size)


def _listed(items: Iterable[Any], what: str) -> list[Any]:
    """``items`` as a list, refused past :data:`MAX_ITEMS`."""
    out = list(islice(items, MAX_ITEMS + 1))
    if len(out) > MAX_ITEMS:
        raise too_big(what, len(out), MAX_ITEMS)
    return out


def _check_joined(items: list[Any], sep: Any, what: str) -> None:
    size = size_of(items) + len(str(sep)) * len(items)
    if size > MAX_RENDER_CHARS:
        raise too_big(what, size)


def method_checks(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Check a call of a string or int method that can grow its input; return the
    arguments to call it with (``join``'s iterable read into a list once)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if isinstance(owner, (str, bytes)):
        if name in ("center", "ljust", "rjust", "zfill"):
            _check_width(_int_arg(args, kwargs, 0, "width", 0), f"str.{name}")
        elif name == "expandtabs":
            tab = _int_arg(args, kwargs, 0, "tabsize", 8)
            tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
            if isinstance(tab, int) and len(owner) + tabs * tab > MAX_RENDER_CHARS:
                raise too_big("expandtabs", tab)
        elif name == "replace" and len(args) >= 2:
            _check_replace(owner, args[0], args[1], args[2] if len(args) > 2 else -1)
        elif name == "join" and args:
            items = _listed(args[0], "join")
            _check_joined(items, owner, "join")
            return (items, *args[1:])
        elif name in ("split", "rsplit", "splitlines"):
            sep = _int_arg(args, kwargs, 0, "sep", None) if name != "splitlines" else "\n"
            pieces = cast(Any, owner).count(sep) + 1 if sep else len(owner) // 2 + 1
            if pieces > MAX_ITEMS:
                raise too_big(f"str.{name}", pieces, MAX_ITEMS)
        elif name == "translate" and args and isinstance(args[0], dict):
            longest = max((size_of(v) for v in args[0].values()), default=1)
            if len(owner) * longest > MAX_RENDER_CHARS:
                raise too_big("translate", len(owner) * longest)
    elif isinstance(owner, int) and name == "to_bytes":
        _check_width(_int_arg(args, kwargs, 0, "length", 1), "int.to_bytes")
    elif obj is generate_lorem_ipsum:
        n, most = _int_arg(args, kwargs, 0, "n", 5), _int_arg(args, kwargs, 3, "max", 100)
        if isinstance(n, int) and isinstance(most, int) and n * most > MAX_RENDER_CHARS // 16:
            raise too_big("lipsum", n * most * 8)
    return args


def value_arg(func: Callable[..., Any], args: tuple[Any, ...]) -> int:
    """Where a filter's value is among its arguments (after a context it is passed)."""
    return 1 if getattr(func, "jinja_pass_arg", None) is not None else 0


def filter_checks(name: str, value: Any, rest: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Check a filter that can grow its input before it runs; return the value to give it."""
    if name == "center":
        _check_width(_int_arg(rest, kwargs, 0, "width", 80), "center")
    elif name == "indent":
        width = _int_arg(rest, kwargs, 0, "width", 4)
        each = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        lines = str(value).count("\n") + 1 if isinstance(value, str) else 1
        if lines * each + size_of(value) > MAX_RENDER_CHARS:
            raise too_big("indent", lines * each)
    elif name == "format" and isinstance(value, str):
        check_percent(value, tuple(rest) or tuple(kwargs.values()))
    elif name == "replace" and len(rest) >= 2:
        _check_replace(value, rest[0], rest[1], rest[2] if len(rest) > 2 else -1)
    elif name in ("batch", "slice"):
        _check_width(_int_arg(rest, kwargs, 0, "linecount" if name == "batch" else "slices", 1)
                     * 64, name)  # fmt: skip
    elif name == "join":
        items = value if isinstance(value, str) else _listed(value, "join")
        _check_joined(list(items) if isinstance(items, str) else items,
                      _int_arg(rest, kwargs, 0, "d", ""), "join")  # fmt: skip
        return items
    elif name in _ITEMWISE and isinstance(value, (str, list, tuple, dict)):
        count = len(value) // 2 if name == "wordcount" else len(value)
        if count > MAX_ITEMS:
            raise too_big(f"the {name} filter", count, MAX_ITEMS)
    elif name == "list":
        return _listed(value, "list")
    elif name in ("string", "tojson", "pprint", "e", "escape", "forceescape", "urlize", "urlencode",
                  "xmlattr", "striptags", "wordwrap", "title", "upper", "lower", "capitalize"):  # fmt: skip
        size = size_of(value)
        if size > MAX_RENDER_CHARS // 4:
            raise too_big(f"the {name} filter", size, MAX_RENDER_CHARS // 4)
    return value
