"""Chat data: conversations turned into token ids and a loss mask, for any chat template.

One module a job: :mod:`~wdstream.chat.conversations` (a JSON record to messages),
:mod:`~wdstream.chat.jinja` and :mod:`~wdstream.chat.template` (rendering as
``transformers`` does, without it), :mod:`~wdstream.chat.spans` (the rules that find a
turn's supervised characters), :mod:`~wdstream.chat.encoding` (characters to tokens, the
result), :mod:`~wdstream.chat.provenance` (whose text a turn holds; which special-token text
is the template's), :mod:`~wdstream.chat.budget` (the bounds on a render) and
:mod:`~wdstream.chat.masks` (:class:`ChatEncoder`, which runs them). The method and its rules:
``docs/CHAT.md``.
"""

from wdstream.chat.conversations import parse_conversation
from wdstream.chat.encoding import ChatEncoding, ChatProblem
from wdstream.chat.masks import TRAIN_ON, ChatEncoder
from wdstream.chat.template import ChatTemplate, load_chat_template

__all__ = [
    "TRAIN_ON",
    "ChatEncoder",
    "ChatEncoding",
    "ChatProblem",
    "ChatTemplate",
    "load_chat_template",
    "parse_conversation",
]
