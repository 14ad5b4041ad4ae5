"""How a chat dataset's conversations became tokens, as ``index.json`` records it.

``pack --chat`` writes :meth:`ChatSettings.record` under ``stats.chat``: the template's text
and sha256, where it came from, the special-token strings it was rendered with, the time
``strftime_now`` formats, ``train_on``, the messages key and the template variables
(``template_kwargs``, recorded only when a pack has some). The same record rebuilds the
same :class:`~wdstream.chat.masks.ChatEncoder` later (``explain`` re-encodes a conversation
to find the turns a row piece covers; a resumed pack renders exactly as the interrupted one)::

    settings = ChatSettings.load(tok, "chat.jinja", "assistant", "messages",
                                 template_kwargs={"enable_thinking": False})
    index_stats["chat"] = settings.record()
    ChatSettings.from_record(index_stats["chat"]).encoder(tok).encode(messages)

The time: ``transformers`` formats the clock on every render; wdstream pins one time per pack
(:class:`~wdstream.chat.template.ChatTemplate`'s ``now``). Only a template that calls
``strftime_now`` depends on it, so only such a template's record holds one (ISO 8601, to the
second), and the pack's resume fingerprint with it; others record ``null`` and every pack of
them is identical whenever it runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2.nodes

from wdstream.chat.jinja import chat_environment
from wdstream.chat.masks import SPECIAL_IN_CONTENT, TRAIN_ON, ChatEncoder
from wdstream.chat.template import ChatTemplate, load_chat_template, template_variables
from wdstream.tokenizers.base import Tokenizer

__all__ = ["ChatSettings", "reads_clock"]

_NO_CLOCK = datetime(1970, 1, 1)  # what a template that never calls strftime_now is given


def reads_clock(source: str) -> bool:
    """Whether the template text calls ``strftime_now`` (its output then depends on the time)."""
    tree = chat_environment(_NO_CLOCK).parse(source)
    return any(n.name == "strftime_now" for n in tree.find_all(jinja2.nodes.Name))


def _pinned(now: datetime | str | None) -> str:
    """``now`` (default: the clock) as ISO 8601 to the second."""
    if isinstance(now, str):
        try:
            now = datetime.fromisoformat(now)
        except ValueError as exc:
            raise ValueError(f"chat_now: expected an ISO 8601 time, got {now!r}") from exc
    return (now or datetime.now()).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class ChatSettings:
    """What decides a conversation's tokens and mask (see the module docstring).

    Attributes:
        source: the template's Jinja text.
        special_tokens: ``(name, text)`` of ``bos_token``, ``eos_token``... it is rendered with.
        origin: where the template came from (a path, for people).
        now: the time ``strftime_now`` formats (ISO 8601), None if the template never calls it.
        train_on: ``assistant``, ``last`` or ``all``.
        messages_key: the key of the messages form of a record.
        special_in_content: ``text`` or ``parse``: how special-token text a message spells
            out is tokenised (:class:`~wdstream.chat.masks.ChatEncoder`). A record written
            before the option existed has none and was packed as ``parse``.
        template_kwargs: the template variables every render gets, as ``transformers``'
            ``apply_chat_template(**kwargs)`` (:func:`~wdstream.chat.template.template_variables`);
            a record without them had none.
    """

    source: str
    special_tokens: tuple[tuple[str, str], ...]
    origin: str
    now: str | None
    train_on: str = "assistant"
    messages_key: str = "messages"
    special_in_content: str = "text"
    template_kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)  # not hashed

    @classmethod
    def load(
        cls,
        tok: Tokenizer,
        template_file: str | None,
        train_on: str = "assistant",
        messages_key: str = "messages",
        now: datetime | str | None = None,
        special_in_content: str = "text",
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> ChatSettings:
        """The settings of a pack: the template of ``template_file``, else of the tokenizer's
        folder (:func:`~wdstream.chat.template.load_chat_template`); ``now`` (default: the
        clock) is kept only if the template reads it.

        Raises:
            ChatTemplateError: no template, or one that cannot be read or compiled.
            ValueError: an unknown ``train_on``, an empty ``messages_key``, a ``now`` that
                is not ISO 8601 or ``template_kwargs`` that are not template variables.
        """
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on must be one of {', '.join(TRAIN_ON)}, got {train_on!r}")
        if special_in_content not in SPECIAL_IN_CONTENT:
            raise ValueError(
                "special_tokens_in_content must be one of "
                f"{', '.join(SPECIAL_IN_CONTENT)}, got {special_in_content!r}"
            )
        if not messages_key:
            raise ValueError("messages_key must not be empty")
        template = load_chat_template(tok, template_file, variables=template_kwargs)
        pinned = _pinned(now) if reads_clock(template.source) else None
        tokens = tuple(sorted(template.special_tokens.items()))
        return cls(template.source, tokens, template.origin, pinned, train_on, messages_key,
                   special_in_content, template.variables)  # fmt: skip

    @property
    def sha256(self) -> str:
        """sha256 of the template's text (UTF-8)."""
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def template(self) -> ChatTemplate:
        """The compiled template, rendering as the pack did."""
        now = _NO_CLOCK if self.now is None else datetime.fromisoformat(self.now)
        return ChatTemplate(
            self.source, dict(self.special_tokens), self.origin, now, self.template_kwargs
        )

    def encoder(self, tok: Tokenizer) -> ChatEncoder:
        """A :class:`ChatEncoder` of these settings over ``tok`` (a full tokenizer: it needs
        :meth:`~wdstream.tokenizers.base.Tokenizer.encode_chat`)."""
        return ChatEncoder(self.template(), tok, self.train_on, self.special_in_content)

    def fingerprint(self) -> dict[str, Any]:
        """What of these settings decides a pack's output (its resume fingerprint); the
        template variables only when there are some, so a pack without them keeps the
        fingerprint and record it had before they existed. They are compared as JSON text,
        names sorted: a template renders ``false`` and ``0``, or ``{"a": 1, "b": 2}`` and
        ``{"b": 2, "a": 1}`` differently, which Python's ``==`` would take for the same
        (a resume mixing two renders); the order of the names themselves it cannot see."""
        variables: dict[str, str] = {}
        if self.template_kwargs:
            top = dict(sorted(self.template_kwargs.items()))
            variables["template_kwargs"] = json.dumps(top, ensure_ascii=False, allow_nan=False)
        return {
            "template_sha256": self.sha256,
            "special_tokens": dict(self.special_tokens),
            "now": self.now,
            "train_on": self.train_on,
            "messages_key": self.messages_key,
            "special_tokens_in_content": self.special_in_content,
            **variables,
        }

    def record(self) -> dict[str, Any]:
        """``index.json``'s ``stats.chat`` settings: the fingerprint, the template's text and
        its origin."""
        variables = {"template_kwargs": dict(self.template_kwargs)} if self.template_kwargs else {}
        return {**self.fingerprint(), **variables, "template": self.source,
                "template_origin": self.origin}  # fmt: skip

    @classmethod
    def from_record(cls, obj: Any) -> ChatSettings:
        """The settings an ``index.json`` records (:meth:`record`).

        Raises:
            ValueError: naming the field that is missing or of the wrong type, or a template
                whose text does not match its recorded sha256.
        """
        if not isinstance(obj, dict):
            raise ValueError(f"stats.chat: expected an object, got {type(obj).__name__}")
        kinds = {"template": str, "template_origin": str, "train_on": str, "messages_key": str,
                 "special_tokens": dict, "template_sha256": str}  # fmt: skip
        for key, kind in kinds.items():
            if not isinstance(obj.get(key), kind):
                raise ValueError(
                    f"stats.chat.{key}: expected a {kind.__name__}, got {obj.get(key)!r}"
                )
        now = obj.get("now")
        if now is not None and not isinstance(now, str):
            raise ValueError(f"stats.chat.now: expected an ISO 8601 time or null, got {now!r}")
        tokens = tuple(sorted((str(k), str(v)) for k, v in obj["special_tokens"].items()))
        special = obj.get("special_tokens_in_content", "parse")  # older packs parsed them
        if special not in SPECIAL_IN_CONTENT:
            raise ValueError(
                "stats.chat.special_tokens_in_content: expected one of "
                f"{', '.join(SPECIAL_IN_CONTENT)}, got {special!r}"
            )
        variables = template_variables(obj.get("template_kwargs", {}), "stats.chat.template_kwargs")
        settings = cls(obj["template"], tokens, obj["template_origin"], now, obj["train_on"],
                       obj["messages_key"], special, variables)  # fmt: skip
        if settings.sha256 != obj["template_sha256"]:
            raise ValueError("stats.chat.template: its sha256 differs from template_sha256")
        return settings
