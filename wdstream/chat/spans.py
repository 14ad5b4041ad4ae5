"""Where one assistant turn's supervised characters lie in the rendered conversation.

Three renders of the template say it (:mod:`wdstream.chat.masks` makes them)::

    whole  = render(messages)                                  the training text T
    prompt = render(messages[:i], add_generation_prompt=True)  P_i: up to the turn's header
    turn   = render(messages[:i + 1])                          Q_i: up to the turn's end

    T = <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello<|im_end|>\\n...
        |---------------------- P_i ----------------------||---- added ----|
        |------------------------------- Q_i -------------------------------|
                                    supervised: "Hello<|im_end|>"  (the "\\n" after it is not)

Rule 1 (the prefix property holds: T starts with Q_i, Q_i starts with P_i): the supervised
characters are ``[len(P_i), len(Q_i))`` less the trailing whitespace, i.e. the turn's content
and its end-of-turn token, nothing of the header or the separator after it.

Rule 2 (the template rewrites the turn in T, e.g. drops its reasoning once a later user
message exists, but T still starts with P_i): the turn's text in T starts at ``len(P_i)``
and is the longest suffix of Q_i's added text (less trailing whitespace) that T continues
with there; it is used only when it holds the message's whole (stripped) string content. The
record gets a ``relocated`` problem.

Otherwise (T does not start with P_i, Q_i does not start with P_i, or rule 2 finds no text
holding the content) the turn is not supervised and the record gets an ``unlocated``
problem: a turn is never supervised at a place that was guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RELOCATED", "UNLOCATED", "TurnSpan", "turn_span"]

RELOCATED = "relocated"
UNLOCATED = "unlocated"


@dataclass(frozen=True)
class TurnSpan:
    """A turn's supervised characters ``[start, end)`` in T (empty when ``problem`` is
    ``unlocated``), and the rule-2 or failure problem kind, None under rule 1."""

    start: int
    end: int
    problem: str | None = None
    detail: str = ""


def _end_before_space(text: str, lo: int, hi: int) -> int:
    """``hi`` moved back over the whitespace that ends ``text[lo:hi]``."""
    while hi > lo and text[hi - 1].isspace():
        hi -= 1
    return hi


def _located(whole: str, at: int, added: str, content: Any) -> int | None:
    """Length of the longest suffix of ``added`` that ``whole`` continues with at ``at``, if
    that suffix holds the content (module docstring, rule 2); else None."""
    for cut in range(len(added)):
        if whole.startswith(added[cut:], at):
            found = added[cut:]
            wanted = content.strip() if isinstance(content, str) else ""
            return len(found) if wanted in found else None
    return None


def turn_span(whole: str, prompt: str, turn: str, content: Any) -> TurnSpan:
    """The supervised characters of one assistant turn in ``whole`` (module docstring).

    Args:
        whole: the rendered conversation T.
        prompt: P_i, the conversation before the turn rendered with the generation prompt.
        turn: Q_i, the conversation through the turn.
        content: the turn's ``content`` (checked to lie in a rule-2 span).
    """
    start = len(prompt)
    if turn.startswith(prompt) and whole.startswith(turn):
        return TurnSpan(start, _end_before_space(turn, start, len(turn)))
    if not whole.startswith(prompt):
        return TurnSpan(
            start,
            start,
            UNLOCATED,
            "the template renders the conversation before this turn "
            "differently when later messages follow; turn not supervised",
        )
    if not turn.startswith(prompt):
        return TurnSpan(
            start,
            start,
            UNLOCATED,
            "the turn rendered alone does not start with the "
            "generation prompt; turn not supervised",
        )
    added = turn[start : _end_before_space(turn, start, len(turn))]
    length = _located(whole, start, added, content)
    if not length:
        return TurnSpan(
            start,
            start,
            UNLOCATED,
            "the template rewrites this turn when later messages "
            "follow and its content was not found; turn not supervised",
        )
    return TurnSpan(
        start,
        start + length,
        RELOCATED,
        f"the template rewrites this turn when later "
        f"messages follow; supervised the {length} of its {len(added)} characters that the "
        "whole conversation holds",
    )
