"""Chunks on their way to a CUDA device: pinned, then copied one ahead on a side stream.

Used by :class:`~wdstream.read.torch.loader.Loader` with ``device=``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from wdstream.read.torch.dataset import Chunk

__all__ = ["one_ahead", "pinned", "to_device"]

A = TypeVar("A")
B = TypeVar("B")


def pinned(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """Each chunk's tensors in page-locked memory (for non-blocking copies to a GPU)."""
    for s, t, p, c in chunks:
        yield s, t.pin_memory(), (p.pin_memory() if p is not None else None), c


def to_device(chunks: Iterator[Chunk], device: torch.device) -> Iterator[Chunk]:
    """Copy each chunk to ``device`` on a side stream, one chunk ahead of its use (the
    first at once: :func:`one_ahead`)."""
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

    return one_ahead(chunks, send, ready)


def one_ahead(items: Iterator[A], send: Callable[[A], B], ready: Callable[[B], A]) -> Iterator[A]:
    """``ready(send(item))`` for each item, each sent when the one before it is yielded
    (so its copy overlaps that one's use), except the first, yielded as soon as it is sent:
    asking for the second first would, with a ``Loader``'s workers, fork them before the
    first batch (the training process makes the first step itself)."""
    pending = None
    for i, item in enumerate(items):
        sent = send(item)
        if i == 0:
            yield ready(sent)
            continue
        if pending is not None:
            yield ready(pending)
        pending = sent
    if pending is not None:
        yield ready(pending)
