"""A chat template: where it comes from, and rendering messages with it as ``transformers`` does.

Sources (:func:`load_chat_template`)::

    --chat-template chat.jinja              a raw Jinja template
    --chat-template tokenizer_config.json   any JSON object with "chat_template"
    (no flag)                               the tokenizer's folder: chat_template.jinja, else
                                            tokenizer_config.json's "chat_template"

``chat_template`` is a string, or a list of ``{"name", "template"}`` from which the one named
``default`` is used. The special-token strings a template reads (``bos_token``,
``eos_token``, ``pad_token``...) come from the same JSON object or the folder's
``tokenizer_config.json`` (strings, or ``AddedToken`` objects with a ``content``); a
``bos_token``/``eos_token`` still missing is the loaded tokenizer's own BOS/EOS.

Rendering (:meth:`ChatTemplate.render`) follows ``transformers``' ``render_jinja_template``:
keys whose value is ``null`` are dropped from every message, a message's reasoning given as
``reasoning_content``, ``thinking`` or ``reasoning`` is offered under ``reasoning_content``
and ``thinking`` both, and the template sees ``messages``, ``tools``, ``documents``,
``add_generation_prompt``, the special-token strings and the template variables (below), in
the environment of :mod:`wdstream.chat.jinja`. The template is compiled once per
:class:`ChatTemplate`.

Template variables (``pack --chat-template-kwargs '{"enable_thinking": false}'``) are what
``transformers``' ``apply_chat_template(messages, **kwargs)`` hands the template: extra names
it reads (Qwen3's ``enable_thinking``, Llama 3.1's ``date_string`` and ``custom_tools``),
over the special-token strings when a name is both (``{**special_tokens_map, **kwargs}``).
They are one JSON object per pack, chosen by whoever packs, so their text is the template's
own (markup, never a message's). A name ``apply_chat_template`` or the render binds to its own
argument (``messages``, ``tools``, ``add_generation_prompt``...) never reaches the template
there, so :func:`template_variables` refuses it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import jinja2

from wdstream.chat.budget import MAX_RENDER_CHARS, Budget
from wdstream.chat.jinja import chat_environment, has_generation
from wdstream.errors import ChatTemplateError, ConversationError
from wdstream.tokenizers.base import Tokenizer

__all__ = [
    "MAX_RENDER_CHARS",
    "SPECIAL_TOKEN_KEYS",
    "ChatTemplate",
    "RENDER_ARGUMENTS",
    "load_chat_template",
    "template_variables",
    "tokenizer_folder",
]

SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Names transformers binds to apply_chat_template's or the render's own parameters (or that
# collide with them, a TypeError): given as keyword arguments, they are never template variables.
RENDER_ARGUMENTS = frozenset({
    "conversation", "conversations", "messages", "tools", "documents", "chat_template",
    "add_generation_prompt", "continue_final_message", "tokenize", "sanitize_control_tokens",
    "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})  # fmt: skip
CONFIG_NAME = "tokenizer_config.json"
JINJA_NAME = "chat_template.jinja"


def _special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """The special-token strings of a tokenizer config (``AddedToken`` objects unwrapped)."""
    out = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _pick_template(value: Any, where: str, name: str) -> str:
    """The template text of a ``chat_template`` value: a string, or the named entry of a
    list of ``{"name", "template"}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {
            t.get("name"): t.get("template")
            for t in value
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
        if name in named:
            return str(named[name])
        raise ChatTemplateError(
            f"{where}: chat_template: no template named {name!r} (it has "
            f"{', '.join(map(repr, named)) or 'no named templates'})"
        )
    raise ChatTemplateError(
        f"{where}: chat_template: expected a string or a list of {{name, template}}, "
        f"got {type(value).__name__}"
    )


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"{path}: cannot read the chat template ({exc})") from exc


def _read_config(path: str) -> dict[str, Any]:
    try:
        config = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ChatTemplateError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ChatTemplateError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def _prepared(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as ``transformers`` hands them to the template (module docstring)."""
    out = []
    for message in messages:
        m = {k: v for k, v in message.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING_FIELDS if k in m), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def template_variables(value: Any, option: str = "chat_template_kwargs") -> dict[str, Any]:
    """``value`` checked as a pack's template variables (module docstring): a JSON object
    whose names are not :data:`RENDER_ARGUMENTS`, returned as JSON gives it back (tuples as
    lists), so the pack, its record and every later render see the same values.

    Raises:
        ValueError: naming ``option``: not an object, a name the render keeps for itself, or
            a value JSON cannot hold (a set, a NaN...).
    """
    if not isinstance(value, dict):
        raise ValueError(f"{option}: expected a JSON object of template variables, got "
                         f"{type(value).__name__} {value!r:.80}")  # fmt: skip
    for name in value:
        if not isinstance(name, str):
            raise ValueError(f"{option}: names must be strings, got {name!r:.80}")
        if name in RENDER_ARGUMENTS:
            raise ValueError(
                f"{option}: {name!r} is an argument of the render, not a template variable "
                "(transformers' apply_chat_template binds it to its own parameter; a pack "
                "renders each record's messages and tools itself)"
            )
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # a lone surrogate: no tokenizer takes the text it renders into
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ValueError(f"{option}: not JSON-representable ({exc})") from exc
    out: dict[str, Any] = json.loads(text)
    return out


# (template source, special-token strings, origin for messages)
_Found = tuple[str, dict[str, str], str]


def _from_file(path: str, name: str) -> _Found:
    text = _read_text(path)
    if not (path.endswith(".json") or text.lstrip().startswith('{"')):
        return text, {}, path
    config = _read_config(path)
    if "chat_template" not in config:
        raise ChatTemplateError(f"{path}: has no 'chat_template' key")
    source = _pick_template(config["chat_template"], path, name)
    return source, _special_tokens(config), f"{path}: chat_template"


def _from_folder(folder: str, name: str) -> _Found:
    config_path = os.path.join(folder, CONFIG_NAME)
    config = _read_config(config_path) if os.path.isfile(config_path) else {}
    jinja_path = os.path.join(folder, JINJA_NAME)
    if os.path.isfile(jinja_path):
        return _read_text(jinja_path), _special_tokens(config), jinja_path
    if "chat_template" not in config:
        raise ChatTemplateError(
            f"{folder}: no chat template (neither {JINJA_NAME} nor a 'chat_template' in "
            f"{CONFIG_NAME}); give one with --chat-template FILE"
        )
    source = _pick_template(config["chat_template"], config_path, name)
    return source, _special_tokens(config), f"{config_path}: chat_template"


class ChatTemplate:
    """A compiled chat template and the special-token strings it is rendered with.

    Args:
        source: the Jinja text.
        special_tokens: ``bos_token``, ``eos_token``... as strings.
        origin: where the template came from, for messages.
        now: the time ``strftime_now`` formats (default: when this object is made); pin it
            so that every render of a pack (and of its resume) writes the same date.
        variables: the template variables (:func:`template_variables`, module docstring).

    Raises:
        ChatTemplateError: the template does not compile (names ``origin`` and the line).
    """

    def __init__(
        self,
        source: str,
        special_tokens: Mapping[str, str] | None = None,
        origin: str = "<string>",
        now: datetime | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> None:
        self.source = source
        self.origin = origin
        self.special_tokens = dict(special_tokens or {})
        self.variables = template_variables(dict(variables or {}))
        self.now = now if now is not None else datetime.now()
        self._env = chat_environment(self.now)
        try:
            self._template = self._env.from_string(source)
            self.has_generation = has_generation(self._env, source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"{origin}: line {exc.lineno}: the chat template does not compile: {exc.message}"
            ) from exc
        # Every render's variables start from the globals and special tokens, merged once:
        # Jinja would otherwise copy its chained globals into a new dict on every render
        # (a third of a short render's time). Same precedence: variables over globals, and
        # the template variables over the special tokens, as transformers merges them.
        self._template.globals = dict(self._template.globals)
        self._base_vars = {**self._template.globals, **self.special_tokens, **self.variables}

    @classmethod
    def from_file(cls, path: str, name: str = "default") -> ChatTemplate:
        """A raw Jinja file, or a JSON object holding ``chat_template`` (and maybe the
        special-token strings), e.g. a ``tokenizer_config.json``."""
        return cls(*_from_file(path, name))

    @classmethod
    def from_folder(cls, folder: str, name: str = "default") -> ChatTemplate:
        """A tokenizer folder's template: ``chat_template.jinja``, else the ``chat_template``
        of ``tokenizer_config.json``; special tokens from ``tokenizer_config.json``."""
        return cls(*_from_folder(folder, name))

    def prepare(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The messages as the template sees them (``null`` keys dropped, reasoning aliased);
        :meth:`render_prepared` renders any prefix of the result without preparing again."""
        return _prepared(messages)

    @contextmanager
    def budget(self) -> Iterator[Budget]:
        """One budget (:mod:`wdstream.chat.budget`) for every render inside the block: a
        conversation's renders share their steps and seconds. Outside such a block each render
        has its own."""
        budget = Budget()
        self._env.using(budget)
        try:
            yield budget
        finally:
            self._env.using(None)

    def render_prepared(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The template's text for messages already :meth:`prepare`-d.

        Raises:
            ConversationError: the template refuses the conversation (its
                ``raise_exception``, a failure on these messages' values, or a bound of
                :mod:`wdstream.chat.budget` passed).
        """
        return self.render_blocks(messages, add_generation_prompt, tools)[0]

    def render_blocks(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> tuple[str, list[tuple[int, int]]]:
        """:meth:`render_prepared`'s text and its ``{% generation %}`` blocks, ``[start, end)``
        character spans of the text (as ``transformers`` records them)."""
        variables = {
            **self._base_vars,
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        own = self._env.current() is None
        try:
            if own:
                self._env.using(Budget())
            context = self._template.new_context(variables, shared=True)
            text = self._env.render_chunks(self._template.root_render_func(context))
            return text, list(self._env.budget.blocks)
        except Exception as exc:  # noqa: BLE001 - the template is code: whatever it raises
            # (a TemplateError, a RecursionError of a macro calling itself, the sandbox's
            # OverflowError for a range past 100,000, a bound of the budget, a
            # ZeroDivisionError...) is its refusal of these messages, never a crash of the pack.
            raise ConversationError(
                f"the chat template ({self.origin}) refuses the conversation: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if own:
                self._env.using(None)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The template's text for ``messages`` (see the module docstring)."""
        return self.render_prepared(self.prepare(messages), add_generation_prompt, tools)


def tokenizer_folder(spec: str) -> str | None:
    """The folder of a tokenizer file or folder (``tokenizer.json``, ``.model``, a folder);
    None for a tokenizer named without a path (a tiktoken encoding)."""
    if os.path.isdir(spec):
        return spec
    if spec.endswith((".json", ".model")):
        return os.path.dirname(spec) or "."
    return None


def load_chat_template(
    tokenizer: Tokenizer,
    template_file: str | None = None,
    now: datetime | None = None,
    variables: Mapping[str, Any] | None = None,
) -> ChatTemplate:
    """The chat template of a pack: ``template_file`` if given, else the tokenizer folder's,
    rendered with the template ``variables``.

    Special-token strings come from the template's JSON file, else from the tokenizer
    folder's ``tokenizer_config.json``; a ``bos_token``/``eos_token`` still missing is the
    text of the tokenizer's own BOS/EOS id.

    Raises:
        ChatTemplateError: no template is found, or it cannot be read or compiled.
        ValueError: ``variables`` are not template variables (:func:`template_variables`).
    """
    folder = tokenizer_folder(tokenizer.spec)
    if template_file is not None:
        source, tokens, origin = _from_file(template_file, "default")
    elif folder is not None:
        source, tokens, origin = _from_folder(folder, "default")
    else:
        raise ChatTemplateError(
            f"tokenizer {tokenizer.spec!r} has no folder with a chat template; give one with "
            "--chat-template FILE"
        )
    config_path = os.path.join(folder, CONFIG_NAME) if folder is not None else None
    if not tokens and config_path is not None and os.path.isfile(config_path):
        tokens = _special_tokens(_read_config(config_path))
    for key, token_id in (("bos_token", tokenizer.bos_id), ("eos_token", tokenizer.eos_id)):
        if key not in tokens and token_id is not None:
            tokens[key] = tokenizer.id_to_text(token_id)
    return ChatTemplate(source, tokens, origin, now, variables)
