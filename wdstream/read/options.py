"""``ReadOptions``: every option of a reader but its source and batch geometry, in one place.

``TokenDataset(source, seq_len, batch_size, **options)`` takes them as keywords (any other
keyword goes to the storage backend); ``Loader`` takes the same keywords in its own
signature (users' editors show them) and adds its own (workers, pinning, device,
``max_tokens``), then builds one of these.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wdstream.tokenizers.base import Tokenizer

__all__ = ["ReadOptions"]


@dataclass(frozen=True)
class ReadOptions:
    """What a reader reads and in which order.

    Attributes:
        shuffle: permute shards per epoch and shuffle samples in windows.
        seed: the one seed of all randomness.
        rank: this rank (default: ``torch.distributed``, else ``RANK``, else 0).
        world_size: number of ranks (default: ``torch.distributed``, else ``WORLD_SIZE``,
            else 1).
        streams: ``order="streams"``: independent streams of this rank (a multiple of the
            worker count; default 1). Giving it with ``order=None`` selects that order.
        epochs: epochs per ``iter()`` (None: forever); each ``iter()`` continues where the
            last one stopped, so ``for e in range(E): for b in ds`` with ``epochs=1`` walks E
            epochs.
        shuffle_window: samples per shuffle window.
        shuffle_lanes: interleaved lanes a window is drawn from.
        chunk_batches: batches per message (K); 1 when a ``TokenDataset`` is used directly.
        return_doc_boundaries: add ``position_ids``, ``cu_seqlens`` and ``doc_ids`` to each
            batch.
        mask_doc_ends: -100 as the target after each document's last token; None: on for
            ``--mode bestfit`` datasets (whose padding targets are always -100), off
            otherwise (``wdstream.read.batches.rows``).
        tokenizer: read raw text (JSON Lines, ``.txt`` or text tar shards) and tokenize it on
            the fly with this tokenizer (see ``docs/READER.md``, "Raw text"); None: the
            source is packed token shards.
        text_key: raw text: JSON field holding the text (dotted for nested fields).
        batches_per_epoch: raw text: batches every rank yields per epoch (a multiple of
            ``streams``; a stream that runs out first raises). Without it each stream stops
            when its files run out, so ranks may yield different counts.
        on_error: raw text: ``"raise"`` on a bad record (naming file and line) or ``"skip"``.
        eos: raw text: append ``<|endoftext|>`` to every document.
        tokenize_threads: raw text: threads of one batched tokenizer call.
        order: ``"global"``: one global batch sequence, the same batches for any world size
            and worker count with the same global batch, resumable on another world size,
            with ``batch_at`` (packed datasets only; ``docs/READER.md``). ``"streams"``:
            per-rank streams (the order depends on the world size and ``streams``; the only
            order for raw text). None (default): global for packed datasets, streams for raw
            text or when ``streams`` is given.
        weights: a mixture's ``{name: weight}``, or a schedule ``[(step, {name: weight})]``.
        stop: a mixture's stop rule: None (forever), ``"first_exhausted"`` or
            ``"all_exhausted"`` (``docs/MIXTURES.md``).
        on_corrupt: ``"raise"`` (default): a sample that cannot be read (a CRC32C mismatch,
            a truncated shard, a shard or sidecar the store cannot serve after its retries)
            is a ``CorruptShardError`` / ``OSError``. ``"mask"``: every row holding a token
            of it is delivered masked whole, in its place (``input_ids`` the dataset's
            padding, else EOS, else 0; ``labels`` all -100), every other row exactly as a
            clean dataset gives it; each is recorded in ``Loader.quarantined``, logged and
            counted in the state (``docs/READER.md``, "Quarantine"). Global order and
            mixtures only.
        max_quarantined: with ``"mask"``: an int, the most masked rows a run (counted in
            its state, this rank's) may have; a float in (0, 1), the largest fraction of the
            rows this reader handed out in this process that may be masked. Past it the
            batch is not handed out and ``QuarantineLimitError`` names the count and the
            last events. None (default): 0.1 % of the rows handed out in this process, and
            at least 16 rows (``wdstream.read.batches.quarantine``); ``10**12``: no limit.
        store_options: passed to the storage backend.
    """

    shuffle: bool = True
    seed: int = 0
    rank: int | None = None
    world_size: int | None = None
    streams: int | None = None
    epochs: int | None = None
    shuffle_window: int = 1024
    shuffle_lanes: int = 8
    chunk_batches: int = 1
    return_doc_boundaries: bool = False
    mask_doc_ends: bool | None = None
    tokenizer: str | Tokenizer | None = None
    text_key: str = "text"
    batches_per_epoch: int | None = None
    on_error: str = "raise"
    eos: bool = True
    tokenize_threads: int | None = None
    order: str | None = None
    weights: Any = None
    stop: str | None = None
    on_corrupt: str = "raise"
    max_quarantined: int | float | None = None
    store_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, keywords: dict[str, Any]) -> ReadOptions:
        """The options among ``keywords``; every other keyword is a store option."""
        names = {f.name for f in dataclasses.fields(cls)} - {"store_options"}
        mine = {k: v for k, v in keywords.items() if k in names}
        store = {k: v for k, v in keywords.items() if k not in names}
        return cls(**mine, store_options=store)

    def replace(self, **changes: Any) -> ReadOptions:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)
