"""Chunks on their way to a CUDA device: pinned, then copied one ahead on a side stream.

Used by :class:`~wdstream.read.torch.loader.Loader` with ``device=``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from wdstream.read.torch.dataset import Chunk

__all__ = ["pinned", "to_device"]


def pinned(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """Each chunk's tensors in page-locked memory (for non-blocking copies to a GPU)."""
    for s, t, p, c in chunks:
        yield s, t.pin_memory(), (p.pin_memory() if p is not None else None), c


def to_device(chunks: Iterator[Chunk], device: torch.device) -> Iterator[Chunk]:
    """Copy each chunk to ``device`` on a side stream, one chunk ahead of its use."""
    side = torch.cuda.Stream(device)

    def send(chunk: Chunk) -> tuple[Chunk, torch.cuda.Event]:
        s, t, p, c = chunk
        with torch.cuda.stream(side):
            t = t.to(device, non_blocking=True)
            p = p.to(device, non_blocking=True) if p is not None else None
            done = torch.cuda.Event()
            done.record(side)
        return (s, t, p, c), done

    def ready(sent: tuple[Chunk, torch.cuda.Event]) -> Chunk:
        (s, t, p, c), done = sent
        main = torch.cuda.current_stream(device)
        main.wait_event(done)
        t.record_stream(main)
        if p is not None:
            p.record_stream(main)
        return s, t, p, c

    pending = None
    for chunk in chunks:
        sent = send(chunk)
        if pending is not None:
            yield ready(pending)
        pending = sent
    if pending is not None:
        yield ready(pending)
