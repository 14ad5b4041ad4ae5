"""``wdstream`` command line: pack, inspect, stats, verify, explain, demo. Thin: parse, call, print."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from wdstream.cli_pack import pack_options, run_pack
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
        except BrokenPipeError:
            # The reader of our output went away (``explain ... | head``): not an error.
            # Point stdout at devnull so the interpreter's final flush does not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(0)
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
@pack_options
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
    """Tokenise INPUT... (JSONL[.gz|.zst], .txt, .parquet, .arrow, dirs, globs, {a..b}, -)
    into shards.

    With --pretokenized, INPUT... hold records of token ids (docs/PACK.md)."""
    from wdstream.write.writer import checked_options

    store_options = _store_options(output, endpoint_url, retries, timeout)
    try:  # what the Python writer refuses up front (a row length no reader takes, ...)
        checked_options(output, options)
    except TypeError as exc:  # an empty --text-key: a bad option, not a bug
        _fail(ValueError(str(exc)))
    try:
        lines = run_pack(list(inputs), output, show_progress, quiet, store_options, options)
    except (WdstreamError, ValueError, OSError) as exc:
        _fail(exc)
    for text, to_stderr in lines:
        click.echo(text, err=to_stderr)


@main.command()
@click.argument("target")
@click.option("--samples", "-n", type=int, default=3, show_default=True)
@click.option("--tokenizer", default=None, help="For decoding (default: the index's, found from "
              "its pack_cwd; refused unless its sha256 is the recorded one).")  # fmt: skip
@click.option("--width", type=click.IntRange(min=0), default=160, show_default=True,
              help="Characters of each document shown (0: all); supervised spans are "
                   "shown whole beside them.")  # fmt: skip
@_storage_options
def inspect(target: str, samples: int, tokenizer: str | None, width: int, **remote: Any) -> None:
    """Show the first samples of a dataset ROOT or a single .tar shard."""
    from wdstream.inspect import preview_decoder, preview_samples
    from wdstream.inspect_preview import sample_lines

    try:
        index, previews = preview_samples(target, samples, _store_options(target, **remote))
    except (WdstreamError, ValueError, OSError) as exc:
        _fail(exc)
    try:
        decode: Callable[[Any], str] = preview_decoder(index, tokenizer)
    except (WdstreamError, ValueError) as exc:
        if tokenizer is not None:  # asked for by name: refused, never ids instead
            _fail(exc)
        click.echo(f"(showing ids: {exc}; pass --tokenizer to decode)", err=True)
        decode = str
    if index is not None:
        click.echo(
            f"{target}: {count(len(index.shards), 'shard')}, {count(index.total_samples, 'sample')}, "
            f"{count(index.total_documents, 'document')}, {count(index.total_tokens, 'token')}; "
            f"{index.tokenizer['name']} ({index.dtype}), mode {index.mode}, seq_len {index.seq_len}"
        )
    if any(p.supervised is not None for p in previews):
        click.echo("loss mask: [[supervised spans]] carry loss, the rest does not")
    for p in previews:
        for line in sample_lines(p, index, decode, width):
            click.echo(line)


@main.command()
@click.argument("root")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, metavar="FILE.png",
              help="Also draw the numbers into a PNG (needs pip install 'wdstream[plot]'); "
              "never over a dataset's files, never through a symlink.")  # fmt: skip
@click.option("--overwrite-plot", is_flag=True,
              help="--plot may replace an existing file that is not a PNG (outside datasets).")  # fmt: skip
@click.option("--steps", type=click.IntRange(min=1), default=None, metavar="N",
              help="A mixture: follow its first N steps (each source's share and epochs).")  # fmt: skip
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="With --steps: rows per rank (B).")  # fmt: skip
@click.option("--world-size", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --steps: ranks (W); a step is W x B rows.")  # fmt: skip
@click.option("--seq-len", type=int, default=None, help="With --steps: the Loader's seq_len "
              "(default: the sources' packed one).")  # fmt: skip
@_storage_options
def stats(
    root: str,
    as_json: bool,
    plot: str | None,
    overwrite_plot: bool,
    steps: int | None,
    batch_size: int | None,
    world_size: int,
    seq_len: int | None,
    **remote: Any,
) -> None:
    """Shards, samples, documents, tokens, bytes and a document-length histogram; with
    --plot, also a picture (document lengths, tokens per shard, padding per row, tokens per
    role).

    ROOT may be a mixture spec (.json / .toml): per-source counts and the schedule; with
    --steps N --batch-size B, each source's share and epochs over the run's first N steps
    (drawn by --plot)."""
    from wdstream.cli_stats import stats_output
    from wdstream.read.mixture.spec import is_mixture

    store = (
        _mixture_store_options(root, remote) if is_mixture(root) else _store_options(root, **remote)
    )
    lines = stats_output(root, as_json, plot, steps, store, overwrite_plot,
                         batch_size=batch_size, world_size=world_size, seq_len=seq_len)  # fmt: skip
    for line, warning in lines:
        click.echo(line, err=warning)


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
@click.option("--tokenizer", default=None, help="The dataset's tokenizer, where index.json's is "
              "not found from here (refused unless its sha256 is the recorded one).")  # fmt: skip
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
    tokenizer: str | None,
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
        text=text, tokenizer=tokenizer,
    )  # fmt: skip
    for line in lines:
        click.echo(line)


def _mixture_store_options(spec: str, remote: dict[str, Any]) -> dict[str, Any]:
    """The storage options of a spec's remote sources (from its first remote one)."""
    from wdstream.read.mixture.spec import read_spec

    urls = list(read_spec(spec).sources.values())
    return _store_options(next((u for u in urls if "://" in u), spec), **remote)


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
