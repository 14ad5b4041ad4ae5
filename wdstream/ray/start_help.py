"""The driver tokenises pieces itself while the cluster's workers start.

A Ray job's workers are new processes: on a just-started 2-node cluster their first piece
starts 0.4-1.1 s after ``pack()`` does (docs/RAY.md), while the driver, its tokenizer
loaded and its pieces submitted, waits. Until the first tokenising task's result is back,
the driver takes the next small piece in input order itself (the same ``tokenize_piece``,
with the tokenizer it loaded, so the same ids) instead of handing it to Ray; the pieces are
laid out in input order whoever tokenised them, so the shards are byte for byte the same.

A piece the driver tokenised is ``ray.put`` into the object store of the driver's own node,
and the driver owns it. Ray cannot rebuild such an object from lineage, and needs not: its
primary copy lives (pinned, or spilled to that node's disk) on the driver's node, and a
pack survives only the loss of other nodes (when the driver's raylet dies, Ray ends the
driver and the rerun resumes from the journal, as for any failure of Ray itself).
"""

from __future__ import annotations

from typing import Any

import ray

from wdstream.ray.pieces import InputPiece, PieceDocs
from wdstream.ray.tasks import Encoder, PieceJob, tokenize_piece

__all__ = ["StartHelp"]

_HELP_BYTES = 4 << 20  # largest piece the driver takes (~0.3-0.4 s of tokenising here)


class StartHelp:
    """Whether the driver tokenises the next piece itself, and doing it.

    Args:
        job: what every tokenising task of the pack shares.
        encoder: the driver's own tokenizer (or its bpe-openai binding): what the workers'
            recipe rebuilds.
        window: tokenising tasks the driver keeps on the cluster: it takes a piece only
            when that many are out, so the workers have theirs first.
        most: at most this many pieces (bounds the driver's memory).
    """

    def __init__(self, job: PieceJob, encoder: Encoder, window: int, most: int) -> None:
        self.job, self.encoder, self.window, self.left = job, encoder, window, most
        self.on = True
        self.taken: set[int] = set()  # numbers of the pieces the driver tokenised

    def wanted(self, piece: InputPiece | None, queue: Any) -> bool:
        """Whether the driver should tokenise ``piece`` now: it is small, the window of
        cluster tasks is full, and none of them has returned yet (``queue``: entries
        ``(i, docs, tokens)``, the docs of a piece not taken here a task's object
        reference). Off for good once one has."""
        if not self.on or piece is None or self.left <= 0 or piece.source_bytes > _HELP_BYTES:
            return False
        refs = [docs for i, docs, _ in queue if i not in self.taken]
        if len(refs) < self.window:
            return False
        if ray.wait(refs, num_returns=1, timeout=0)[0]:
            self.on = False
        return self.on

    def on_cluster(self, queue: Any) -> int:
        """How many of the queued pieces are tokenised by cluster tasks."""
        return sum(i not in self.taken for i, _, _ in queue)

    def tokenize(self, i: int, piece: InputPiece) -> tuple[int, PieceDocs, Any]:
        """Tokenise piece ``i`` here: its queue entry, the token array in the object store."""
        self.left -= 1
        self.taken.add(i)
        docs, flat = tokenize_piece(self.job, piece, self.encoder)
        return i, docs, ray.put(flat)
