"""One JSON record turned into the list of messages a chat template renders.

Three input forms, tried in this order::

    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}
    {"prompt": "Hi", "completion": "Hello"}

* ``messages`` (the key is configurable): roles ``system``, ``user``, ``assistant``, ``tool``;
  ``content`` a string, a list of content parts (objects, for templates that read them), or
  ``null`` on an assistant message that has ``tool_calls``. Every other field of a message
  (``tool_calls``, ``tool_call_id``, ``name``, ``reasoning_content``...) is kept for the
  template.
* ShareGPT ``conversations``: ``from`` is ``human``/``user`` (user), ``gpt``/``assistant``
  (assistant), ``system``, or ``tool``/``function``/``observation`` (tool); ``value`` is the
  content. Other fields are kept.
* ``prompt``/``completion``: each a string (a user message, an assistant message) or a list
  of messages in the ``messages`` form.

A record that is not one of these raises :class:`~wdstream.errors.ConversationError` naming
the key and the message index (``messages[2].role: ...``); the caller adds file and line, and
``--on-error skip`` counts it as a bad record.
"""

from __future__ import annotations

import re
from typing import Any

from wdstream.errors import ConversationError

__all__ = ["ROLES", "SHAREGPT_ROLES", "parse_conversation"]

ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
# A lone surrogate comes from a \uD800-\uDFFF escape in the JSON; no tokenizer can encode it.
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return _JSON_TYPES.get(type(value), "a number")


def _no_surrogates(value: Any, where: str) -> None:
    """Refuse a lone UTF-16 surrogate anywhere in ``value`` (strings, lists, objects)."""
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise ConversationError(f"{where}: holds a lone UTF-16 surrogate (not encodable)")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _no_surrogates(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_surrogates(item, f"{where}.{key}")


def _checked_content(message: dict[str, Any], content: Any, where: str) -> None:
    if isinstance(content, str):
        return
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise ConversationError(
                    f"{where}[{j}]: a content part must be an object, got {_kind(part)}"
                )
        return
    if content is None and message.get("tool_calls"):
        return
    raise ConversationError(
        f"{where}: expected a string or a list of content parts"
        f"{' (or null with tool_calls)' if content is None else ''}, got {_kind(content)}"
    )


def _message(raw: Any, where: str) -> dict[str, Any]:
    """A ``{role, content, ...}`` message, checked; a copy, so the record is left as it was."""
    if not isinstance(raw, dict):
        raise ConversationError(f"{where}: a message must be an object, got {_kind(raw)}")
    if "role" not in raw:
        raise ConversationError(f"{where}: has no 'role' (keys: {', '.join(map(repr, raw))})")
    role = raw["role"]
    if role not in ROLES:
        raise ConversationError(f"{where}.role: expected one of {', '.join(ROLES)}, got {role!r}")
    if "content" not in raw and not raw.get("tool_calls"):
        raise ConversationError(f"{where}: has no 'content'")
    _checked_content(raw, raw.get("content"), f"{where}.content")
    _no_surrogates(raw, where)
    return dict(raw)


def _message_list(raw: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise ConversationError(f"{key}: expected an array of messages, got {_kind(raw)}")
    if not raw:
        raise ConversationError(f"{key}: is an empty array (no messages)")
    return [_message(m, f"{key}[{i}]") for i, m in enumerate(raw)]


def _sharegpt(raw: Any) -> list[dict[str, Any]]:
    key = "conversations"
    if not isinstance(raw, list) or not raw:
        what = "an empty array" if raw == [] else _kind(raw)
        raise ConversationError(f"{key}: expected a non-empty array of turns, got {what}")
    out = []
    for i, turn in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise ConversationError(f"{where}: a turn must be an object, got {_kind(turn)}")
        for field in ("from", "value"):
            if field not in turn:
                raise ConversationError(f"{where}: has no {field!r}")
        role = SHAREGPT_ROLES.get(turn["from"]) if isinstance(turn["from"], str) else None
        if role is None:
            raise ConversationError(
                f"{where}.from: expected one of {', '.join(SHAREGPT_ROLES)}, got {turn['from']!r}"
            )
        if not isinstance(turn["value"], str):
            raise ConversationError(f"{where}.value: expected a string, got {_kind(turn['value'])}")
        extra = {k: v for k, v in turn.items() if k not in ("from", "value")}
        message = {"role": role, "content": turn["value"], **extra}
        _no_surrogates(message, where)
        out.append(message)
    return out


def _side(record: dict[str, Any], key: str, role: str) -> list[dict[str, Any]]:
    """The prompt or the completion: a string (one ``role`` message) or a message list."""
    value = record[key]
    if isinstance(value, str):
        _no_surrogates(value, key)
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return _message_list(value, key)
    raise ConversationError(f"{key}: expected a string or an array of messages, got {_kind(value)}")


def parse_conversation(record: Any, messages_key: str = "messages") -> list[dict[str, Any]]:
    """The messages of one JSON record, in any of the module docstring's forms.

    Args:
        record: the decoded JSON value of one line.
        messages_key: the key of the ``messages`` form.

    Returns:
        New message dicts (``role``, ``content`` and every other field of the input).

    Raises:
        ConversationError: the record is not a well-formed conversation; the message names
            the key and message index at fault.
    """
    if not isinstance(record, dict):
        raise ConversationError(f"the record is {_kind(record)}, not an object")
    if messages_key in record:
        return _message_list(record[messages_key], messages_key)
    if "conversations" in record:
        return _sharegpt(record["conversations"])
    if "prompt" in record or "completion" in record:
        missing = "completion" if "prompt" in record else "prompt"
        if missing not in record:
            raise ConversationError(
                f"has {'prompt' if missing == 'completion' else 'completion'} but no {missing!r}"
            )
        return _side(record, "prompt", "user") + _side(record, "completion", "assistant")
    keys = ", ".join(repr(k) for k in list(record)[:8]) or "none"
    raise ConversationError(
        f"no conversation: expected the key {messages_key!r}, 'conversations', or 'prompt' and "
        f"'completion' (the record's keys: {keys})"
    )
