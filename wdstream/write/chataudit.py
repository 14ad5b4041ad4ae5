"""The audit of a chat pack: tokens and supervised tokens per role, template problems by kind
with a few example locations, and conversations the template refused.

The chat encoder (:mod:`wdstream.write.chatdocs`) tags every stored token with its role and
notes each conversation's problems; the document rules (:mod:`wdstream.write.docrules`) hand
this audit every conversation that is packed, as packed (a truncated one counts only the
tokens it keeps), in input order. Its counters travel in the input positions like the
rules' own (:attr:`~wdstream.inputs.InputPosition.audit`, the counts *before* a document), so
a resumed pack reports what an uninterrupted one does. ``index.json`` gets :meth:`stats`
under ``stats.chat``::

    "roles": {"assistant": {"tokens": 5120, "supervised": 4980}, "user": {...}, ...},
    "added_tokens": 40,                       the pack's BOS/EOS (never supervised)
    "problems": {"relocated": {"count": 3, "examples": ["in.jsonl:17: message 4: ..."]}, ...},
                                              (special_text: conversations whose messages spell
                                              out a special token, docs/CHAT.md)
    "template_refused": {"count": 0, "examples": []},
    "assistant_turns": {"count": 812, "unsupervised": 0, "examples": []}
                                              assistant turns train_on trains, and those of
                                              them no token of which carries loss (lost
                                              turns: "in.jsonl:9: message 4")

A pack with a lost turn fails unless it allows them (``--allow-unlocated``,
:func:`~wdstream.write.pack.pack`); the count and the first locations say where. Every supervised token is some role's, so the roles' ``supervised`` add up to
``stats.supervised_tokens``; roles and ``added_tokens`` add up to the dataset's tokens less
best-fit padding (``wdstream stats`` checks both against the shards).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wdstream.chat.conversations import ROLES
from wdstream.format.loss import carries_loss

__all__ = ["ADDED_TAG", "PROBLEM_KINDS", "ChatAudit"]

ADDED_TAG = len(ROLES)  # the tag of a token the pack adds (BOS, EOS); role k's tag is k
PROBLEM_KINDS = ("straddle", "relocated", "unlocated", "special_text")
EXAMPLES = 3  # example locations kept per problem kind
_TAGS = ADDED_TAG + 1
_DETAIL_CHARS = 160
_REFUSAL_CHARS = 480


def _clip(text: str, limit: int = _DETAIL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ChatAudit:
    """Counts over the conversations packed so far (see the module docstring).

    Args:
        start: a snapshot (:meth:`snapshot`) to continue from, or None.
    """

    def __init__(self, start: dict[str, Any] | None = None) -> None:
        start = start or {}
        self._counts = np.array(start.get("roles", [[0, 0]] * _TAGS), dtype=np.int64)
        self._problems = list(start.get("problems", [0] * len(PROBLEM_KINDS)))
        self._examples = [tuple(e) for e in start.get("examples", [[]] * len(PROBLEM_KINDS))]
        self._refused = int(start.get("refused", 0))
        self._refused_at = tuple(start.get("refused_at", []))
        self._turns = list(start.get("turns", [0, 0]))  # [trained, lost]
        self._lost_at = tuple(start.get("lost_at", []))

    def snapshot(self) -> dict[str, Any]:
        """The counts, JSON-able (what a journal records in an input position)."""
        return {
            "roles": self._counts.tolist(),
            "problems": list(self._problems),
            "examples": [list(e) for e in self._examples],
            "refused": self._refused,
            "refused_at": list(self._refused_at),
            "turns": list(self._turns),
            "lost_at": list(self._lost_at),
        }

    def add(self, stored: np.ndarray, tags: np.ndarray, note: Any, where: str) -> None:
        """Count one packed conversation: its stored tokens, their tags (role, or
        :data:`ADDED_TAG`) and its note (``{"problems": [[kind, message, detail], ...],
        "turns": trained, "unsupervised_turns": [message, ...]}`` or None), found at
        ``where`` (``file:line``)."""
        supervised = carries_loss(stored)
        self._counts[:, 0] += np.bincount(tags, minlength=_TAGS)
        self._counts[:, 1] += np.bincount(tags[supervised], minlength=_TAGS)
        note = note or {}
        lost = note.get("unsupervised_turns", ())
        self._turns[0] += note.get("turns", 0)
        self._turns[1] += len(lost)
        for k in lost[: max(0, EXAMPLES - len(self._lost_at))]:
            self._lost_at = (*self._lost_at, f"{where}: message {k}")
        for kind, message, detail in note.get("problems", ()):
            k = PROBLEM_KINDS.index(kind)
            self._problems[k] += 1
            if len(self._examples[k]) < EXAMPLES:
                example = f"{where}: message {message}: {_clip(detail)}"
                self._examples[k] = (*self._examples[k], example)

    def refused(self, where: str, why: str) -> None:
        """Count a conversation the template refused (skipped with ``--on-error skip``)."""
        self._refused += 1
        if len(self._refused_at) < EXAMPLES:
            # Room for the refusal's two paths (input and template) and the template's reason.
            self._refused_at = (*self._refused_at, f"{where}: {_clip(why, _REFUSAL_CHARS)}")

    def stats(self) -> dict[str, Any]:
        """The audit for ``index.json``'s ``stats.chat`` (module docstring)."""
        roles = {
            role: {"tokens": int(t), "supervised": int(s)}
            for role, (t, s) in zip(ROLES, self._counts[:ADDED_TAG].tolist(), strict=True)
        }
        return {
            "roles": roles,
            "added_tokens": int(self._counts[ADDED_TAG, 0]),
            "problems": {
                kind: {"count": n, "examples": list(e)}
                for kind, n, e in zip(PROBLEM_KINDS, self._problems, self._examples, strict=True)
            },
            "template_refused": {"count": self._refused, "examples": list(self._refused_at)},
            "assistant_turns": {
                "count": self._turns[0],
                "unsupervised": self._turns[1],
                "examples": list(self._lost_at),
            },  # fmt: skip
        }
