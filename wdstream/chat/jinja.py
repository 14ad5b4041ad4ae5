"""The Jinja environment chat templates are rendered in: the one ``transformers`` builds.

``transformers`` (``utils/chat_template_utils.py``, ``_cached_compile_jinja_template``)
renders a chat template in an ``ImmutableSandboxedEnvironment`` (templates from the Hub are
untrusted code) with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension
(``{% break %}``, ``{% continue %}``) and a ``{% generation %}`` block tag, a ``tojson``
filter that keeps non-ASCII characters and takes ``indent``/``separators``/``sort_keys``,
and the globals ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` (the last
two restricted so a template cannot reach Python internals). This module builds the same
environment with its own code, so rendering needs no ``transformers``.

The ``{% generation %}`` tag renders its body and nothing else: wdstream decides which tokens
carry loss from the template's output itself (:mod:`wdstream.chat.masks`), so a template with
the tags and one without them give the same text and the same masks.

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
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["chat_environment"]


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: its body, inlined.

    ``transformers`` wraps the body in a call block that records where its output starts and
    ends; the output is the body's either way. Inlining it (the parser takes the body's nodes
    in place of the tag) saves a macro call per assistant turn on every render.
    """

    tags = {"generation"}

    def parse(self, parser: Any) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return list(parser.parse_statements(("name:endgeneration",), drop_needle=True))


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


def chat_environment(now: datetime) -> ImmutableSandboxedEnvironment:
    """A new environment as ``transformers`` builds it (module docstring); ``strftime_now``
    formats ``now``."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = now.strftime
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env
