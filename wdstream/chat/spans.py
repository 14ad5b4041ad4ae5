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

The turn's start when Q_i does not start with P_i (a generation prompt that opens what the
rendered turn leaves out: DeepSeek-R1's ``<｜Assistant｜><think>\\n`` before an answer
rendered without its reasoning): with B_i = ``render(messages[:i])``, when P_i and Q_i both
start with B_i and part after it, the turn starts where they part (after ``<｜Assistant｜>``);
when they part no later than B_i's end (the message before the turn renders a separator only
when it is not the last), after the one place in Q_i holding the whole generation prompt;
the characters Q_i adds from there are the turn, and rule 1 or 2 goes on with them.

Rule 2 (the template rewrites the turn when later messages follow, e.g. drops an assistant
turn's reasoning once a later user message exists, so T does not start with Q_i):

* the turn's start in T: its start in Q_i when T starts with Q_i up to there; otherwise the
  end of the one place in T, ending past the first character where that prefix and T
  differ, holding the longest tail of it found there (what follows the last rewritten text: later
  messages and the header). No such tail, or a tail found at two places, and the turn is
  not located;
* the turn's text in T: from that start, the longest suffix of Q_i's added text (less
  trailing whitespace) that T continues with: what the template renders for the turn in T
  (its answer and end-of-turn token without the dropped reasoning);
* checked to hold the turn's own text as T renders it: T is rendered once more with the
  turn's strings (content, reasoning, tool calls) changed letter by letter
  (:func:`~wdstream.chat.provenance.rotated`), and every character that changes must lie in
  that text. Reasoning inline in ``content`` (``<think>...</think>answer``) is located like
  reasoning given apart.

The record gets a ``relocated`` problem naming how much of the turn was found.

A turn with an answer (text past its reasoning, or tool calls) of which T shows none of its
strings (the template drops the answer, not only the reasoning) is not located either: the
text found would be the template's markup alone.

Otherwise (no start, no text, or some of the turn's own text outside it) the turn is not
supervised and the record gets an ``unlocated`` problem: a turn is never supervised at a
place that was guessed. Its own characters in T, where they are known, still count as the
turn's (:attr:`TurnSpan.owned`), so its tokens are counted under its role.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RELOCATED", "UNLOCATED", "TurnSpan", "turn_span"]

RELOCATED = "relocated"
UNLOCATED = "unlocated"
Render = Callable[[], "str | None"]  # a render made only when a rule needs it (None: refused)


@dataclass(frozen=True)
class TurnSpan:
    """A turn's supervised characters ``[start, end)`` in T (empty when ``problem`` is
    ``unlocated``), and the rule-2 or failure problem kind, None under rule 1.

    ``added`` is the text Q_i adds for the turn (from its start in Q_i: what is checked to
    be the turn's own, :func:`~wdstream.chat.provenance.foreign_text`); ``owned``, for a turn
    not located, the characters ``[start, end)`` of T that are its own where they are known
    (its tokens count under its role), else None."""

    start: int
    end: int
    problem: str | None = None
    detail: str = ""
    added: str = ""
    owned: tuple[int, int] | None = None


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


def _turn_start(
    prompt: str, turn: str, before: Render, markup: re.Pattern[str] | None
) -> int | None:
    """Where the turn starts in Q_i: after P_i when Q_i starts with it; else, with B_i a
    prefix of both, where P_i and Q_i part after B_i, or (a turn that rewrites the message
    before it, or they part no later than B_i's end) after the one place in Q_i holding P_i's
    longest tail past the first difference, the whole generation prompt included (module
    docstring); None otherwise.
    A part point inside a special token of ``markup`` moves to its start (``<think>`` and
    ``</s>`` share their ``<``)."""
    if turn.startswith(prompt):
        return len(prompt)
    head = before()
    if head is None or not prompt.startswith(head):
        return None
    part = _common_prefix(prompt, turn)
    if turn.startswith(head) and part > len(head):  # they part inside the generation prompt
        for token in markup.finditer(turn, max(0, part - 256), part + 256) if markup else ():
            if token.start() < part < token.end():  # never inside a special token
                return token.start()
        return part
    # They part where B_i ends (the message before the turn rendered otherwise once it is not
    # the last: a separator only between messages) or before: the turn follows the whole
    # generation prompt, never its header (which is the prompt's, not the turn's).
    at = _anchor(turn, prompt)
    return at if at is not None and _matched(turn, prompt, at) >= len(prompt) - len(head) else None


def _anchor(whole: str, prompt: str) -> int | None:
    """Where the turn after ``prompt`` starts in ``whole`` (module docstring, rule 2): after
    the one place holding the longest tail of ``prompt`` that ends past the first character
    where the two differ (the tail may begin inside the common prefix: the rewritten text
    can share its first characters with what it replaces)."""
    if whole.startswith(prompt):
        return len(prompt)
    differ = _common_prefix(whole, prompt)

    def find(tail: str, start: int = 0) -> int:
        return whole.find(tail, max(start, differ + 1 - len(tail)))

    lo, hi = 0, len(prompt) - 1  # the longest tail of prompt found ending past differ
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if find(prompt[-mid:]) >= 0:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        return None
    tail = prompt[-lo:]
    at = find(tail)
    return None if find(tail, at + 1) >= 0 else at + lo


def _matched(text: str, prompt: str, at: int) -> int:
    """How many of ``prompt``'s last characters ``text`` holds just before ``at``."""
    return _common_prefix(text[:at][::-1], prompt[::-1])


def _located(whole: str, at: int, added: str) -> int:
    """Length of the longest suffix of ``added`` that ``whole`` continues with at ``at``
    (module docstring, rule 2); 0 when none."""
    for cut in range(len(added)):
        if whole.startswith(added[cut:], at):
            return len(added) - cut
    return 0


def _own_text(whole: str, changed: str | None) -> tuple[int, int] | None:
    """``[first, last)``: where ``whole`` and ``changed`` (the same render, the turn's
    strings changed) differ; ``(0, 0)`` when they do not; None when they cannot be compared
    (the template refused the change or it moved the text)."""
    if changed is None or len(changed) != len(whole):
        return None
    if changed == whole:
        return 0, 0
    first = _common_prefix(whole, changed)
    last = len(whole) - _common_prefix(whole[::-1], changed[::-1])
    return first, last


def _unlocated(start: int, why: str, added: str, owned: tuple[int, int] | None) -> TurnSpan:
    return TurnSpan(start, start, UNLOCATED, f"{why}; turn not supervised", added, owned)


def turn_span(
    whole: str,
    prompt: str,
    turn: str,
    before: Render,
    changed: Render,
    markup: re.Pattern[str] | None = None,
    answered: bool = False,
) -> TurnSpan:
    """The supervised characters of one assistant turn in ``whole`` (module docstring).

    Args:
        whole: the rendered conversation T.
        prompt: P_i, the conversation before the turn rendered with the generation prompt.
        turn: Q_i, the conversation through the turn.
        before: renders B_i, the conversation before the turn without the generation
            prompt (called only when Q_i does not start with P_i).
        changed: renders T with the turn's strings changed (called only under rule 2).
        markup: the tokenizer's special tokens (a turn never starts inside one), or None.
        answered: the turn has an answer (text past its reasoning, or tool calls): under
            rule 2, T must show some of the turn's own text, else the template dropped the
            answer and what is found is only its markup (an end-of-turn token alone would
            teach the model to answer nothing), so the turn is not located.
    """
    start = _turn_start(prompt, turn, before, markup)
    if start is None:
        why = "the turn rendered alone does not start with the generation prompt"
        return _unlocated(len(prompt), why, "", None)
    end = _end_before_space(turn, start, len(turn))
    added = turn[start:]
    if whole.startswith(turn):
        return TurnSpan(start, end, added=added)
    rewrites = "the template rewrites the conversation when later messages follow and this turn"
    at = _anchor(whole, turn[:start])
    if at is None:
        return _unlocated(start, f"{rewrites} has no single place for its start", added, None)
    length = _located(whole, at, turn[start:end])
    own = _own_text(whole, changed())
    if own is None:
        return _unlocated(at, f"{rewrites}'s own text cannot be told apart", added, None)
    shown = own != (0, 0)  # T renders some of the turn's own strings
    owned = (at, own[1]) if shown and own[0] >= at else (at, at) if not shown else None
    if answered and not shown:
        why = " renders none of its answer there"
        return _unlocated(at, f"{rewrites}{why}", added, owned)
    if not length or (shown and not at <= own[0] <= own[1] <= at + length):
        why = " was not found" if not length else "'s own text lies outside the text found"
        return _unlocated(at, f"{rewrites}{why}", added, owned)
    return TurnSpan(
        at,
        at + length,
        RELOCATED,
        "the template rewrites the conversation when later messages follow; supervised the "
        f"{length} of the turn's {end - start} characters found in the whole conversation",
        added,
    )
