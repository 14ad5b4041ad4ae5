"""A conversation's tokens and loss mask (:class:`ChatEncoding`), and characters mapped to tokens.

Token k covers the characters ``[start_k, end_k)`` its tokenizer reports
(:meth:`~wdstream.tokenizers.base.Tokenizer.encode_chat`); one standing for no character
(SentencePiece's dummy prefix) covers the character after it. A token is supervised when any
character it covers is, the rule ``transformers`` applies to its ``{% generation %}`` spans;
a supervised token that also covers unsupervised characters *straddles* a boundary and is
reported (a ``straddle`` problem), never silently moved to one side.

How it is stored (the packer's side of the contract): token ids as ``uint32`` with bit 31
set on every token that carries *no* loss, so the mask lives inside the token array, is
covered by its CRC32C and moves with the tokens through every reader path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["STRADDLE", "ChatEncoding", "ChatProblem", "token_mask"]

STRADDLE = "straddle"


@dataclass(frozen=True)
class ChatProblem:
    """Something about one record's mask that a reader of the stats should know.

    Attributes:
        message: index of the message (turn) concerned.
        kind: ``relocated`` (the template rewrites the turn in the whole conversation; its
            span was found by the second rule), ``unlocated`` (the turn could not be found;
            it is not supervised), ``straddle`` (a supervised token also covers
            unsupervised characters) or ``special_text`` (the messages spell out a special
            token; the detail says whether it was kept text or parsed).
        detail: one line for a person.
    """

    message: int
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"message {self.message}: {self.kind}: {self.detail}"


@dataclass
class ChatEncoding:
    """One conversation as tokens with a per-token loss mask.

    Attributes:
        ids: ``int64`` token ids of the rendered conversation (no BOS/EOS added beyond what
            the template writes).
        supervised: ``bool``, same length: the token carries loss.
        message_index: ``int32``, same length: the message whose rendered text holds the
            token's first character (the header of a turn belongs to its message).
        roles: the role of every message, so ``roles[message_index[k]]`` is token k's.
        text: the rendered conversation.
        spans: ``(message, start, end)`` character spans of ``text`` that are supervised.
        problems: what the rules had to decide for this record (see :class:`ChatProblem`).
        trained_turns: the assistant turns ``train_on`` trains (every one; the last; none
            for ``all``, which trains every token), by message index.
        unsupervised_turns: those of them on which no token carries loss (a turn not
            located, or one the template renders as no text): lost turns, which a pack
            refuses to leave without ``--allow-unlocated``.
    """

    ids: np.ndarray
    supervised: np.ndarray
    message_index: np.ndarray
    roles: list[str]
    text: str
    spans: list[tuple[int, int, int]]
    problems: list[ChatProblem] = field(default_factory=list)
    trained_turns: list[int] = field(default_factory=list)
    unsupervised_turns: list[int] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        """All tokens of the conversation."""
        return len(self.ids)

    @property
    def n_supervised(self) -> int:
        """Tokens that carry loss."""
        return int(self.supervised.sum())

    @property
    def has_supervised(self) -> bool:
        """False for a conversation nothing of which is trained on (e.g. no assistant turn)."""
        return bool(self.supervised.any())

    def _per_role(self, counts: np.ndarray) -> dict[str, int]:
        out: dict[str, int] = {}
        for role, n in zip(self.roles, counts.tolist(), strict=True):
            out[role] = out.get(role, 0) + int(n)
        return out

    @property
    def role_tokens(self) -> dict[str, int]:
        """Tokens per role (every role of the conversation, zeros included)."""
        return self._per_role(np.bincount(self.message_index, minlength=len(self.roles)))

    @property
    def role_supervised(self) -> dict[str, int]:
        """Supervised tokens per role (every role of the conversation, zeros included)."""
        counts = np.bincount(self.message_index[self.supervised], minlength=len(self.roles))
        return self._per_role(counts)


def token_mask(
    spans: list[tuple[int, int, int]], token_spans: np.ndarray, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(supervised, straddles)`` per token from supervised character spans (module
    docstring): ``bool`` arrays the length of ``token_spans``."""
    delta = np.zeros(length + 1, dtype=np.int64)
    for _, start, end in spans:
        delta[start] += 1
        delta[end] -= 1
    covered = np.cumsum(delta[:-1]) > 0
    before = np.zeros(length + 1, dtype=np.int64)  # before[c]: supervised characters < c
    np.cumsum(covered, out=before[1:])
    starts = token_spans[:, 0]
    ends = np.maximum(token_spans[:, 1], np.minimum(starts + 1, length))
    inside = before[ends] - before[starts]
    supervised = inside > 0
    return supervised, supervised & (inside < ends - starts)
