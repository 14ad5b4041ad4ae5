"""The readers under test, each behind one interface: batches of ``[8, 2048]`` int64.

``make_loader`` builds a reader's loader (with ``state_dict`` where the reader has one),
``batches`` turns whatever it yields into ``{"input_ids", "labels"}``, epoch after epoch, and
``transport`` says how a batch gets from where it is made to the training loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchlib.common import BATCH, SAMPLE, SEQ_LEN

# what a reader's first batch needs imported (imports are not part of its start-up time)
MODULES = {
    "wdstream": "wdstream.read.torch.loader",  # the package imports its reader lazily
    "mosaicml": "streaming",
    "litdata": "litdata",
    "webdataset": "webdataset",
    "memmap": "torch",
}


class MemmapBatches:
    """nanoGPT's ``get_batch``: B random windows of T+1 tokens of one flat token file.

    The file is mapped once (nanoGPT's ``train.py`` maps it anew for every batch, which is
    slower), so this is the near-physical baseline: no shards, epochs, cursor or documents.
    """

    def __init__(
        self,
        path: str,
        seq_len: int = SEQ_LEN,
        batch_size: int = BATCH,
        seed: int = 0,
        dtype: Any = np.uint32,
    ) -> None:
        self.data = np.memmap(path, dtype=dtype, mode="r")
        if len(self.data) <= seq_len:
            raise ValueError(f"{path!r} holds {len(self.data)} tokens, need > {seq_len}")
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed

    def batches(self, seed: int | None = None) -> Iterator[dict[str, Any]]:
        import torch

        g = torch.Generator().manual_seed(self.seed if seed is None else seed)
        data, t = self.data, self.seq_len
        while True:
            ix = torch.randint(len(data) - t, (self.batch_size,), generator=g).tolist()
            x = torch.stack([torch.from_numpy(data[i : i + t].astype(np.int64)) for i in ix])
            y = torch.stack(
                [torch.from_numpy(data[i + 1 : i + 1 + t].astype(np.int64)) for i in ix]
            )
            yield {"input_ids": x, "labels": y}


def _memmap_loader(path: str, workers: int) -> Any:
    if workers == 0:
        return _Forever(MemmapBatches(path).batches())
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class _DS(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Iterator[dict[str, Any]]:
            info = get_worker_info()
            return MemmapBatches(path).batches(seed=0 if info is None else info.id)

    return DataLoader(_DS(), batch_size=None, num_workers=workers)


class _Forever:
    """An endless iterator that ``batches`` may iterate more than once."""

    def __init__(self, it: Iterator[Any]) -> None:
        self.it = it

    def __iter__(self) -> Iterator[Any]:
        return self.it


def _clean_mosaic() -> None:
    try:
        from streaming.base.util import clean_stale_shared_memory
    except ImportError:
        return
    clean_stale_shared_memory()


def make_loader(reader: str, root: str, workers: int, **options: Any) -> Any:
    """A loader object (with ``__iter__``, maybe ``state_dict``) for one reader.

    ``options`` go to ``wdstream.Loader`` only (e.g. ``checksums=False``, ``endpoint_url``).
    """
    if options and reader != "wdstream":
        raise ValueError(f"options {options!r} are for the wdstream reader, not {reader!r}")
    if reader == "memmap":
        return _memmap_loader(root, workers)
    if reader == "wdstream":
        import wdstream

        return wdstream.Loader(
            root,
            seq_len=SEQ_LEN,
            batch_size=BATCH,
            shuffle=True,
            seed=0,
            num_workers=workers,
            epochs=None,
            **options,
        )
    if reader == "mosaicml":
        import torch
        from streaming import StreamingDataLoader, StreamingDataset

        class _Tokens(StreamingDataset):  # type: ignore[misc]
            def __getitem__(self, i: int) -> Any:
                row = np.frombuffer(super().__getitem__(i)["tokens"], np.uint32)
                return torch.from_numpy(row.astype(np.int64))

        _clean_mosaic()
        ds = _Tokens(local=root, shuffle=True, shuffle_seed=0, batch_size=BATCH)
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, drop_last=True)
    if reader == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

        ds = StreamingDataset(
            input_dir=root,
            item_loader=TokensLoader(block_size=SAMPLE),
            shuffle=True,
            seed=0,
            drop_last=True,
        )
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, drop_last=True)
    if reader == "webdataset":
        import webdataset as wds

        urls = sorted(str(p) for p in Path(root).glob("*.tar"))

        def decode(raw: bytes) -> Any:
            import torch

            return torch.from_numpy(np.frombuffer(raw, np.uint32).astype(np.int64))

        ds = (
            wds.WebDataset(
                urls,
                shardshuffle=len(urls),
                seed=0,
                empty_check=False,
                nodesplitter=wds.split_by_node,
                workersplitter=wds.split_by_worker,
            )
            .shuffle(1000, seed=0)
            .to_tuple("tokens.bin")
            .map_tuple(decode)
            .batched(BATCH, partial=False)
        )
        return wds.WebLoader(ds, batch_size=None, num_workers=workers)
    raise ValueError(f"unknown reader {reader!r}")


def as_batch(reader: str, b: Any) -> dict[str, Any]:
    """One item a reader's loader yielded, as ``{"input_ids", "labels"}`` int64 [B, T]."""
    if reader in ("wdstream", "memmap"):
        return b
    import torch

    if isinstance(b, (list, tuple)):  # webdataset's to_tuple
        b = b[0]
    b = b.to(torch.int64)
    return {"input_ids": b[:, :-1], "labels": b[:, 1:]}


def batches(reader: str, loader: Any) -> Iterator[dict[str, Any]]:
    """Batches epoch after epoch, as in training."""
    while True:
        for b in loader:
            yield as_batch(reader, b)


def copied(reader: str, b: Any) -> dict[str, Any]:
    """A batch cloned out of whatever buffer the loader reuses (for comparing later)."""
    return {k: v.clone() for k, v in as_batch(reader, b).items() if k in ("input_ids", "labels")}


def transport(reader: str, workers: int, loader: Any = None) -> str:
    """How batches get from where they are made to the training loop."""
    if workers == 0:
        return "in-process"
    if reader == "wdstream" and loader is not None:
        k = loader.dataset.cfg.chunk_batches
        return f"chunks of {k} batches in a shared-memory ring, 1 message per chunk"
    # memmap, mosaicml, litdata, webdataset: torch's DataLoader moves each batch's tensors
    # to shared memory in the worker and sends one queue message per batch
    return "1 batch per DataLoader message"
