"""Token ids and a loss mask for one conversation, from any chat template: :class:`ChatEncoder`.

The mask comes from the template's own output, not from ``{% generation %}`` tags: the
conversation is rendered whole (T), and before and after each supervised assistant turn
(:mod:`wdstream.chat.spans` gives the rules that turn those renders into characters); T is
tokenised once, with its special tokens recognised and each token's character span, and the
characters are mapped to tokens (:mod:`wdstream.chat.encoding`)::

    encoder = ChatEncoder(load_chat_template(tok), tok, train_on="assistant")
    enc = encoder.encode(parse_conversation(record))
    enc.ids, enc.supervised, enc.problems

``train_on``: ``assistant`` (every assistant turn's content and end-of-turn token),
``last`` (only the last assistant turn's) or ``all`` (every token).

Every message's region of T (for the token counts per role, and ``message_index``) ends
where the next one starts: before an assistant turn, at the end of the generation prompt
P_i (the assistant's header is what the model is prompted with, so it counts with the
message before it); after an assistant turn, at the end of Q_i (or of its rule-2 span);
otherwise where the conversation rendered through the message ends. Each end is used only
when T starts with the render it comes from; a message whose end is not found shares the
region of the message after it.

Renders per conversation: T, then P_i and Q_i for every assistant turn (Q_i of a final turn
is T), and one more for each other message followed by a message that is not an assistant
turn (e.g. a system message before the first user message): for ``system, (user,
assistant) x 4`` that is 9 renders. The template is compiled once (:class:`ChatTemplate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from wdstream.chat.encoding import STRADDLE, ChatEncoding, ChatProblem, token_mask
from wdstream.chat.spans import TurnSpan, turn_span
from wdstream.chat.template import ChatTemplate
from wdstream.errors import ConversationError
from wdstream.tokenizers.base import Tokenizer

__all__ = ["TRAIN_ON", "ChatEncoder"]

TRAIN_ON = ("assistant", "last", "all")


class ChatEncoder:
    """Encode conversations with one template, tokenizer and ``train_on`` rule.

    Args:
        template: the chat template.
        tokenizer: any wdstream tokenizer (it must implement ``encode_chat``).
        train_on: ``"assistant"``, ``"last"`` or ``"all"`` (module docstring).

    Raises:
        ValueError: an unknown ``train_on``.
    """

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, train_on: str = "assistant"):
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on must be one of {', '.join(TRAIN_ON)}, got {train_on!r}")
        self.template = template
        self.tokenizer = tokenizer
        self.train_on = train_on

    def _turns(
        self, prepared: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[int], list[tuple[int, TurnSpan]]]:
        """The whole text, each message's region end (-1: not found) and every assistant
        turn's :class:`TurnSpan`, from the renders the module docstring lists."""

        def render(count: int, generation_prompt: bool = False) -> str:
            return self.template.render_prepared(prepared[:count], generation_prompt, tools)

        n = len(prepared)
        whole = render(n)
        ends = [-1] * (n - 1) + [len(whole)]
        turns = []
        for k in range(n):
            if prepared[k].get("role") == "assistant":
                prompt = render(k, True)
                through = whole if k == n - 1 else render(k + 1)
                found = turn_span(whole, prompt, through, prepared[k].get("content"))
                turns.append((k, found))
                if k > 0 and ends[k - 1] < 0 and found.end > found.start:
                    ends[k - 1] = found.start  # the assistant's header counts with message k-1
                if k == n - 1:
                    continue
                if whole.startswith(through):
                    ends[k] = len(through)
                elif found.end > found.start:  # with the whitespace after it, as under rule 1
                    ends[k] = len(whole) - len(whole[found.end :].lstrip())
            elif k < n - 1 and prepared[k + 1].get("role") != "assistant":
                through = render(k + 1)
                ends[k] = len(through) if whole.startswith(through) else -1
        return whole, ends, turns

    def encode(
        self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> ChatEncoding:
        """Token ids, the loss mask and the problems of one conversation.

        Args:
            messages: ``{role, content, ...}`` dicts (e.g. from
                :func:`~wdstream.chat.conversations.parse_conversation`).
            tools: tool schemas the template may render (``tools`` in the template).

        Raises:
            ConversationError: the template refuses the conversation.
        """
        if not messages:
            raise ConversationError("a conversation needs at least one message")
        prepared = self.template.prepare(messages)
        roles = [str(m.get("role")) for m in prepared]
        whole, ends, turns = self._turns(prepared, tools)
        region_ends = np.maximum.accumulate(np.maximum(np.array(ends, dtype=np.int64), 0))
        problems: list[ChatProblem] = []
        if self.train_on == "all":
            starts = [0, *region_ends[:-1].tolist()]
            spans = [
                (k, s, int(e)) for k, (s, e) in enumerate(zip(starts, region_ends, strict=True))
            ]
        else:
            trained = turns[-1:] if self.train_on == "last" else turns
            spans = [(k, t.start, t.end) for k, t in trained if t.end > t.start]
            problems += [ChatProblem(k, t.problem, t.detail) for k, t in trained if t.problem]
        ids, token_spans = self.tokenizer.encode_chat(whole)
        supervised, straddles = token_mask(spans, token_spans, len(whole))
        message_index = np.minimum(
            np.searchsorted(region_ends, token_spans[:, 0], side="right"), len(roles) - 1
        ).astype(np.int32)
        for k in np.flatnonzero(straddles).tolist():
            start, end = token_spans[k].tolist()
            problems.append(
                ChatProblem(
                    int(message_index[k]),
                    STRADDLE,
                    f"token {k} ({whole[start:end]!r}) covers supervised and unsupervised "
                    "characters; supervised",
                )
            )
        return ChatEncoding(ids, supervised, message_index, roles, whole, spans, problems)
