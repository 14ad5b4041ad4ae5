"""Small tokenizers trained at test time (no downloads): a Hugging Face byte-level BPE
``tokenizer.json`` and a SentencePiece ``.model``, both from the shared test corpus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def build_hf_bpe(
    folder: Path, texts: list[str], config: dict[str, Any] | None = None, vocab_size: int = 600
) -> Path:
    """Train a byte-level BPE with ``<s>``/``</s>``/``<pad>`` specials and a post-processor
    ``<s> $A </s>``; write ``tokenizer.json`` (and ``tokenizer_config.json`` if ``config``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def build_spm(folder: Path, texts: list[str], vocab_size: int = 1000, **options: Any) -> Path:
    """Train a SentencePiece BPE model on ``texts``; return the ``.model`` path."""
    import sentencepiece

    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "train.txt"
    corpus.write_text("\n".join(t.replace("\n", " ") for t in texts), encoding="utf-8")
    prefix = folder / "spm"
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        byte_fallback=True,
        minloglevel=2,
        **options,
    )
    return prefix.with_suffix(".model")
