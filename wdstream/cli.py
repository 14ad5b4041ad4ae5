"""``wdstream`` command line: pack, inspect, stats, verify, explain, demo. Thin: parse, call, print."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from wdstream.errors import WdstreamError
from wdstream.words import count

__all__ = ["main"]


# What a command can meet in normal use: bad input or options, storage, a missing extra.
# Each becomes one ``Error:`` line; anything else is a bug and keeps its traceback.
_EXPECTED = (WdstreamError, ValueError, OSError, ImportError)


def _debug() -> bool:
    """Whether ``--debug`` was given (outside a command: False)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.find_root().params.get("debug"))


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (a multi-line message's lines joined by "; ")."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "; ".join(lines) or exc.__class__.__name__


class _Group(click.Group):
    """A group whose commands report expected errors as one ``Error:`` line, not a
    traceback (``--debug`` keeps the traceback, for a bug report)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _EXPECTED as exc:
            if _debug():
                raise
            raise click.ClickException(_one_line(exc)) from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="wdstream")
@click.option("--debug", is_flag=True, help="On an error, show the traceback too.")
def main(debug: bool) -> None:
    """Pack text into WebDataset tar shards of tokens; inspect and verify them."""


def _fail(exc: Exception) -> None:
    """Report an expected error as one ``Error:`` line; under ``--debug``, re-raise it."""
    if _debug():
        raise exc
    raise click.ClickException(_one_line(exc)) from exc


def _storage_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the remote-storage options shared by every command that opens a dataset."""
    options = [
        click.option(
            "--endpoint-url",
            default=None,
            help="S3-compatible endpoint (MinIO, Ceph, R2...); default: AWS_ENDPOINT_URL.",
        ),
        click.option("--retries", type=int, default=None, help="Remote retry budget per request."),
        click.option(
            "--timeout",
            type=float,
            default=None,
            help="Remote connect and read timeout, seconds (default: 5 connect, 15 read).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _store_options(
    target: str, endpoint_url: str | None, retries: int | None, timeout: float | None
) -> dict[str, Any]:
    """The ``open_store`` options given on the command line (none for a local target)."""
    if "://" not in target:
        return {}
    given = {"endpoint_url": endpoint_url, "retries": retries, "timeout": timeout}
    if not target.startswith("s3://"):
        given.pop("endpoint_url")
    return {k: v for k, v in given.items() if v is not None}


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--output", "-o", required=True, help="Dataset root: folder, s3://, http(s)://.")
@click.option(
    "--text-key", default="text", show_default=True, help="JSON field (dotted for nested)."
)
@click.option(
    "--tokenizer",
    default="cl100k_base",
    show_default=True,
    help="Encoding name, .tiktoken path, HF tokenizer.json or SentencePiece .model.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "tiktoken", "bpe-openai"]),
    default="auto",
    show_default=True,
)
@click.option(
    "--eos/--no-eos", default=True, show_default=True, help="Append EOS to every document."
)
@click.option(
    "--bos", is_flag=True, help="Prepend BOS (the tokenizer's BOS, else its EOS, unless --bos-id)."
)
@click.option("--bos-id", type=int, default=None, help="BOS id (implies --bos).")
@click.option(
    "--seq-len", type=int, default=2048, show_default=True, help="Samples hold seq_len+1 tokens."
)
@click.option(
    "--mode",
    type=click.Choice(["concat", "docs", "bestfit"]),
    default="concat",
    show_default=True,
    help="bestfit: rows of whole documents, padded (docs/PACK.md).",
)
@click.option(
    "--bestfit-buffer",
    type=int,
    default=1024,
    show_default=True,
    help="--mode bestfit: documents per best-fit block (and rows' worth of tokens).",
)
@click.option("--shard-size", default="256MB", show_default=True)
@click.option("--shard-samples", type=int, default=None)
@click.option("--name", default="data", show_default=True, help="Shard name prefix.")
@click.option("--lines", is_flag=True, help=".txt inputs: one document per line.")
@click.option(
    "--on-error", type=click.Choice(["raise", "skip"]), default="raise", show_default=True
)
@click.option(
    "--errors", type=click.Choice(["strict", "replace"]), default="strict", show_default=True
)
@click.option(
    "--max-record-bytes",
    default="256MiB",
    show_default=True,
    help="Longest record (a line, or a whole .txt document); a longer one is a bad record.",
)
@click.option("--workers", type=int, default=None, help="Tokenizer workers (default: all cores).")
@click.option(
    "--pool", type=click.Choice(["auto", "threads", "processes"]), default="auto", show_default=True
)
@click.option(
    "--overwrite", is_flag=True, help="Replace a dataset or interrupted pack at --output."
)
@click.option(
    "--force-unlock",
    is_flag=True,
    help="Take over the output's lock left by a pack that is dead (S3/HTTP, or another host).",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="ray: tokenise and write shards on a Ray cluster's workers (docs/RAY.md).",
)
@click.option(
    "--ray-address",
    default=None,
    help="--engine ray: 'auto' (the running cluster), ray://host:port; default: a local one.",
)
@click.option(
    "--progress",
    "show_progress",
    is_flag=True,
    help="Report progress: a bar on a terminal, else a line every WDSTREAM_PROGRESS_SECONDS "
    "(10) s (default: on a terminal, or with WDSTREAM_PROGRESS=1).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress, summary or warnings.")
@_storage_options
def pack(
    inputs: tuple[str, ...],
    output: str,
    show_progress: bool,
    quiet: bool,
    endpoint_url: str | None,
    retries: int | None,
    timeout: float | None,
    **options: Any,
) -> None:
    """Tokenise INPUT... (JSONL[.gz|.zst], .txt, dirs, globs, {a..b}, -) into shards."""
    from wdstream.write.pack import describe, one_shard_warning
    from wdstream.write.pack import pack as do_pack

    store_options = _store_options(output, endpoint_url, retries, timeout)
    try:
        result = do_pack(
            list(inputs),
            output,
            progress=False if quiet else True if show_progress else None,
            store_options=store_options,
            **options,
        )
    except (WdstreamError, ValueError, OSError) as exc:
        _fail(exc)
    if not quiet:
        click.echo(describe(result))
        warning = one_shard_warning(result)
        if warning is not None:
            click.echo(f"Warning: {warning}", err=True)
        stats = result.index.stats
        if stats.get("records_skipped"):
            for loc in stats["skipped_locations"]:
                click.echo(f"  skipped {loc}", err=True)


def _preview(text: str, width: int = 160) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


@main.command()
@click.argument("target")
@click.option("--samples", "-n", type=int, default=3, show_default=True)
@click.option("--tokenizer", default=None, help="For decoding (default: the index's).")
@_storage_options
def inspect(target: str, samples: int, tokenizer: str | None, **remote: Any) -> None:
    """Show the first samples of a dataset ROOT or a single .tar shard."""
    from wdstream.inspect import preview_samples
    from wdstream.tokenizers import index_tokenizer, load_tokenizer

    try:
        index, previews = preview_samples(target, samples, _store_options(target, **remote))
    except (WdstreamError, ValueError, OSError) as exc:
        _fail(exc)
    try:
        decode: Callable[[Any], str] = (
            load_tokenizer(tokenizer or "cl100k_base", "tiktoken").decode
            if tokenizer or index is None
            else index_tokenizer(index.tokenizer).decode
        )
    except (WdstreamError, ValueError) as exc:
        click.echo(f"(showing ids: {exc}; pass --tokenizer to decode)", err=True)
        decode = str
    if index is not None:
        click.echo(
            f"{target}: {count(len(index.shards), 'shard')}, {count(index.total_samples, 'sample')}, "
            f"{count(index.total_documents, 'document')}, {count(index.total_tokens, 'token')}; "
            f"{index.tokenizer['name']} ({index.dtype}), mode {index.mode}, seq_len {index.seq_len}"
        )
    for p in previews:
        click.echo(
            f"{p.key}: {count(p.tokens, 'token')}, doc_lens {list(p.doc_lens)}, cont {p.cont}"
        )
        pos = 0
        for j, n in enumerate(p.doc_lens):
            piece = p.sample.tokens[pos : pos + n]
            pos += n
            head = "  ...cont " if j == 0 and p.cont else "  doc      "
            click.echo(f"{head}[{count(n, 'token')}] {_preview(decode(piece[:64]))}")


@main.command()
@click.argument("root")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_storage_options
def stats(root: str, as_json: bool, **remote: Any) -> None:
    """Shards, samples, documents, tokens, bytes and a document-length histogram.

    ROOT may be a mixture spec (.json / .toml): per-source counts and the schedule."""
    from wdstream.inspect import dataset_stats
    from wdstream.read.mixture.spec import is_mixture
    from wdstream.storage import open_store

    if is_mixture(root):
        _mixture_stats(root, as_json, remote)
        return
    try:
        s = dataset_stats(open_store(root, **_store_options(root, **remote)))
    except (WdstreamError, ValueError, OSError) as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(s, indent=1, sort_keys=True))
        return
    click.echo(
        f"{root}: {count(s['shards'], 'shard')}, {count(s['samples'], 'sample')}, "
        f"{count(s['documents'], 'document')}, {count(s['tokens'], 'token')}, "
        f"{s['bytes'] / 1e6:,.1f} MB ({s['tokenizer']['name']}, mode {s['mode']})"
    )
    if s["rows"] is not None:
        click.echo(
            f"rows {s['rows']:,}; documents truncated {s['documents_truncated']:,} "
            f"({s['documents_truncated_pct']:.2f} %); padding {s['padding_pct']:.2f} % of tokens"
        )
    click.echo(f"document length (tokens), mean {s['doc_len_mean']:.1f}:")
    top = max(s["doc_len_histogram"].values(), default=1)
    for bucket, n in s["doc_len_histogram"].items():
        click.echo(f"  {bucket:>17} {n:>9,} {'#' * max(1, round(40 * n / top))}")
    input_stats = s["input_stats"]
    if input_stats:
        click.echo(
            f"input: {input_stats.get('input_bytes', 0) / 1e6:,.1f} MB, "
            f"{count(input_stats.get('empty_documents_skipped', 0), 'empty document')} skipped, "
            f"{count(input_stats.get('records_skipped', 0), 'bad record')} skipped"
        )


@main.command()
@click.argument("root")
@_storage_options
def verify(root: str, **remote: Any) -> None:
    """Check every shard's sha256, every sample, and the index counts."""
    from wdstream.inspect import verify_dataset
    from wdstream.storage import open_store

    try:
        report = verify_dataset(open_store(root, **_store_options(root, **remote)))
    except (WdstreamError, ValueError, OSError) as exc:
        _fail(exc)
    if not report.ok:
        click.echo(f"FAILED: {report.problems[0]}", err=True)
        sys.exit(1)
    click.echo(
        f"OK: {count(report.shards, 'shard')}, {count(report.samples, 'sample')}, "
        f"{count(report.documents, 'document')}, {count(report.tokens, 'token')} verified"
    )


@main.command()
@click.argument("dataset")
@click.option("--step", type=int, default=None, help="Global (training) step to explain.")
@click.option("--steps", default=None, metavar="A:B", help="Steps A to B-1 (instead of --step).")
@click.option("--format", "fmt", type=click.Choice(["text", "jsonl"]), default="text",
              show_default=True, help="jsonl: one JSON record per row.")  # fmt: skip
@click.option("--seq-len", type=int, default=None, help="Loader's seq_len (default: packed).")
@click.option("--batch-size", type=int, default=None, help="Rows per rank (B).")
@click.option("--world-size", type=int, default=1, show_default=True, help="Ranks (W).")
@click.option("--seed", type=int, default=None, help="Loader's seed (default 0).")
@click.option("--shuffle-window", type=int, default=1024, show_default=True)
@click.option("--shuffle-lanes", type=int, default=8, show_default=True)
@click.option("--no-shuffle", is_flag=True, help="The Loader ran with shuffle=False.")
@click.option(
    "--state",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A saved Loader state (JSON): seed, seq_len, shuffle options, global batch, step "
    "origin and skipped steps are taken from it.",
)
@click.option("--text", is_flag=True, help="Show each piece's decoded text (cut to 200 chars).")
@_storage_options
def explain(
    dataset: str,
    step: int | None,
    steps: str | None,
    fmt: str,
    seq_len: int | None,
    batch_size: int | None,
    world_size: int,
    seed: int | None,
    shuffle_window: int,
    shuffle_lanes: int,
    no_shuffle: bool,
    state: str | None,
    text: bool,
    **remote: Any,
) -> None:
    """Where every row of global step STEP (or steps A:B) came from: rank, shard, sample,
    file:line. With a --state that skipped steps, steps are training steps.

    DATASET may be a mixture spec (.json / .toml): each row also names its source."""
    from wdstream.cli_explain import explain_output, load_state, parse_steps
    from wdstream.read.mixture.spec import is_mixture

    mixture = is_mixture(dataset)
    store = (
        _mixture_store_options(dataset, remote) if mixture else _store_options(dataset, **remote)
    )
    lines = explain_output(
        dataset, parse_steps(step, steps), fmt, store, batch_size=batch_size,
        world_size=world_size, seq_len=seq_len, seed=seed, shuffle=not no_shuffle,
        shuffle_window=shuffle_window, shuffle_lanes=shuffle_lanes, state=load_state(state),
        text=text,
    )  # fmt: skip
    for line in lines:
        click.echo(line)


def _mixture_store_options(spec: str, remote: dict[str, Any]) -> dict[str, Any]:
    """The storage options of a spec's remote sources (from its first remote one)."""
    from wdstream.read.mixture.spec import read_spec

    urls = list(read_spec(spec).sources.values())
    return _store_options(next((u for u in urls if "://" in u), spec), **remote)


def _mixture_stats(spec: str, as_json: bool, remote: dict[str, Any]) -> None:
    from wdstream.read.mixture.inspect import mixture_stats, mixture_stats_lines

    try:
        s = mixture_stats(spec, **_mixture_store_options(spec, remote))
    except (WdstreamError, ValueError, OSError) as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(s, indent=1, sort_keys=True))
        return
    for line in mixture_stats_lines(s):
        click.echo(line)


@main.command()
@click.option(
    "--workdir", default=None, help="Where to build the corpus and dataset (default: a temp dir)."
)
@click.option("--megabytes", type=float, default=4.0, show_default=True, help="Corpus size.")
def demo(workdir: str | None, megabytes: float) -> None:
    """Build a corpus from the stdlib's .py files, pack it, and stream batches from it."""
    from wdstream.demo import run_demo

    try:
        run_demo(workdir, megabytes, echo=click.echo)
    except (WdstreamError, ValueError, OSError) as exc:
        _fail(exc)


if __name__ == "__main__":
    main()
