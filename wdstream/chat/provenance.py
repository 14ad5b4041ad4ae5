"""Where a rendered conversation's text comes from: the messages' own text, or the template's.

Two questions :class:`~wdstream.chat.masks.ChatEncoder` asks of a template's output:

**Is an assistant turn's text its own?** The characters a turn adds after the generation prompt
(``[len(P_i), len(Q_i))``, :mod:`wdstream.chat.spans`) are trained on. A template may write
other messages' text there: a recap of the user's question inside the assistant's turn, the
system prompt as a footer after the last turn, the last user message repeated at the end.
:func:`foreign_text` renders the conversation through the turn again with every *other*
message's strings (and the tools') changed, letter by letter and digit by digit
(:func:`rotated`: ``a`` to ``b``, ``9`` to ``0``, any other non-ASCII character to its printable
neighbour, ``日`` to ``旦``, an emoji to the next; whitespace, ASCII punctuation and ``<tags>``
kept, so a template's tests on the text, such as ``startswith('<tool_response>')``, answer
alike). Text the turn owns, or the template writes of its own, does not change; a turn whose
text changes holds text of another message, and the conversation is refused. Not seen: a copy
of text made only of ASCII punctuation and whitespace (``"?!"``), and values computed from the
text that the change keeps (its length).

**Which special-token text is the template's markup?** Message content may spell out a
special token (``<|endoftext|>`` in a scraped web page). Only the template's own markup may
become a special token (``docs/CHAT.md``): :func:`content_specials` renders the conversation
again with each such spelling in the messages replaced by as many U+E000 characters
(:func:`defused`), and the places where the two texts differ are the content's spellings,
tokenised as text (:meth:`~wdstream.tokenizers.base.Tokenizer.encode_chat`'s ``as_text``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["content_specials", "defused", "foreign_text", "rotated", "special_pattern", "spelled"]

_KEEP_KEYS = frozenset({"role", "type"})  # structure a template branches on, not text
_TAG = re.compile(r"<[^<>\s]{1,64}>")
_ASCII = "abcdefghijklmnopqrstuvwxyz"
_ROTATE = str.maketrans(
    _ASCII + _ASCII.upper() + "0123456789",
    _ASCII[1:] + "a" + _ASCII.upper()[1:] + "A" + "1234567890",
)
PLACEHOLDER = "\ue000"


def _neighbour(c: str) -> str:
    """A non-ASCII character's neighbouring code point, when it is as printable (letters,
    ideographs, emoji); the character itself otherwise."""
    if ord(c) < 128 or c.isspace():
        return c
    other = chr(ord(c) ^ 1)
    return (
        other
        if other.isprintable() and not other.isspace() and c.isalnum() == other.isalnum()
        else c
    )


def _rotate_text(text: str) -> str:
    out = text.translate(_ROTATE)
    return out if out.isascii() else "".join(map(_neighbour, out))


def _rotate_str(text: str) -> str:
    """``text`` with its letters and digits changed outside ``<tags>``."""
    pieces, at = [], 0
    for match in _TAG.finditer(text):
        pieces += [_rotate_text(text[at : match.start()]), match.group()]
        at = match.end()
    pieces.append(_rotate_text(text[at:]))
    return "".join(pieces)


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """``value`` with ``fn`` applied to every string in it (not to keys, nor to the values of
    ``role`` and ``type``)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: v if k in _KEEP_KEYS else _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    return value


def rotated(value: Any) -> Any:
    """A copy of a message (or the tools) whose text differs everywhere a template could
    copy it from (module docstring)."""
    return _map_strings(value, _rotate_str)


def foreign_text(
    render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str],
    prepared: list[dict[str, Any]],
    changed: list[dict[str, Any]],
    k: int,
    added: str,
    changed_tools: list[dict[str, Any]] | None,
) -> bool:
    """Whether assistant turn ``k``'s added text (what ``render(prepared[:k + 1])`` adds after
    the generation prompt) changes when every other message and the tools change (``changed``
    and ``changed_tools``: their :func:`rotated` copies, made once per conversation): then it
    holds their text. ``render(messages, tools)`` renders without a generation prompt."""
    others = [*changed[:k], prepared[k]]
    return not render(others, changed_tools).endswith(added)


def special_pattern(texts: frozenset[str]) -> re.Pattern[str] | None:
    """A regex matching any of ``texts`` (longest first), None when there are none."""
    if not texts:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))


def spelled(
    pattern: re.Pattern[str], prepared: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[int, list[str]]:
    """The first message whose text spells out a special token (-1: none; ``len(prepared)``:
    only the tools do) and the special tokens spelled, in order of first use."""
    found: dict[str, None] = {}
    first = -1

    def note(k: int) -> Callable[[str], str]:
        def look(text: str) -> str:
            nonlocal first
            for match in pattern.finditer(text):
                found.setdefault(match.group())
                first = k if first < 0 else first
            return text

        return look

    for k, message in enumerate(prepared):
        _map_strings(message, note(k))
    _map_strings(tools, note(len(prepared)))
    return first, list(found)


def defused(value: Any, pattern: re.Pattern[str]) -> Any:
    """``value`` with every special-token spelling in its strings replaced by as many
    :data:`PLACEHOLDER` characters."""
    return _map_strings(value, lambda t: pattern.sub(lambda m: PLACEHOLDER * len(m.group()), t))


def content_specials(
    whole: str, plain: str, pattern: re.Pattern[str]
) -> list[tuple[int, int]] | None:
    """The ``[start, end)`` spans of ``whole`` whose special-token text came from the messages,
    given ``plain``, the same conversation rendered with the messages :func:`defused`: the
    spellings ``plain`` holds placeholders at. None when the two renders differ anywhere else
    (the template treats the spelled text differently; its origin cannot be told)."""
    if len(plain) != len(whole):
        return None
    spans, pieces, at = [], [], 0
    for match in pattern.finditer(whole):
        a, b = match.span()
        got = plain[a:b]
        if got == PLACEHOLDER * (b - a):
            spans.append((a, b))
            pieces += [whole[at:a], got]
            at = b
        elif got != match.group():
            return None
    pieces.append(whole[at:])
    return spans if "".join(pieces) == plain else None
