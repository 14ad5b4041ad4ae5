"""From a reader's arguments to its parts: a source, a batch sequence and a target rule.

What the arguments select is decided here, once, by their values: a mixture (a mapping or
a spec file) becomes a :class:`~wdstream.read.mixture.reader.MixtureReader`; one packed
dataset the global order (:class:`~wdstream.read.order.global_sequence.GlobalReader`) or
per-rank streams; raw text (a tokenizer given) per-rank streams tokenised on the fly. The
torch layer receives the parts and knows only their interfaces.

A mixture's and raw text's modules (and through them the input readers and tokenizers)
are imported only when the arguments select them: a Loader of one packed dataset imports
about half the modules, which is most of its start-up before the first read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import torch

from wdstream.read.batches.rows import RowLabels, row_labels
from wdstream.read.mixture.spec import is_mixture, mixture_spec
from wdstream.read.options import ReadOptions
from wdstream.read.order.base import BatchSequence
from wdstream.read.order.global_order import OrderConfig
from wdstream.read.order.global_sequence import GlobalReader
from wdstream.read.order.streams import ReaderContext
from wdstream.read.order.streams_context import ReaderConfig
from wdstream.read.order.streams_sequence import StreamsSequence
from wdstream.read.sources.packed import ShardSource

if TYPE_CHECKING:
    from wdstream.read.mixture.reader import MixtureReader
    from wdstream.read.sources.text import TextSource
    from wdstream.tokenizers.base import Tokenizer

__all__ = [
    "ReaderParts",
    "assemble",
    "check_quarantine",
    "check_sizes",
    "resolve_order",
    "mesh_coordinates",
    "resolve_rank",
]


@dataclass
class ReaderParts:
    """What a reader reads: its sequence, the rule turning rows into targets, and either
    its one source (``packed`` too when that is a packed dataset) or its mixture."""

    sequence: BatchSequence[Any]
    labels: RowLabels | None
    source: ShardSource | TextSource | None
    mixture: MixtureReader | None
    packed: ShardSource | None = None


def assemble(source: Any, cfg: ReaderConfig, order: str, opts: ReadOptions) -> ReaderParts:
    """Open ``source`` and build its sequence (``order`` from :func:`resolve_order`).

    Raises:
        ValueError: ``on_corrupt`` other than ``"raise"`` or ``"mask"``, or ``"mask"`` where
            rows have no global place (per-rank streams, raw text).
    """
    mask_doc_ends, store_options = opts.mask_doc_ends, opts.store_options
    quarantine = check_quarantine(opts, order, is_text(source, opts.tokenizer))
    if is_mixture(source):
        spec = mixture_spec(source, opts.weights, opts.stop)
        from wdstream.read.mixture.reader import MixtureReader
        from wdstream.read.mixture.sources import open_sources

        sources = open_sources(spec, **store_options)
        labels = _mixture_labels(spec.names, sources, cfg.seq_len, mask_doc_ends)
        mixture = MixtureReader(
            spec, sources, order_config(cfg), cfg.rank, cfg.batch_size, cfg.chunk_batches,
            cfg.doc_boundaries, quarantine,
        )  # fmt: skip
        return ReaderParts(mixture, _split_bit31(labels) if quarantine else labels, None, mixture)
    if opts.weights is not None or opts.stop is not None:
        raise ValueError("weights= and stop= are options of a mixture (a mapping of "
                         "sources or a spec file); this source is one dataset")  # fmt: skip
    one = _open_source(
        source, opts.tokenizer, opts.batches_per_epoch, text_key=opts.text_key,
        on_error=opts.on_error, eos=opts.eos, **store_options,
    )  # fmt: skip
    if not isinstance(one, ShardSource):  # raw text
        from wdstream.read.order.text_streams import TextContext

        ctx = TextContext(one, cfg, opts.batches_per_epoch, opts.tokenize_threads)
        text = StreamsSequence(ctx, cfg, one, opts.epochs, sealed=True)
        return ReaderParts(text, None, one, None)
    labels = row_labels(one.index, cfg.seq_len, mask_doc_ends)
    if quarantine:
        labels = _split_bit31(labels)
    if order == "global":
        sequence: BatchSequence[Any] = GlobalReader(
            one, order_config(cfg), cfg.rank, cfg.batch_size, cfg.chunk_batches,
            cfg.doc_boundaries, quarantine,
        )  # fmt: skip
    else:
        sequence = StreamsSequence(ReaderContext(one, cfg), cfg, one, opts.epochs)
    return ReaderParts(sequence, labels, one, None, packed=one)


def check_quarantine(opts: ReadOptions, order: str, raw_text: bool) -> bool:
    """Whether rows that cannot be read are masked (``on_corrupt="mask"``), checked.

    Raises:
        ValueError: an unknown ``on_corrupt``, a bad ``max_quarantined``, or ``"mask"`` for
            per-rank streams or raw text: their rows have no place fixed before they are
            read, so a masked row could not keep the clean run's place.
    """
    if opts.on_corrupt not in ("raise", "mask"):
        raise ValueError(f"on_corrupt must be 'raise' or 'mask', got {opts.on_corrupt!r}")
    limit = opts.max_quarantined
    if limit is not None:
        if opts.on_corrupt != "mask":
            raise ValueError("max_quarantined limits on_corrupt='mask'; it is 'raise' here")
        if isinstance(limit, bool) or not isinstance(limit, int | float):
            raise ValueError(f"max_quarantined must be an int or a float, got {limit!r:.60}")
        if isinstance(limit, float) and not 0 < limit < 1:
            raise ValueError(f"max_quarantined as a fraction must be in (0, 1), got {limit!r}")
        if isinstance(limit, int) and limit < 0:
            raise ValueError(f"max_quarantined must be >= 0, got {limit}")
    if opts.on_corrupt == "mask" and (raw_text or order != "global"):
        raise ValueError(
            "on_corrupt='mask' keeps a masked row in its place of the global order: it needs "
            "order='global' on packed data (or a mixture), not per-rank streams or raw text"
        )
    return opts.on_corrupt == "mask"


def _split_bit31(labels: RowLabels | None) -> RowLabels:
    """``labels`` that also split the no-loss bit, which masked rows carry."""
    return replace(labels or RowLabels(None, None, None, False), loss_mask=True)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: explicit, else ``torch.distributed``, else env vars, else 0/1."""
    if rank is None or world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        else:
            r, w = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    return rank, world_size


def mesh_coordinates(
    mesh: Any, rank: int | None, world_size: int | None
) -> tuple[int | None, int | None]:
    """The data-parallel rank and size: ``mesh``'s (a one-dimensional
    ``torch.distributed.device_mesh.DeviceMesh``, the data-parallel dimension of a
    tensor/pipeline-parallel run: ``device_mesh["dp"]``), else ``rank``/``world_size``.

    Every rank of one tensor-parallel group has the same coordinates in ``mesh``, so all
    of them get the same batches, and the data-parallel groups disjoint ones.

    Raises:
        ValueError: ``mesh`` given with ``rank``/``world_size``, or not one-dimensional.
    """
    if mesh is None:
        return rank, world_size
    if rank is not None or world_size is not None:
        raise ValueError("give mesh= or rank=/world_size=, not both (the mesh holds both)")
    ndim = getattr(mesh, "ndim", None)
    if ndim != 1 or not hasattr(mesh, "get_local_rank"):
        raise ValueError(
            "mesh must be the data-parallel dimension of a DeviceMesh, one-dimensional "
            f"(mesh=device_mesh['dp']), got {type(mesh).__name__} with ndim={ndim!r}"
        )
    return int(mesh.get_local_rank()), int(mesh.size())


def check_sizes(**sizes: int) -> None:
    """Every size given is at least 1.

    Raises:
        ValueError: naming the first that is not.
    """
    for name, v in sizes.items():
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v!r}")


def is_text(source: Any, tokenizer: Any) -> bool:
    """Whether the reader reads raw text (a tokenizer given, or a text source)."""
    return tokenizer is not None or _is_text_source(source)


def _is_text_source(source: Any) -> TypeGuard[TextSource]:
    """Whether ``source`` is a :class:`TextSource` object; one can only exist once its
    module was imported, so an unimported module answers no without importing it."""
    module = sys.modules.get("wdstream.read.sources.text")
    return module is not None and isinstance(source, module.TextSource)


def _open_source(
    source: str | Sequence[str] | ShardSource | TextSource,
    tokenizer: str | Tokenizer | None,
    batches_per_epoch: int | None,
    text_key: str,
    on_error: str,
    eos: bool,
    **store_options: Any,
) -> ShardSource | TextSource:
    """Packed token shards, or raw text when a tokenizer is given (or a TextSource)."""
    if _is_text_source(source):
        return source
    source = cast("str | Sequence[str] | ShardSource", source)
    if tokenizer is not None:
        if isinstance(source, ShardSource):
            raise TypeError("tokenizer= reads raw text files, not a ShardSource of token shards")
        from wdstream.read.sources.text import TextSource

        return TextSource(
            source, tokenizer, text_key=text_key, on_error=on_error, eos=eos, **store_options
        )
    if batches_per_epoch is not None:
        raise ValueError(
            "batches_per_epoch is for raw-text sources (tokenizer=...); packed shards get "
            "equal per-rank counts from their index"
        )
    return source if isinstance(source, ShardSource) else ShardSource(source, **store_options)


def resolve_order(order: str | None, raw_text: bool, streams: int | None) -> str:
    """The batch order: as given, else global for packed data unless ``streams`` was given.

    Raises:
        ValueError: for an unknown order, the global order on raw text, or ``streams`` with
            the global order (it has no per-rank streams).
    """
    if order is None:
        order = "streams" if raw_text or streams is not None else "global"
    if order not in ("streams", "global"):
        raise ValueError(f"order must be 'streams' or 'global', got {order!r}")
    if order == "global" and raw_text:
        raise ValueError(_GLOBAL_NEEDS_INDEX)
    if order == "global" and streams is not None:
        raise ValueError(
            f"streams={streams} is a setting of order='streams'; the global order's batches "
            "do not depend on streams or workers"
        )
    return order


_GLOBAL_NEEDS_INDEX = (
    "order='global' (and with it batch_at, explain and resuming on another world size) needs "
    "a packed dataset: its index gives every sample's place. Raw text is read in per-rank "
    "streams (order='streams'); pack it with `wdstream pack` for the global order"
)


def order_config(cfg: ReaderConfig) -> OrderConfig:
    """The global order's parameters of a reader's configuration."""
    return OrderConfig(
        seq_len=cfg.seq_len, global_batch=cfg.world_size * cfg.batch_size, shuffle=cfg.shuffle,
        seed=cfg.seed, shuffle_window=cfg.shuffle_window, shuffle_lanes=cfg.shuffle_lanes,
    )  # fmt: skip


def check_mixture_options(
    tokenizer: Any, order: str | None, streams: int | None, epochs: int | None
) -> None:
    """A mixture reads packed sources in the global order and ends by its stop rule.

    Raises:
        ValueError: naming the option that does not apply to a mixture.
    """
    if tokenizer is not None:
        raise ValueError("a mixture reads packed datasets; pack raw text first (tokenizer=)")
    if order not in (None, "global") or streams is not None:
        raise ValueError("a mixture is read in the global order; order='streams' and "
                         "streams= do not apply")  # fmt: skip
    if epochs is not None:
        raise ValueError(
            "epochs= counts epochs of one dataset; a mixture's sources each walk their own "
            "epochs: pass stop='first_exhausted' or stop='all_exhausted' (default None: "
            "forever) instead"
        )


def _mixture_labels(
    names: list[str], sources: list[ShardSource], seq_len: int, mask_doc_ends: bool | None
) -> RowLabels | None:
    """The one target rule of a mixture's rows (every source's must agree).

    Raises:
        ValueError: naming two sources whose packing needs different target rules.
    """
    rules = [row_labels(s.index, seq_len, mask_doc_ends) for s in sources]
    # A loss mask travels in each source's own ids (bit 31), so a chat source and a
    # pretraining source mix under one rule that splits it: only the rest must agree.
    loss_mask = any(rule is not None and rule.loss_mask for rule in rules)
    plain = [
        None if r is None or (r.pad_id is None and not r.mask_doc_ends)
        else replace(r, loss_mask=False, stored=())
        for r in rules
    ]  # fmt: skip
    for name, rule in zip(names, plain, strict=True):
        if rule != plain[0]:
            raise ValueError(
                f"sources {names[0]!r} and {name!r} need different target rules ({plain[0]} "
                f"vs {rule}); pack them in the same mode, or pass mask_doc_ends"
            )
    if not loss_mask:
        return plain[0]
    first = plain[0] or RowLabels(None, None, None, False)
    # Rows of a source with a stored mask follow it alone; the rule fills in for the rest.
    stored = tuple(s.index is not None and s.index.loss_mask is not None for s in sources)
    return replace(first, loss_mask=True, stored=stored)
