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

Rule 2 (the template rewrites the conversation when later messages follow, e.g. drops an
assistant turn's reasoning once a later user message exists, so T does not start with Q_i):

* the turn's start in T: ``len(P_i)`` when T starts with P_i; otherwise the end of the one
  place in T, after the first character where P_i and T differ, holding the longest tail of
  P_i found there (what follows the last rewritten text: later messages and the header).
  No such tail, or a tail found at two places, and the turn is not located;
* the turn's text in T: from that start, the longest suffix of Q_i's added text (less
  trailing whitespace) that T continues with, used only when it holds the message's whole
  (stripped) string content.

The record gets a ``relocated`` problem naming how much of the turn was found.

Otherwise (Q_i does not start with P_i, or rule 2 finds no start or no text holding the
content) the turn is not supervised and the record gets an ``unlocated`` problem: a turn is
never supervised at a place that was guessed.
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


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (binary search on slices)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _anchor(whole: str, prompt: str) -> int | None:
    """Where the turn after ``prompt`` starts in ``whole`` (module docstring, rule 2)."""
    if whole.startswith(prompt):
        return len(prompt)
    differ = _common_prefix(whole, prompt)
    lo, hi = 0, len(prompt) - differ  # the longest tail of prompt found in whole[differ:]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if whole.find(prompt[-mid:], differ) >= 0:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        return None
    tail = prompt[-lo:]
    at = whole.find(tail, differ)
    return None if whole.find(tail, at + 1) >= 0 else at + lo


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
    if not turn.startswith(prompt):
        return TurnSpan(
            start,
            start,
            UNLOCATED,
            "the turn rendered alone does not start with the generation prompt; turn not "
            "supervised",
        )
    end = _end_before_space(turn, start, len(turn))
    if whole.startswith(turn):
        return TurnSpan(start, end)
    at = _anchor(whole, prompt)
    length = None if at is None else _located(whole, at, turn[start:end], content)
    if at is None or not length:
        why = "no single place for its start" if at is None else "its content is not there"
        return TurnSpan(
            start,
            start,
            UNLOCATED,
            "the template rewrites the conversation when later messages follow and this "
            f"turn was not found ({why}); turn not supervised",
        )
    return TurnSpan(
        at,
        at + length,
        RELOCATED,
        "the template rewrites the conversation when later messages follow; supervised the "
        f"{length} of the turn's {end - start} characters found in the whole conversation",
    )
