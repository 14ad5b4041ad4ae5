"""The ``pack`` command's options and its run, kept apart from :mod:`wdstream.cli` so the
command line module stays one screen per command: ``cli.pack`` parses, :func:`run_pack`
calls :func:`wdstream.pack` and says what to print."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

__all__ = ["pack_options", "run_pack"]

_OPTIONS = [
    click.option("--output", "-o", required=True, help="Dataset root: folder, s3://, http(s)://."),
    click.option(
        "--text-key",
        default="text",
        show_default=True,
        help="JSON field or Parquet/Arrow column (dotted for nested).",
    ),
    click.option(
        "--tokenizer",
        default="cl100k_base",
        show_default=True,
        help="Encoding name, .tiktoken path, HF tokenizer.json or SentencePiece .model.",
    ),
    click.option(
        "--backend",
        type=click.Choice(["auto", "tiktoken", "bpe-openai"]),
        default="auto",
        show_default=True,
    ),
    click.option(
        "--eos/--no-eos", default=True, show_default=True, help="Append EOS to every document."
    ),
    click.option(
        "--bos",
        is_flag=True,
        help="Prepend BOS (the tokenizer's BOS, else its EOS, unless --bos-id).",
    ),
    click.option("--bos-id", type=int, default=None, help="BOS id (implies --bos)."),
    click.option(
        "--seq-len",
        type=int,
        default=2048,
        show_default=True,
        help="Samples hold seq_len+1 tokens.",
    ),
    click.option(
        "--mode",
        type=click.Choice(["concat", "docs", "bestfit"]),
        default=None,
        help="bestfit: rows of whole documents, padded (docs/PACK.md). [default: concat; "
        "bestfit with --chat]",
    ),
    click.option(
        "--bestfit-buffer",
        type=int,
        default=1024,
        show_default=True,
        help="--mode bestfit: documents per best-fit block (and rows' worth of tokens).",
    ),
    click.option(
        "--shard-size",
        default=None,
        help="Maximum shard size (256MB, 1GiB, bytes). Default: input size / 128, from 1MB "
        "to 256MB (256MB for stdin): about 64 shards (docs/PACK.md).",
    ),
    click.option("--shard-samples", type=int, default=None),
    click.option(
        "--holdout",
        type=float,
        default=None,
        help="Hold out this fraction of the documents (e.g. 0.01), chosen by a hash of each "
        "document's ids, in a second dataset at OUTPUT/holdout/ (docs/PACK.md).",
    ),
    click.option("--name", default="data", show_default=True, help="Shard name prefix."),
    click.option("--lines", is_flag=True, help=".txt inputs: one document per line."),
    click.option(
        "--on-error", type=click.Choice(["raise", "skip"]), default="raise", show_default=True
    ),
    click.option(
        "--errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True
    ),
    click.option(
        "--max-record-bytes",
        default="256MiB",
        show_default=True,
        help="Longest record (a line, or a whole .txt document); a longer one is a bad record.",
    ),
    click.option(
        "--workers", type=int, default=None, help="Tokenizer workers (default: all cores)."
    ),
    click.option(
        "--pool",
        type=click.Choice(["auto", "threads", "processes"]),
        default="auto",
        show_default=True,
    ),
    click.option(
        "--overwrite", is_flag=True, help="Replace a dataset or interrupted pack at --output."
    ),
    click.option(
        "--force-unlock",
        is_flag=True,
        help="Take over the output's lock left by a pack that is dead (S3/HTTP, or another host).",
    ),
    click.option(
        "--engine",
        type=click.Choice(["local", "ray"]),
        default="local",
        show_default=True,
        help="ray: tokenise and write shards on a Ray cluster's workers (docs/RAY.md).",
    ),
    click.option(
        "--ray-address",
        default=None,
        help="--engine ray: 'auto' (the running cluster), ray://host:port; default: a local one.",
    ),
    click.option(
        "--progress",
        "show_progress",
        is_flag=True,
        help="Report progress: a bar on a terminal, else a line every WDSTREAM_PROGRESS_SECONDS "
        "(10) s (default: on a terminal, or with WDSTREAM_PROGRESS=1).",
    ),
    click.option("--quiet", "-q", is_flag=True, help="No progress, summary or warnings."),
    click.option(
        "--pretokenized",
        is_flag=True,
        help='Inputs are JSON Lines records of token ids ({"input_ids": [...]}) in --tokenizer\'s '
        "vocabulary, not text (docs/PACK.md).",
    ),
    click.option(
        "--ids-key", default="input_ids", show_default=True, help="--pretokenized: the ids field."
    ),
    click.option(
        "--mask-key",
        default=None,
        help="--pretokenized: the field holding each record's loss mask (0/1 per id); the "
        "dataset then stores it (uint32 ids, bit 31 = no loss; docs/CHAT.md).",
    ),
    click.option(
        "--long-docs",
        type=click.Choice(["split", "drop", "truncate"]),
        default=None,
        help="--mode bestfit: a document longer than a row is split across rows, dropped or "
        "truncated, and counted (default: drop for masked packs, split otherwise).",
    ),
    click.option(
        "--allow-unsupervised",
        is_flag=True,
        help="Masked packs: keep documents whose mask is all 0 (default: a bad record).",
    ),
    click.option(
        "--allow-unlocated",
        is_flag=True,
        help="--chat: pack even if some assistant turn gets no loss (its text not found in the "
        "rendered conversation); counted in stats.chat.assistant_turns (default: the pack "
        "fails naming the count and the first file:line).",
    ),
    click.option(
        "--chat",
        is_flag=True,
        help="Inputs are JSON Lines conversations (messages, ShareGPT or prompt/completion), "
        "rendered through a chat template and stored with a loss mask (docs/CHAT.md).",
    ),
    click.option(
        "--messages-key",
        default="messages",
        show_default=True,
        help="--chat: the key of a record's list of {role, content} messages.",
    ),
    click.option(
        "--chat-template",
        default=None,
        help="--chat: a Jinja template file, or a JSON file with 'chat_template' (default: the "
        "tokenizer folder's chat_template.jinja or tokenizer_config.json).",
    ),
    click.option(
        "--train-on",
        type=click.Choice(["assistant", "last", "all"]),
        default="assistant",
        show_default=True,
        help="--chat: the tokens that carry loss: every assistant turn, the last one, or all.",
    ),
    click.option(
        "--special-tokens-in-content",
        "special_tokens_in_content",
        type=click.Choice(["text", "parse"]),
        default="text",
        show_default=True,
        help="--chat: special-token text a message spells out (<|endoftext|> in scraped text) is "
        "tokenised as text, or parsed as the special token as transformers does; counted "
        "either way (stats.chat.problems.special_text).",
    ),
    click.option(
        "--chat-template-kwargs",
        default=None,
        metavar="JSON",
        help="--chat: template variables as a JSON object, e.g. '{\"enable_thinking\": false}', "
        "given to every render as transformers' apply_chat_template(**kwargs); recorded in "
        "index.json (docs/CHAT.md).",
    ),
    click.option(
        "--chat-now",
        default=None,
        help="--chat: the time (ISO 8601) a template's strftime_now formats (default: now; a "
        "resumed pack reuses the interrupted one's).",
    ),
]


def pack_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add every option of ``wdstream pack`` (but the storage ones) to ``command``."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def run_pack(
    inputs: list[str],
    output: str,
    show_progress: bool,
    quiet: bool,
    store_options: dict[str, Any],
    options: dict[str, Any],
) -> list[tuple[str, bool]]:
    """Run the pack; the lines to print, each with whether it goes to stderr.

    Raises:
        WdstreamError, ValueError, OSError: as :func:`wdstream.pack` raises them.
    """
    from wdstream.write.pack import describe, one_shard_warning
    from wdstream.write.pack import pack as do_pack

    options = {**options, "chat_template_kwargs": _template_kwargs(options["chat_template_kwargs"])}
    result = do_pack(
        inputs,
        output,
        progress=False if quiet else True if show_progress else None,
        store_options=store_options,
        **options,
    )
    if quiet:
        return []
    lines = [(describe(result), False)]
    warning = one_shard_warning(result)
    if warning is not None:
        lines.append((f"Warning: {warning}", True))
    stats = result.index.stats
    if stats.get("records_skipped"):
        lines += [(f"  skipped {loc}", True) for loc in stats["skipped_locations"]]
    if "supervised_tokens" in stats:
        lines.append((_mask_summary(stats, result.index.total_tokens), False))
    if "chat" in stats:
        lines += _chat_summary(stats["chat"])
    return lines


def _template_kwargs(text: str | None) -> Any:
    """``--chat-template-kwargs``' JSON object of template variables.

    Raises:
        ValueError: naming the option: not JSON, or not template variables
            (:func:`~wdstream.chat.template.template_variables`).
    """
    from wdstream.chat.template import template_variables

    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ValueError(f"--chat-template-kwargs: not JSON ({exc}), got {text!r:.80}") from exc
    return template_variables(value, "--chat-template-kwargs")


def _chat_summary(chat: dict[str, Any]) -> list[tuple[str, bool]]:
    """A chat pack's template problems and refusals: a count per kind, and a warning line
    per example location (to stderr)."""
    problems = chat["problems"]
    counts = ", ".join(f"{kind} {p['count']:,}" for kind, p in problems.items())
    lines = [(f"chat template problems: {counts}", False)]
    refused = chat["template_refused"]
    if refused["count"]:
        lines.append((f"chat: {refused['count']:,} conversations refused by the template", True))
    for kind, p in problems.items():
        lines += [(f"  {kind} at {where}", True) for where in p["examples"]]
    lines += [(f"  refused at {where}", True) for where in refused["examples"]]
    turns = chat.get("assistant_turns")
    if turns and turns["unsupervised"]:
        lines.append((f"chat: {turns['unsupervised']:,} of {turns['count']:,} assistant turns "
                      "without loss (--allow-unlocated)", True))  # fmt: skip
        lines += [(f"  no loss at {where}", True) for where in turns["examples"]]
    return lines


def _mask_summary(stats: dict[str, Any], tokens: int) -> str:
    """One line on a masked pack: supervised share and the documents the rules took out."""
    share = 100 * stats["supervised_tokens"] / tokens if tokens else 0.0
    dropped = stats.get("long_documents_dropped", 0)
    cut = stats.get("long_documents_truncated", 0)
    return (
        f"loss mask: {stats['supervised_tokens']:,} supervised tokens ({share:.2f} %); "
        f"long documents dropped {dropped:,}, truncated {cut:,}; documents without a "
        f"supervised token refused {stats['unsupervised_documents_refused']:,}"
    )
