"""The Jinja environment chat templates are rendered in: the one ``transformers`` builds.

``transformers`` (``utils/chat_template_utils.py``, ``_cached_compile_jinja_template``)
renders a chat template in an ``ImmutableSandboxedEnvironment`` (templates from the Hub are
untrusted code) with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension
(``{% break %}``, ``{% continue %}``) and a ``{% generation %}`` block tag, a ``tojson``
filter that keeps non-ASCII characters and takes ``indent``/``separators``/``sort_keys``,
and the globals ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` (the last
two restricted so a template cannot reach Python internals). This module builds the same
environment with its own code, so rendering needs no ``transformers``.

The ``{% generation %}`` tag renders its body and records where it lies in the output, as
``transformers``' ``AssistantTracker`` does (the start is the length of what the render has
output before the block): a template with the tags is supervised exactly on those blocks
(:mod:`wdstream.chat.masks`).

The environment is :class:`~wdstream.chat.budget.BoundedEnvironment`: the same sandbox, with
bounds on the steps and characters a render may take (:mod:`wdstream.chat.budget`).

``strftime_now`` formats a fixed time given when the environment is built (transformers
reads the clock on every call): a template that writes today's date must write the same
text on every render of a pack, or a resumed pack would tokenise other text.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils

from wdstream.chat.budget import BoundedEnvironment

__all__ = ["chat_environment", "has_generation"]


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: its body, its place in the output recorded
    in the render's budget (:attr:`~wdstream.chat.budget.Budget.blocks`).

    As ``transformers``' ``AssistantTracker``: a call block whose body is rendered to a string;
    its start is what the render has output so far (a block inside a macro or a ``{% set %}``
    is placed there too, as ``transformers`` places it).
    """

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation_block")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation_block(self, caller: Any) -> str:
        text = str(caller())
        budget = self.environment.budget  # type: ignore[attr-defined]
        budget.blocks.append((budget.written, budget.written + len(text)))
        return text


def has_generation(env: jinja2.Environment, source: str) -> bool:
    """Whether the template text has a ``{% generation %}`` block."""
    return any(
        isinstance(n.call, jinja2.nodes.Call)
        and isinstance(n.call.node, jinja2.nodes.ExtensionAttribute)
        and n.call.node.name == "_generation_block"
        for n in env.parse(source).find_all(jinja2.nodes.CallBlock)
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters; chat templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _TemplateDict:
    """``dict(...)`` and ``dict.fromkeys(...)`` without the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """Jinja's ``namespace`` refusing underscore-prefixed names (no dunder attributes)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"got {name!r}"
            )


def chat_environment(now: datetime) -> BoundedEnvironment:
    """A new environment as ``transformers`` builds it (module docstring), bounded
    (:mod:`wdstream.chat.budget`); ``strftime_now`` formats ``now``."""
    env = BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = env.guarded("tojson", _tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = now.strftime
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env
