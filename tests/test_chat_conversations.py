"""Conversation records: the three input forms give the same messages, extra fields survive,
and every malformed shape is a ConversationError (an InputError, so ``--on-error skip`` can
count it) naming the key and the message index."""

from __future__ import annotations

from typing import Any

import pytest

from wdstream.chat import parse_conversation
from wdstream.errors import ConversationError, InputError

PAIR = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]


def test_the_three_forms_give_the_same_messages() -> None:
    assert parse_conversation({"messages": PAIR}) == PAIR
    sharegpt = {
        "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]
    }
    assert parse_conversation(sharegpt) == PAIR
    assert parse_conversation({"prompt": "Hi", "completion": "Hello"}) == PAIR
    assert parse_conversation({"prompt": PAIR[:1], "completion": PAIR[1:]}) == PAIR
    assert parse_conversation({"prompt": PAIR[:1], "completion": "Hello"}) == PAIR
    assert parse_conversation({"chat": PAIR}, messages_key="chat") == PAIR


def test_sharegpt_roles_and_extra_fields_are_kept() -> None:
    turns = [
        {"from": "system", "value": "S"},
        {"from": "human", "value": "Q"},
        {"from": "gpt", "value": "A", "weight": 0},
        {"from": "function", "value": "F"},
        {"from": "observation", "value": "O"},
        {"from": "tool", "value": "T"},
    ]
    got = parse_conversation({"conversations": turns})
    assert [m["role"] for m in got] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert got[2] == {"role": "assistant", "content": "A", "weight": 0}


def test_message_fields_for_the_template_survive_and_the_record_is_not_changed() -> None:
    call = [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]
    record = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": None, "tool_calls": call, "reasoning_content": "r"},
            {"role": "tool", "content": "1", "tool_call_id": "c0"},
        ]
    }
    got = parse_conversation(record)
    assert got == record["messages"]
    got[1]["content"] = "changed"
    assert record["messages"][1]["content"] is None


BAD: list[tuple[Any, str]] = [
    ([PAIR], "the record is an array, not an object"),
    ({"text": "x"}, "no conversation: expected the key 'messages', 'conversations', or 'prompt'"),
    ({"messages": {}}, "messages: expected an array of messages, got an object"),
    ({"messages": []}, "messages: is an empty array"),
    ({"messages": [PAIR[0], "hi"]}, "messages[1]: a message must be an object, got a string"),
    ({"messages": [{"content": "x"}]}, "messages[0]: has no 'role'"),
    ({"messages": [PAIR[0], {"role": "bot", "content": "x"}]}, "messages[1].role: expected one of"),
    ({"messages": [{"role": "user"}]}, "messages[0]: has no 'content'"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content: expected a string"),
    ({"messages": [{"role": "assistant", "content": None}]}, "(or null with tool_calls), got null"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]: a content part"),
    ({"messages": [{"role": "user", "content": "a\ud800"}]}, "messages[0].content: holds a lone"),
    ({"conversations": []}, "conversations: expected a non-empty array of turns, got an empty"),
    ({"conversations": [{"from": "human"}]}, "conversations[0]: has no 'value'"),
    ({"conversations": [{"from": "bot", "value": "x"}]}, "conversations[0].from: expected one of"),
    ({"conversations": [{"from": "gpt", "value": None}]}, "conversations[0].value: expected a str"),
    ({"prompt": "x"}, "has prompt but no 'completion'"),
    ({"completion": "x"}, "has completion but no 'prompt'"),
    ({"prompt": 1, "completion": "x"}, "prompt: expected a string or an array of messages"),
    ({"prompt": "x", "completion": [{"role": "tool"}]}, "completion[0]: has no 'content'"),
]


@pytest.mark.parametrize(("record", "message"), BAD)
def test_a_malformed_record_names_what_is_wrong(record: Any, message: str) -> None:
    with pytest.raises(ConversationError) as info:
        parse_conversation(record)
    assert message in str(info.value)
    assert isinstance(info.value, InputError)  # a bad record, counted by --on-error skip
