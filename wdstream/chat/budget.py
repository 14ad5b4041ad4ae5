"""What one conversation's renders may cost: steps, seconds and characters.

A chat template is code from the Hub. The sandbox ``transformers`` renders it in bounds
``range`` (100,000 items) and attribute access, not work or memory: ``'x' * 10**9`` builds a
gigabyte before anything can look at it, two nested ``range(100000)`` loops with an empty
body run 10**10 times, a namespace string doubled in a loop or a macro passing ``s ~ s`` to
itself grows without end. :class:`BoundedEnvironment` is that sandbox with every way to grow
or to loop bounded *before* the work is done:

* **steps**: every item a ``{% for %}`` loop takes (its iterable is wrapped, filtered loops
  included), every call (macros, ``caller()``, methods, ``loop(...)`` of a recursive loop) and
  every filter is a step, plus one per item of the container and per 4,096 characters of the
  string a method, ``in`` or a filter whose work grows with its value (``sort``, ``join``,
  ``tojson``, ...) works on, and one per 4,096 characters made (below); a conversation's
  renders together may take :data:`MAX_STEPS` plus :data:`STEPS_PER_RENDER` per render (a
  conversation of n messages takes 2n-3n renders, each looping over up to n messages:
  honest work grows as n**2), and (a backstop for work the steps price low, such as ``in``
  over long strings) :data:`MAX_SECONDS` of wall time, checked every 1,024 steps;
* **characters**: no value a template makes may pass :data:`MAX_RENDER_CHARS` characters,
  nor a container :data:`MAX_ITEMS` items. ``*``, ``**``, ``+`` and ``%`` (intercepted
  operators), ``~``, ``str.format``, the string methods and filters that can grow their
  input (``center``, ``ljust``, ``replace``, ``join``, ``indent``, ``format``, ``batch``,
  ``slice``, ``tojson``, ``string``, ...) and those that make an item per character
  (``split``, ``list``, ``sort``, ``wordcount``, ...) check the size of their result from
  their arguments before computing it; every other call and filter checks its result after;
  a render's output, and any block, macro or ``{% set %}`` body it buffers, is refused when
  it passes :data:`MAX_RENDER_CHARS`;
* **made**: the characters (and items) of everything the operators, calls, filters, ``~``
  and block bodies of one render make add up to at most :data:`MAX_MADE`, so values kept
  alive (a namespace list grown in a loop) cannot add up to more memory than that.

Past a bound the render raises :class:`RenderBudgetError`, which the template's caller
(:meth:`~wdstream.chat.template.ChatTemplate.render_prepared`) turns into the template's
refusal of the conversation. The steps are a count, so which conversations a template is
refused on does not depend on the machine; only the seconds do, and they are far past any
real template's (the tests render 1,000-message conversations in well under a second).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

from jinja2 import nodes
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from wdstream.chat.bounds import (
    MAX_INT_BITS,
    MAX_ITEMS,
    MAX_RENDER_CHARS,
    RenderBudgetError,
    check_format,
    check_percent,
    checked,
    filter_checks,
    method_checks,
    size_of,
    too_big,
    value_arg,
)

__all__ = [
    "MAX_ITEMS",
    "MAX_MADE",
    "MAX_RENDER_CHARS",
    "MAX_SECONDS",
    "MAX_STEPS",
    "STEPS_PER_RENDER",
    "BoundedEnvironment",
    "Budget",
    "RenderBudgetError",
]

MAX_STEPS = 1_000_000  # loop items, calls and filters of one conversation's renders, plus
STEPS_PER_RENDER = 20_000  # this for each render it takes (it takes 2-3 per message)
MAX_SECONDS = 300.0  # wall time of one conversation's renders (a backstop)
MAX_MADE = 4 * MAX_RENDER_CHARS  # characters and items one render's operations make
_CLOCK_EVERY = 1024  # steps between looks at the clock
_SEQUENCES = (str, bytes, list, tuple)


class Budget:
    """What is left to one conversation's renders (the module docstring), and the
    ``{% generation %}`` blocks of the render in progress.

    Args:
        steps: steps the renders may take.
        seconds: wall time they may take.
    """

    __slots__ = ("blocks", "deadline", "made", "next_clock", "seconds", "steps", "written")

    def __init__(self, steps: int = MAX_STEPS, seconds: float = MAX_SECONDS) -> None:
        self.steps = steps
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.next_clock = steps - _CLOCK_EVERY
        self.written = 0  # characters the render in progress has output
        self.made = 0  # characters and items its operations have made
        self.blocks: list[tuple[int, int]] = []  # its generation blocks, [start, end)

    def spend(self, steps: int = 1) -> None:
        """Take ``steps``; raise :class:`RenderBudgetError` past the steps or the seconds."""
        self.steps -= steps
        if self.steps <= self.next_clock:
            self._look()

    def _look(self) -> None:
        """Past a clock mark: refuse past the steps, the made characters or the seconds."""
        if self.made > MAX_MADE:
            raise RenderBudgetError(
                f"the template makes more than {MAX_MADE:,} characters (or items) in one "
                "render: values that grow without end"
            )
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

    def make(self, value: Any) -> Any:
        """Count what ``value`` (just made by the template) holds against :data:`MAX_MADE`
        and the steps; return it."""
        if type(value) is str or isinstance(value, (bytes, list, tuple, dict)):
            self.charge(len(value))
        return value

    def charge(self, n: int) -> None:
        """Count ``n`` characters (or items) made against :data:`MAX_MADE` and the steps
        (a step, and one per 4,096)."""
        self.made += n
        self.steps -= 1 + (n >> 12)
        if self.steps <= self.next_clock or self.made > MAX_MADE:
            self._look()

    def start_render(self) -> None:
        """A new render begins: :data:`STEPS_PER_RENDER` more steps, nothing written or made,
        no generation block yet."""
        self.steps += STEPS_PER_RENDER
        self.next_clock += STEPS_PER_RENDER
        self.written = 0
        self.made = 0
        self.blocks = []


_LOOP = "__bounded_loop__"  # the filters the tree is rewritten with (called directly, not
_CONCAT = "__bounded_concat__"  # through the sandbox's call: one Python call each)
_IN = "__bounded_in__"
_SLICE = "__bounded_slice__"


_LINEAR = frozenset({"sort", "unique", "groupby", "dictsort", "list", "join", "sum", "min", "max",
                     "tojson", "string", "pprint", "batch", "slice", "wordcount", "e", "escape",
                     "forceescape", "striptags", "upper", "lower", "title", "capitalize",
                     "replace", "trim", "indent", "wordwrap", "truncate", "center", "format",
                     "urlize", "urlencode", "xmlattr", "reverse"})  # fmt: skip


def _work(value: Any) -> int:
    """The steps a filter or method costs on ``value``: one, plus one per item of a container
    (a sort, a copy, a lookup through it) and one per 4,096 characters of a string."""
    if type(value) is str:
        return 1 + (len(value) >> 12)
    if isinstance(value, (list, tuple, dict, set)):
        return 1 + len(value)
    return 1


class _Bounds(NodeTransformer):
    """Every ``{% for %}`` iterable through :meth:`BoundedEnvironment.bounded_loop` (a step
    per item), every ``~`` through :meth:`BoundedEnvironment.bounded_concat` (its size
    checked first), every ``in`` through :meth:`BoundedEnvironment.bounded_in` (steps by
    the size of what it looks through), every slice through
    :meth:`BoundedEnvironment.bounded_slice` (what it copies counted)."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = cast(nodes.For, self.generic_visit(node))
        node.iter = nodes.Filter(node.iter, _LOOP, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        node = cast(nodes.Compare, self.generic_visit(node))
        if len(node.ops) != 1 or node.ops[0].op not in ("in", "notin"):
            return node
        pair = nodes.Tuple([node.expr, node.ops[0].expr], "load", lineno=node.lineno)
        op = nodes.Const(node.ops[0].op, lineno=node.lineno)
        return nodes.Filter(pair, _IN, [op], [], None, None, lineno=node.lineno)

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        node = cast(nodes.Getitem, self.generic_visit(node))
        if not isinstance(node.arg, nodes.Slice):
            return node
        ends = [x or nodes.Const(None) for x in (node.arg.start, node.arg.stop, node.arg.step)]
        return nodes.Filter(node.node, _SLICE, ends, [], None, None, lineno=node.lineno)

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = cast(nodes.Concat, self.generic_visit(node))
        parts = nodes.Tuple(list(node.nodes), "load", lineno=node.lineno)
        return nodes.Filter(parts, _CONCAT, [], [], None, None, lineno=node.lineno)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """``transformers``' sandbox with the bounds of the module docstring. The budget in force
    is per thread: :meth:`using` sets one for a conversation's renders."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._local = threading.local()
        self.finalize = self._finalize
        self.filters = {name: self.guarded(name, f) for name, f in self.filters.items()}
        self.filters[_LOOP] = self.bounded_loop
        self.filters[_CONCAT] = self.bounded_concat
        self.filters[_IN] = self.bounded_in
        self.filters[_SLICE] = self.bounded_slice

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
        return tree

    def guarded(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        """Filter ``func`` (named ``name``) with its size checks and a step (module
        docstring); every filter of the environment is one."""

        linear = name in _LINEAR  # its work grows with its value's size

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            at = value_arg(func, args)
            if len(args) > at:
                value = filter_checks(name, args[at], args[at + 1 :], kwargs)
                args = (*args[:at], value, *args[at + 1 :])
            budget = self._local.budget
            budget.spend(_work(args[at]) if linear and len(args) > at else 1)
            return budget.make(checked(func(*args, **kwargs), f"the {name} filter"))

        return guarded

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """``*``, ``**``, ``+`` and ``%`` with their result's size checked first."""
        if operator == "+" and type(left) is str and type(right) is str:  # most of them
            if len(left) + len(right) > MAX_RENDER_CHARS:
                raise too_big("'+'", len(left) + len(right))
            self._local.budget.charge(len(left) + len(right))
            return left + right
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, _SEQUENCES) and isinstance(n, int) and n > 0:
                    limit = MAX_RENDER_CHARS if isinstance(seq, (str, bytes)) else MAX_ITEMS
                    if len(seq) * n > limit:
                        raise too_big("'*'", len(seq) * n, limit)
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise too_big("'*' of integers", left.bit_length() + right.bit_length())
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                if right * left.bit_length() > MAX_INT_BITS:
                    raise RenderBudgetError(f"'**' would make an integer of {right:,}+ bits")
        elif operator == "+":
            if isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
                limit = MAX_RENDER_CHARS if isinstance(left, (str, bytes)) else MAX_ITEMS
                if len(left) + len(right) > limit:
                    raise too_big("'+'", len(left) + len(right), limit)
        elif operator == "%" and isinstance(left, str):
            check_percent(left, right)
        out = checked(self.binop_table[operator](left, right), f"'{operator}'")
        return self.budget.make(out) if isinstance(out, _SEQUENCES) else out

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        """A call from the template: a step, its size checks, the sandbox's own checks."""
        __self.budget.spend(_work(getattr(__obj, "__self__", None)))
        if isinstance(__obj, LoopContext) and args:  # loop(children) of a recursive loop
            args = (__self.bounded_loop(args[0]), *args[1:])
        else:
            args = method_checks(__obj, args, kwargs)
        out = super().call(__context, __obj, *args, **kwargs)
        out = checked(out, f"a call of {getattr(__obj, '__name__', 'a function')}")
        return __self.budget.make(out) if isinstance(out, _SEQUENCES) else out

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format``/``format_map`` of the sandbox, its size checked first."""
        fmt = super().wrap_str_format(value)
        if fmt is None:
            return None
        text = value.__self__

        def bounded_format(*args: Any, **kwargs: Any) -> str:
            mapping = args[0] if value.__name__ == "format_map" and args else {}
            check_format(str(text), args, {**kwargs, **dict(mapping)})
            return fmt(*args, **kwargs)

        return bounded_format

    def bounded_loop(self, iterable: Any) -> Iterator[Any]:
        """The items of a ``{% for %}`` loop, a step each."""
        budget = self.budget
        spend = budget.spend
        for item in iterable:
            spend(1)
            yield item

    def bounded_in(self, pair: tuple[Any, Any], op: str) -> bool:
        """``a in b`` (``op`` ``in``) or ``a not in b`` (``notin``), a step per item of ``b``
        or per 4,096 of its characters."""
        self.budget.spend(_work(pair[1]))
        found = pair[0] in pair[1]
        return found if op == "in" else not found

    def bounded_slice(self, value: Any, start: Any, stop: Any, step: Any) -> Any:
        """``value[start:stop:step]``, what it copies counted as made."""
        out = value[start:stop:step]
        if isinstance(out, _SEQUENCES):
            self.budget.charge(len(out))
        return out

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        """``a ~ b ~ ...``, its size checked first."""
        size = size_of(list(parts))
        if size > MAX_RENDER_CHARS:
            raise too_big("'~'", size)
        return self.budget.make("".join(map(str, parts)))

    def concat(self, parts: Iterable[str]) -> str:
        """A macro's, block's or ``{% set %}`` body's buffered output, joined within bounds."""
        parts = list(parts)
        size = sum(map(len, parts))
        if size > MAX_RENDER_CHARS:
            raise too_big("a block's output", size)
        return self.budget.make("".join(parts))

    def _finalize(self, value: Any) -> Any:
        """What ``{{ ... }}`` writes, refused when its text would pass the bound."""
        if type(value) is not str:
            size = size_of(value)
            if size > MAX_RENDER_CHARS:
                raise too_big("an expression's text", size)
            self.budget.charge(size)  # str() of it is made next
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
