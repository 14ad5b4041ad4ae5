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


@dataclass(frozen=True)
class ChatRecord:
    """One conversation: its messages (at least one) and the tool schemas, or None."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        """Messages (never 0: a record without one is refused)."""
        return len(self.messages)


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
