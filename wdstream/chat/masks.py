"""Token ids and a loss mask for one conversation, from any chat template: :class:`ChatEncoder`.

The mask comes from the template's own output: the conversation is rendered whole (T), and
before and after each supervised assistant turn (:mod:`wdstream.chat.spans` gives the rules
that turn those renders into characters). A template with ``{% generation %}`` blocks is
supervised exactly on those blocks (``transformers``' semantics); without them, each turn's
text is checked to be its own (:func:`~wdstream.chat.provenance.foreign_text`: a turn holding
another message's text refuses the conversation). T is tokenised once, with the template's
special tokens recognised (special-token text the messages spell out stays text unless
``special_in_content="parse"``, :mod:`wdstream.chat.provenance`) and each token's character
span, and the characters are mapped to tokens (:mod:`wdstream.chat.encoding`). All renders of
one conversation share one budget (:mod:`wdstream.chat.budget`)::

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
assistant) x 4`` that is 9 renders; plus one per supervised turn for the check of its text
(templates without generation blocks), one for a conversation that spells out a special
token, and for a turn rule 1 of :mod:`wdstream.chat.spans` does not place, the conversation
before it and the whole one with the turn's strings changed. The template is compiled once
(:class:`ChatTemplate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jinja2
import numpy as np

from wdstream.chat.encoding import STRADDLE, ChatEncoding, ChatProblem, token_mask
from wdstream.chat.provenance import (
    content_specials,
    defused,
    foreign_text,
    rotated,
    special_pattern,
    spelled,
)
from wdstream.chat.spans import TurnSpan, turn_span
from wdstream.chat.template import ChatTemplate
from wdstream.errors import ConversationError
from wdstream.tokenizers.base import Tokenizer

__all__ = ["SPECIAL_IN_CONTENT", "SPECIAL_TEXT", "TRAIN_ON", "ChatEncoder"]

TRAIN_ON = ("assistant", "last", "all")
SPECIAL_IN_CONTENT = ("text", "parse")
SPECIAL_TEXT = "special_text"  # the problem kind: a message spells out a special token
Spans = list[tuple[int, int, int]]
_Turn = tuple[int, TurnSpan, str]  # (message, its span, the text Q_i adds for the turn)


def _answered(message: dict[str, Any]) -> bool:
    """Whether an assistant message has an answer: a letter or digit in its content past the
    last ``</think>`` (inline reasoning is not the answer), or tool calls."""
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    answer = content.rsplit("</think>", 1)[-1] if isinstance(content, str) else ""
    return any(c.isalnum() for c in answer) or bool(message.get("tool_calls"))


class ChatEncoder:
    """Encode conversations with one template, tokenizer and ``train_on`` rule.

    Args:
        template: the chat template.
        tokenizer: any wdstream tokenizer (it must implement ``encode_chat``).
        train_on: ``"assistant"``, ``"last"`` or ``"all"`` (module docstring).
        special_in_content: ``"text"`` (default): special-token text the messages spell out
            is tokenised as text, only the template's markup as special tokens; ``"parse"``:
            as special tokens wherever it is, as ``transformers`` does. Either way the
            conversation gets a ``special_text`` problem.

    Raises:
        ValueError: an unknown ``train_on`` or ``special_in_content``.
    """

    def __init__(
        self,
        template: ChatTemplate,
        tokenizer: Tokenizer,
        train_on: str = "assistant",
        special_in_content: str = "text",
    ) -> None:
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on must be one of {', '.join(TRAIN_ON)}, got {train_on!r}")
        if special_in_content not in SPECIAL_IN_CONTENT:
            raise ValueError(
                f"special_in_content must be one of {', '.join(SPECIAL_IN_CONTENT)}, got "
                f"{special_in_content!r}"
            )
        self.template = template
        self.tokenizer = tokenizer
        self.train_on = train_on
        self.special_in_content = special_in_content
        self._specials = special_pattern(tokenizer.special_texts())

    def _turns(
        self, prepared: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[tuple[int, int]], list[int], list[_Turn]]:
        """The whole text, its ``{% generation %}`` blocks, each message's region end (-1:
        not found) and every assistant turn's span, from the renders the module docstring
        lists."""

        def render(count: int, generation_prompt: bool = False) -> str:
            return self.template.render_prepared(prepared[:count], generation_prompt, tools)

        def optional(messages: list[dict[str, Any]]) -> Callable[[], str | None]:
            return lambda: self._region_render(messages, tools)

        def changed(k: int) -> Callable[[], str | None]:
            """T with turn ``k``'s strings changed: rotated only if a rule renders it."""
            return lambda: self._region_render(
                [*prepared[:k], rotated(prepared[k]), *prepared[k + 1 :]], tools
            )

        n = len(prepared)
        whole, blocks = self.template.render_blocks(prepared, False, tools)
        ends = [-1] * (n - 1) + [len(whole)]
        turns: list[_Turn] = []
        for k in range(n):
            if prepared[k].get("role") == "assistant":
                prompt = render(k, True)
                through = whole if k == n - 1 else render(k + 1)
                found = turn_span(whole, prompt, through, optional(prepared[:k]),
                                  changed(k), self._specials, _answered(prepared[k]))  # fmt: skip
                turns.append((k, found, found.added))
                lo, hi = (
                    (found.start, found.end) if found.end > found.start else found.owned or (-1, -1)
                )
                if k > 0 and ends[k - 1] < 0 and lo >= 0:
                    ends[k - 1] = lo  # the assistant's header counts with message k-1
                if k == n - 1:
                    continue
                if whole.startswith(through):
                    ends[k] = len(through)
                elif found.end > found.start:  # with the whitespace after it, as under rule 1
                    ends[k] = len(whole) - len(whole[found.end :].lstrip())
                elif hi > lo:
                    ends[k] = hi
            elif k < n - 1 and prepared[k + 1].get("role") != "assistant":
                region = self._region_render(prepared[: k + 1], tools)
                ends[k] = len(region) if region is not None and whole.startswith(region) else -1
        return whole, blocks, ends, turns

    def _region_render(self, messages: list[dict[str, Any]], tools: Any) -> str | None:
        """A render only a rule needs: the render through a message followed by another
        non-assistant one (its region's end only), the conversation before a turn whose
        render does not start with the generation prompt, or the conversation with a turn's
        strings changed (:mod:`wdstream.chat.spans`). None when the template's
        ``raise_exception`` refuses it (Llama 3.1 with ``custom_tools`` wants a user message
        after the system one): the message then shares the next one's region, the rule does
        not place the turn. Any other failure refuses the conversation."""
        try:
            return self.template.render_prepared(messages, False, tools)
        except ConversationError as exc:
            if type(exc.__cause__) is not jinja2.exceptions.TemplateError:
                raise
            return None

    def _supervised(
        self,
        prepared: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        blocks: list[tuple[int, int]],
        region_ends: np.ndarray,
        turns: list[_Turn],
    ) -> tuple[Spans, list[ChatProblem]]:
        """The supervised character spans and the problems of the rules that found them:
        every region (``train_on="all"``), the generation blocks of a template that has
        them, else the turns' spans, each checked to hold only its own message's text."""
        if self.train_on == "all":
            starts = [0, *region_ends[:-1].tolist()]
            return [
                (k, s, int(e)) for k, (s, e) in enumerate(zip(starts, region_ends, strict=True))
            ], []
        if self.template.has_generation:  # transformers' semantics: exactly the blocks
            owner = np.searchsorted(region_ends, [s for s, _ in blocks], side="right").tolist()
            spans = [(min(k, len(prepared) - 1), s, e) for k, (s, e) in zip(owner, blocks, strict=True)
                     if e > s]  # fmt: skip
            if self.train_on == "last" and turns:
                last = turns[-1][0]
                spans = [span for span in spans if span[0] >= last]
            return spans, []
        trained = turns[-1:] if self.train_on == "last" else turns
        problems = [ChatProblem(k, t.problem, t.detail) for k, t, _ in trained if t.problem]
        spans = [(k, t.start, t.end) for k, t, _ in trained if t.end > t.start]

        def render(messages: list[dict[str, Any]], alt_tools: Any) -> str:
            return self.template.render_prepared(messages, False, alt_tools)

        checked = [(k, added) for k, t, added in trained if t.end > t.start]
        changed = [rotated(m) for m in prepared[: max((k for k, _ in checked), default=0)]]
        changed_tools = rotated(tools) if checked else None
        for k, added in checked:
            if foreign_text(render, prepared, changed, k, added, changed_tools):
                raise ConversationError(
                    f"the chat template ({self.template.origin}) writes text of other messages "
                    f"into assistant turn {k} (the turn's text changes when only the other "
                    "messages do: a recap, a footer or a repeated message); it would be "
                    "trained on as the assistant's, so the conversation is refused"
                )
        return spans, problems

    def _content_specials(
        self, prepared: list[dict[str, Any]], tools: list[dict[str, Any]] | None, whole: str
    ) -> tuple[list[tuple[int, int]], list[ChatProblem]]:
        """The spans of ``whole`` holding special-token text of the messages, to tokenise as
        text (``special_in_content="text"``), and the ``special_text`` problem, if any."""
        if self._specials is None:
            return [], []
        first, found = spelled(self._specials, prepared, tools)
        if first < 0:
            return [], []
        message = min(first, len(prepared) - 1)
        names = ", ".join(map(repr, found[:3])) + (" ..." if len(found) > 3 else "")
        where = "the tools" if first == len(prepared) else "the message"
        if self.special_in_content == "parse":
            detail = f"{where} spells out {names}: parsed as special tokens (parse)"
            return [], [ChatProblem(message, SPECIAL_TEXT, detail)]
        plain = self.template.render_prepared(
            defused(prepared, self._specials), False, defused(tools, self._specials)
        )
        spans = content_specials(whole, plain, self._specials)
        if spans is None:
            raise ConversationError(
                f"message {message} spells out the special token text {names}, and the chat "
                f"template ({self.template.origin}) renders it otherwise than other text: "
                "which of it is the template's markup cannot be told, so the conversation is "
                "refused (--special-tokens-in-content parse tokenises it as transformers does)"
            )
        detail = f"{where} spells out {names}: tokenised as text"
        return spans, [ChatProblem(message, SPECIAL_TEXT, detail)]

    def encode(
        self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> ChatEncoding:
        """Token ids, the loss mask and the problems of one conversation.

        Args:
            messages: ``{role, content, ...}`` dicts (e.g. from
                :func:`~wdstream.chat.conversations.parse_conversation`).
            tools: tool schemas the template may render (``tools`` in the template).

        Raises:
            ConversationError: the template refuses the conversation (it raises, or passes
                a bound of :mod:`wdstream.chat.budget`), writes other messages' text into
                an assistant turn, or renders special-token text of the messages in a way
                that cannot be told from its markup.
        """
        if not messages:
            raise ConversationError("a conversation needs at least one message")
        prepared = self.template.prepare(messages)
        roles = [str(m.get("role")) for m in prepared]
        with self.template.budget():
            whole, blocks, ends, turns = self._turns(prepared, tools)
            region_ends = np.maximum.accumulate(np.maximum(np.array(ends, dtype=np.int64), 0))
            spans, problems = self._supervised(prepared, tools, blocks, region_ends, turns)
            as_text, special = self._content_specials(prepared, tools, whole)
        try:
            ids, token_spans = self.tokenizer.encode_chat(whole, as_text)
        except ValueError as exc:
            raise ConversationError(str(exc)) from exc
        supervised, straddles = token_mask(spans, token_spans, len(whole))
        message_index = np.minimum(
            np.searchsorted(region_ends, token_spans[:, 0], side="right"), len(roles) - 1
        ).astype(np.int32)
        problems += special
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
        trained = [k for k, _, _ in turns] if self.train_on != "all" else []
        trained = trained[-1:] if self.train_on == "last" else trained
        kept = {k for k, start, end in spans if end > start}
        return ChatEncoding(ids, supervised, message_index, roles, whole, spans, problems,
                            trained, [k for k in trained if k not in kept])  # fmt: skip
