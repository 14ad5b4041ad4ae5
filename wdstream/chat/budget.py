"""What one conversation's renders may cost: steps, seconds and characters.

A chat template is code from the Hub. The sandbox ``transformers`` renders it in bounds
``range`` (100,000 items) and attribute access, not work or memory: ``'x' * 10**9`` builds a
gigabyte before anything can look at it, two nested ``range(100000)`` loops with an empty
body run 10**10 times, a namespace string doubled in a loop or a macro passing ``s ~ s`` to
itself grows without end. :class:`BoundedEnvironment` is that sandbox with every way to grow
or to loop bounded *before* the work is done:

* **steps**: every item a ``{% for %}`` loop takes (its iterable is wrapped, filtered loops
  included), every call (macros, ``caller()``, methods, ``loop(...)`` of a recursive loop) and
  every filter is a step, plus one per 4,096 characters a call, filter or operator makes;
  a conversation's renders together may take :data:`MAX_STEPS`, and (a backstop for work
  the steps price low) :data:`MAX_SECONDS` of wall time, checked every 4,096 steps;
* **characters**: no value a template makes may pass :data:`MAX_RENDER_CHARS` characters,
  nor a container :data:`MAX_ITEMS` items. ``*``, ``**``, ``+`` and ``%`` (intercepted
  operators), ``~``, ``str.format``, the string methods and filters that can grow their
  input (``center``, ``ljust``, ``replace``, ``join``, ``indent``, ``format``, ``batch``,
  ``slice``, ``tojson``, ``string``, ...) check the size of their result from their
  arguments before computing it; every other call and filter checks its result after;
  a render's output, and any block, macro or ``{% set %}`` body it buffers, is refused when
  it passes :data:`MAX_RENDER_CHARS`.

Past a bound the render raises :class:`RenderBudgetError`, which the template's caller
(:meth:`~wdstream.chat.template.ChatTemplate.render_prepared`) turns into the template's
refusal of the conversation. The steps are a count, so which conversations a template is
refused on does not depend on the machine; only the seconds do, and they are far past any
real template's (the tests render 1,000-message conversations in well under a second).
"""

from __future__ import annotations

import functools
import re
import string
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from jinja2 import nodes
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

__all__ = [
    "MAX_ITEMS",
    "MAX_RENDER_CHARS",
    "MAX_SECONDS",
    "MAX_STEPS",
    "BoundedEnvironment",
    "Budget",
    "RenderBudgetError",
]

MAX_RENDER_CHARS = 1 << 24  # characters of any value, and of a render's output
MAX_ITEMS = 1 << 20  # items of a list, tuple, dict or set a template makes
MAX_STEPS = 4_000_000  # loop items, calls and filters of one conversation's renders
MAX_SECONDS = 60.0  # wall time of one conversation's renders (a backstop)
_CHARS_PER_STEP = 4096
_CLOCK_EVERY = 4096  # steps between looks at the clock
_MAX_INT_BITS = 1 << 16  # an int a template computes (about 20,000 digits)
_SEQUENCES = (str, bytes, list, tuple)
_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


class RenderBudgetError(Exception):
    """A render went past one of the module's bounds (the message says which)."""


class Budget:
    """What is left to one conversation's renders (the module docstring), and the
    ``{% generation %}`` blocks of the render in progress.

    Args:
        steps: steps the renders may take.
        seconds: wall time they may take.
    """

    __slots__ = ("blocks", "deadline", "next_clock", "seconds", "steps", "written")

    def __init__(self, steps: int = MAX_STEPS, seconds: float = MAX_SECONDS) -> None:
        self.steps = steps
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.next_clock = steps - _CLOCK_EVERY
        self.written = 0  # characters the render in progress has output
        self.blocks: list[tuple[int, int]] = []  # its generation blocks, [start, end)

    def spend(self, steps: int = 1) -> None:
        """Take ``steps``; raise :class:`RenderBudgetError` past the steps or the seconds."""
        self.steps -= steps
        if self.steps > self.next_clock:
            return
        if self.steps < 0:
            raise RenderBudgetError(
                f"the template takes more than {MAX_STEPS:,} steps (loop items, calls, "
                "filters) on this conversation: a loop or recursion without end"
            )
        self.next_clock = self.steps - _CLOCK_EVERY
        if time.monotonic() > self.deadline:
            raise RenderBudgetError(
                f"the template takes more than {self.seconds:g} s on this conversation"
            )

    def start_render(self) -> None:
        """A new render begins: nothing written, no generation block yet."""
        self.written = 0
        self.blocks = []


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


def _checked(value: Any, what: str) -> Any:
    """``value`` if its own size is within bounds (strings: characters; containers: items)."""
    if isinstance(value, (str, bytes)):
        if len(value) > MAX_RENDER_CHARS:
            raise too_big(what, len(value))
    elif isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > MAX_ITEMS:
        raise too_big(what, len(value), MAX_ITEMS)
    return value


def _int_arg(args: tuple[Any, ...], kwargs: dict[str, Any], at: int, key: str, default: int) -> Any:
    return args[at] if len(args) > at else kwargs.get(key, default)


def _check_width(width: Any, what: str) -> None:
    if isinstance(width, int) and width > MAX_RENDER_CHARS:
        raise too_big(what, width)


def _check_percent(fmt: str, args: Any) -> None:
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


def _check_format(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
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


def _method_checks(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Check a call of a string or int method that can grow its input; return the
    arguments to call it with (``join``'s iterable read into a list once)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if isinstance(owner, (str, bytes)):
        if name in ("center", "ljust", "rjust", "zfill"):
            _check_width(_int_arg(args, kwargs, 0, "width", 0), f"str.{name}")
        elif name == "expandtabs":
            tab = _int_arg(args, kwargs, 0, "tabsize", 8)
            if isinstance(tab, int) and len(owner) + owner.count("\t" if isinstance(owner, str)
                                                                  else b"\t") * tab > MAX_RENDER_CHARS:  # fmt: skip
                raise too_big("expandtabs", tab)
        elif name == "replace" and len(args) >= 2:
            _check_replace(owner, args[0], args[1], args[2] if len(args) > 2 else -1)
        elif name == "join" and args:
            items = _listed(args[0], "join")
            _check_joined(items, owner, "join")
            return (items, *args[1:])
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


def _value_arg(func: Callable[..., Any], args: tuple[Any, ...]) -> int:
    """Where a filter's value is among its arguments (after a context it is passed)."""
    return 1 if getattr(func, "jinja_pass_arg", None) is not None else 0


def _filter_checks(name: str, value: Any, rest: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
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
        _check_percent(value, tuple(rest) or tuple(kwargs.values()))
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
    elif name == "list" and not isinstance(value, str):
        return _listed(value, "list")
    elif name in ("string", "tojson", "pprint", "e", "escape", "forceescape", "urlize", "urlencode",
                  "xmlattr", "striptags", "wordwrap", "title", "upper", "lower", "capitalize"):  # fmt: skip
        size = size_of(value)
        if size > MAX_RENDER_CHARS // 4:
            raise too_big(f"the {name} filter", size, MAX_RENDER_CHARS // 4)
    return value


class _Bounds(NodeTransformer):
    """Every ``{% for %}`` iterable wrapped in ``environment.bounded_loop`` (a step per
    item), every ``~`` a call of ``environment.bounded_concat`` (its size checked first)."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = nodes.Call(nodes.EnvironmentAttribute("bounded_loop"), [node.iter], [],
                               None, None, lineno=node.lineno)  # fmt: skip
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute("bounded_concat"), list(node.nodes), [],
                          None, None, lineno=node.lineno)  # fmt: skip


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """``transformers``' sandbox with the bounds of the module docstring. The budget in force
    is per thread: :meth:`using` sets one for a conversation's renders."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._local = threading.local()
        self.finalize = self._finalize
        self.filters = {name: self.guarded(name, f) for name, f in self.filters.items()}

    @property
    def budget(self) -> Budget:
        """The budget of the renders in progress on this thread (one is made if none is)."""
        budget = getattr(self._local, "budget", None)
        if budget is None:
            budget = self._local.budget = Budget()
        return budget

    def current(self) -> Budget | None:
        """This thread's budget, None if none is set."""
        return getattr(self._local, "budget", None)

    def using(self, budget: Budget | None) -> None:
        """Make ``budget`` this thread's (None: none, the next render makes its own)."""
        self._local.budget = budget

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = _Bounds().visit(super()._parse(source, name, filename))
        tree.set_environment(self)
        return tree  # type: ignore[no-any-return]

    def guarded(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        """Filter ``func`` (named ``name``) with its size checks and a step (module
        docstring); every filter of the environment is one."""

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            at = _value_arg(func, args)
            if len(args) > at:
                value = _filter_checks(name, args[at], args[at + 1 :], kwargs)
                args = (*args[:at], value, *args[at + 1 :])
            out = _checked(func(*args, **kwargs), f"the {name} filter")
            self.budget.spend(1 + (len(out) // _CHARS_PER_STEP if isinstance(out, str) else 0))
            return out

        return guarded

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """``*``, ``**``, ``+`` and ``%`` with their result's size checked first."""
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, _SEQUENCES) and isinstance(n, int) and n > 0:
                    limit = MAX_RENDER_CHARS if isinstance(seq, (str, bytes)) else MAX_ITEMS
                    if len(seq) * n > limit:
                        raise too_big("'*'", len(seq) * n, limit)
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                    raise too_big("'*' of integers", left.bit_length() + right.bit_length())
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                if right * left.bit_length() > _MAX_INT_BITS:
                    raise RenderBudgetError(f"'**' would make an integer of {right:,}+ bits")
        elif operator == "+":
            if isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
                limit = MAX_RENDER_CHARS if isinstance(left, (str, bytes)) else MAX_ITEMS
                if len(left) + len(right) > limit:
                    raise too_big("'+'", len(left) + len(right), limit)
        elif operator == "%" and isinstance(left, str):
            _check_percent(left, right)
        out = self.binop_table[operator](left, right)
        if isinstance(out, str):
            self.budget.spend(1 + len(out) // _CHARS_PER_STEP)
        return _checked(out, f"'{operator}'")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        """A call from the template: a step, its size checks, the sandbox's own checks."""
        __self.budget.spend(1)
        if isinstance(__obj, LoopContext) and args:  # loop(children) of a recursive loop
            args = (__self.bounded_loop(args[0]), *args[1:])
        else:
            args = _method_checks(__obj, args, kwargs)
        out = super().call(__context, __obj, *args, **kwargs)
        if isinstance(out, str) and len(out) >= _CHARS_PER_STEP:
            __self.budget.spend(len(out) // _CHARS_PER_STEP)
        return _checked(out, f"a call of {getattr(__obj, '__name__', 'a function')}")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format``/``format_map`` of the sandbox, its size checked first."""
        fmt = super().wrap_str_format(value)
        if fmt is None:
            return None
        text = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            mapping = args[0] if value.__name__ == "format_map" and args else {}
            _check_format(str(text), args, {**kwargs, **dict(mapping)})
            return fmt(*args, **kwargs)

        return checked

    def bounded_loop(self, iterable: Any) -> Iterator[Any]:
        """The items of a ``{% for %}`` loop, a step each."""
        budget = self.budget
        for item in iterable:
            budget.spend(1)
            yield item

    def bounded_concat(self, *parts: Any) -> str:
        """``a ~ b ~ ...``, its size checked first."""
        size = size_of(list(parts))
        if size > MAX_RENDER_CHARS:
            raise too_big("'~'", size)
        return "".join(map(str, parts))

    def concat(self, parts: Iterable[str]) -> str:  # type: ignore[override]
        """A macro's, block's or ``{% set %}`` body's buffered output, joined within bounds."""
        parts = list(parts)
        size = sum(map(len, parts))
        if size > MAX_RENDER_CHARS:
            raise too_big("a block's output", size)
        return "".join(parts)

    def _finalize(self, value: Any) -> Any:
        """What ``{{ ... }}`` writes, refused when its text would pass the bound."""
        if not isinstance(value, str) and size_of(value) > MAX_RENDER_CHARS:
            raise too_big("an expression's text", size_of(value))
        return value

    def render_chunks(self, chunks: Iterator[str]) -> str:
        """A render's output (``root_render_func``'s chunks) joined, refused past
        :data:`MAX_RENDER_CHARS`; each chunk's end is counted where ``{% generation %}``
        blocks record their start, as ``transformers`` counts them."""
        budget = self.budget
        budget.start_render()
        out: list[str] = []
        for chunk in chunks:
            budget.written += len(chunk)
            if budget.written > MAX_RENDER_CHARS:
                raise RenderBudgetError(
                    f"the rendered text passes {MAX_RENDER_CHARS:,} characters (the bound on "
                    "one render: a template whose output explodes)"
                )
            out.append(chunk)
        return "".join(out)
