"""A JSON record read as a conversation to pack: its messages and the tool schemas it offers.

The record parser of ``pack --chat`` (a :class:`~wdstream.inputs.records.RecordDocument`): it
runs in the packing thread for every record, and ``explain`` runs it again on the record at
a piece's ``file:line`` to find the turns the piece covers::

    {"messages": [...], "tools": [{"type": "function", ...}]}
        -> ChatRecord(messages=[{"role": "user", ...}, ...], tools=[{...}])

The messages come from :func:`~wdstream.chat.conversations.parse_conversation` (the
messages, ShareGPT and prompt/completion forms); ``tools``, when the record has it, is handed
to the template as ``apply_chat_template(tools=...)`` would. A record that is neither raises
:class:`~wdstream.errors.ConversationError` (a ``ValueError``: the reader adds file and line
and applies ``--on-error``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wdstream.chat.conversations import parse_conversation
from wdstream.errors import ConversationError

__all__ = ["ChatRecord", "ConversationFields"]


def _chars(value: Any) -> int:
    """Characters of the text in a message's content (a string or content parts)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(part.get("text")) for part in value if isinstance(part, dict))
    return 0


@dataclass(frozen=True)
class ChatRecord:
    """One conversation: its messages (at least one) and the tool schemas, or None."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        """The conversation's size: characters of its messages' text, plus one per message.

        Never 0 (a conversation of empty messages still renders its markup, and a record
        without a message is refused); the pack batches documents by this size, so a batch
        of conversations holds about as much text as a batch of documents."""
        return sum(_chars(m.get("content")) + 1 for m in self.messages)


@dataclass(frozen=True)
class ConversationFields:
    """How to read a conversation record (a picklable callable: record -> :class:`ChatRecord`).

    Args:
        messages_key: the key of the messages form (``--messages-key``).
    """

    messages_key: str = "messages"

    def __call__(self, record: Any) -> ChatRecord:
        """The record's conversation.

        Raises:
            ConversationError: not a conversation, or ``tools`` that is not a list of objects.
        """
        messages = parse_conversation(record, self.messages_key)
        tools = record.get("tools")
        if tools is not None and not (
            isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
        ):
            raise ConversationError(
                f"tools: expected an array of tool schemas (objects), got {type(tools).__name__}"
            )
        return ChatRecord(messages, tools)
