"""Which turns of a conversation a row piece of a chat dataset holds, for ``explain``.

A chat dataset's ``index.json`` records how its conversations became tokens
(``stats.chat``, :class:`~wdstream.chat.recorded.ChatSettings`). For a piece of a row,
:class:`ChatTurns` re-reads the record at the piece's ``file:line``, encodes it again with
the recorded template and options, and maps the piece's token span in its document
(``doc_span``: offsets in the document as packed, the pack's BOS/EOS included) to the
messages those tokens belong to (:attr:`~wdstream.chat.encoding.ChatEncoding.message_index`)::

    doc [0, 57) of in.jsonl:12   ->  Turns(first=2, last=4, roles=("assistant", "user",
                                           "assistant"), pack_tokens=1)      (the EOS)

Messages are numbered from 0 as in the record (``messages[2]``), as the pack's problem
reports number them.

A template may write a message's text where its end cannot be found by prefix renders (a
system prompt written inside the first user turn, an earlier turn rewritten once a later
message follows): the encoding then gives that message no tokens of its own, and its text
counts in the region of the next message (:mod:`wdstream.chat.masks`). A piece that starts
where such a shared region starts holds its first message, and one that ends where a region
ends holds its last, so those ends are exact; a piece that starts or ends inside a shared
region may hold any message of it. Its range is then the widest one it may hold, with
``approximate`` set (``turns 0-3 (...), approximate: ...``)::

    messages 0 (system, inside the user turn), 1 (user), 2 (assistant)
    regions      [ 1 ................ ][ 2 ........ ]      message 0: no tokens of its own
    piece from the first token      ->  turns 0-2            exact
    piece from inside region 1      ->  turns 0-2, approximate (it may start in 0 or in 1) Each input file is read once per call, up to the last line asked for.
An input that cannot be read (moved, not on this machine), a record that no longer parses,
or one whose tokens no longer reach the piece or (given the piece's stored ids) are not its
ids (the input, or ``index.json``'s ``stats.chat``, changed since the pack: template
variables edited would otherwise move every turn silently) gives a :class:`Turns` with
``error`` saying so; ``explain`` prints it instead of failing.
"""

from __future__ import annotations

import json
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from wdstream.chat.masks import ChatEncoder
from wdstream.chat.recorded import ChatSettings
from wdstream.chat.records import ConversationFields
from wdstream.format.index import DatasetIndex
from wdstream.inputs.compressed import open_binary
from wdstream.inputs.lines import DEFAULT_MAX_RECORD_BYTES, LongLine, bounded_lines

__all__ = ["ChatTurns", "Turns"]

_CACHE = 256  # conversations kept encoded (explain over a range revisits rows' documents)


@dataclass(frozen=True)
class Turns:
    """The messages a piece covers: ``first`` to ``last`` (0-based, inclusive) with their
    ``roles``, and ``pack_tokens`` of the pack's own BOS/EOS in the piece; or ``error``.
    ``approximate``: the piece starts or ends inside text the template shares between
    messages, and ``first``-``last`` is the widest range it may hold (module docstring)."""

    first: int | None = None
    last: int | None = None
    roles: tuple[str, ...] = ()
    pack_tokens: int = 0
    error: str | None = None
    approximate: bool = False

    def describe(self) -> str:
        """``turns 2-4 (assistant, user, assistant) + 1 pack token``, or why not known."""
        if self.error is not None:
            return f"turns unknown ({self.error})"
        extra = f" + {self.pack_tokens} pack token{'s' * (self.pack_tokens != 1)}"
        if self.first is None:
            return extra.removeprefix(" + ")
        span = (
            f"turn {self.first}" if self.first == self.last else f"turns {self.first}-{self.last}"
        )
        about = (
            ", approximate: the template's text of some of these messages is not told apart"
            if self.approximate
            else ""
        )
        return f"{span} ({', '.join(self.roles)})" + (extra if self.pack_tokens else "") + about

    def record(self) -> dict[str, Any]:
        """The JSON form ``explain --format jsonl`` writes."""
        if self.error is not None:
            return {"error": self.error}
        return {"first": self.first, "last": self.last, "roles": list(self.roles),
                "pack_tokens": self.pack_tokens, "approximate": self.approximate}  # fmt: skip


class _Piece(Protocol):
    """What a row piece gives (:class:`~wdstream.read.provenance.RowPiece`)."""

    @property
    def file(self) -> str: ...

    @property
    def line(self) -> int: ...

    @property
    def path(self) -> str | None: ...

    @property
    def doc_start(self) -> int: ...

    @property
    def doc_end(self) -> int: ...


# A conversation as encoded: each token's message, the roles, its ids; or why it is not known.
_Encoded = tuple[np.ndarray, list[str], np.ndarray] | str


class ChatTurns:
    """Finds the turns of row pieces of one chat dataset (module docstring).

    Args:
        index: the dataset's index (``stats.chat`` must be there: :meth:`of`).
        tokenizer: the dataset's tokenizer (it must encode chat text).
    """

    def __init__(self, index: DatasetIndex, tokenizer: Any) -> None:
        chat = index.stats["chat"]
        self._settings = ChatSettings.from_record(chat)
        self._encoder: ChatEncoder = self._settings.encoder(tokenizer)
        self._fields = ConversationFields(self._settings.messages_key)
        self._head = [] if index.bos_id is None else [index.bos_id]
        self._tail = [] if index.eos_id is None else [index.eos_id]
        self._bos, self._eos = len(self._head), len(self._tail)
        self._truncates = chat.get("long_docs") == "truncate"
        self._row = index.sample_tokens
        self._cache: OrderedDict[tuple[str, int], _Encoded] = OrderedDict()

    @classmethod
    def of(cls, index: DatasetIndex, given: str | None = None) -> ChatTurns | None:
        """The finder for a chat dataset (loading its tokenizer: the recorded one, found
        from ``stats.pack_cwd``, or ``given``; either checked against its recorded sha256),
        None for any other."""
        if "chat" not in index.stats:
            return None
        from wdstream.tokenizers import index_tokenizer

        return cls(index, index_tokenizer(index.tokenizer, index.stats.get("pack_cwd"), given))

    def turns(
        self, pieces: Sequence[_Piece], stored: Sequence[np.ndarray] | None = None
    ) -> list[Turns]:
        """The turns of every piece, reading each input file once (at ``path`` when the
        piece knows where its file lies, else at ``file`` from the current directory);
        ``stored``: each piece's ids as the dataset holds them, which the record encoded
        again must reproduce."""
        wanted: dict[str, set[int]] = defaultdict(set)
        for p in pieces:
            if (p.path or p.file, p.line) not in self._cache:
                wanted[p.path or p.file].add(p.line)
        for file, lines in wanted.items():
            for line, encoded in self._read(file, lines).items():
                self._cache[(file, line)] = encoded
        out = []
        for i, p in enumerate(pieces):
            key = (p.path or p.file, p.line)
            self._cache.move_to_end(key)
            out.append(self._covered(self._cache[key], p, None if stored is None else stored[i]))
        while len(self._cache) > max(_CACHE, len(pieces)):
            self._cache.popitem(last=False)
        return out

    def _read(self, file: str, lines: set[int]) -> dict[int, _Encoded]:
        """Each of ``lines`` of ``file`` (1-based) encoded, or why not."""
        out: dict[int, _Encoded] = {}
        try:
            fh, raw = open_binary(file)
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return dict.fromkeys(lines, f"{file}: cannot open the input ({why})")
        try:
            last = max(lines)
            for n, data in enumerate(bounded_lines(fh, DEFAULT_MAX_RECORD_BYTES, True), 1):
                if n in lines:
                    out[n] = self._encode(file, n, data)
                if n == last:
                    break
        except (OSError, EOFError) as exc:
            return {n: out.get(n, f"{file}: read failed ({exc})") for n in lines}
        finally:
            fh.close()
            raw.close()
        return {n: out.get(n, f"{file}: has no line {n} (the input changed)") for n in lines}

    def _encode(self, file: str, line: int, data: bytes | LongLine) -> _Encoded:
        where = f"{file}:{line}"
        if isinstance(data, LongLine):
            return f"{where}: the record is longer than {DEFAULT_MAX_RECORD_BYTES:,} bytes"
        text = data.decode("utf-8", "replace").removeprefix("\ufeff")
        try:
            record = self._fields(json.loads(text))
            enc = self._encoder.encode(record.messages, record.tools)
        except ValueError as exc:  # JSON, ConversationError
            return f"{where}: no longer a conversation ({exc})"
        return enc.message_index, enc.roles, enc.ids

    def _covered(self, encoded: _Encoded, p: _Piece, stored: np.ndarray | None) -> Turns:
        """The messages of tokens ``[doc_start, doc_end)`` of the document as packed:
        ``[BOS] ids [EOS]``, or a best-fit row's ``ids[:row - 1] EOS`` when truncated."""
        if isinstance(encoded, str):
            return Turns(error=encoded)
        index, roles, ids = encoded
        n = len(index)
        packed = self._bos + n + self._eos
        cut = self._truncates and self._row is not None and packed > self._row
        if cut:
            assert self._row is not None
            n, packed = self._row - 1 - self._bos, self._row
        if p.doc_end > packed:
            return Turns(error=f"{p.file}:{p.line}: the record now encodes to {packed} tokens, "
                               f"fewer than the piece's end {p.doc_end} (the input changed)")  # fmt: skip
        if stored is not None:
            doc = np.concatenate([self._head, ids[:n], self._tail]).astype(np.int64)
            if not np.array_equal(doc[p.doc_start : p.doc_end], stored):
                return Turns(error=f"{p.file}:{p.line}: the record now encodes to other tokens "
                                   "than the piece holds (the input, or index.json's stats.chat, "
                                   "changed since the pack)")  # fmt: skip
        lo, hi = max(p.doc_start - self._bos, 0), min(p.doc_end - self._bos, n)
        pack_tokens = (p.doc_end - p.doc_start) - max(hi - lo, 0)
        if hi <= lo:
            return Turns(pack_tokens=pack_tokens)
        first, last = int(index[lo]), int(index[hi - 1])
        # Messages without tokens of their own before a region hold text inside it.
        owned = np.bincount(index, minlength=len(roles)) > 0
        shared_from = _shared_from(owned)
        starts_region = lo == 0 or int(index[lo - 1]) != first
        ends_region = hi == len(index) or int(index[hi]) != last
        approximate = (not starts_region and shared_from[first] < first) or (
            not ends_region and shared_from[last] < last
        )
        first = int(shared_from[first])
        return Turns(first, last, tuple(roles[first : last + 1]), pack_tokens, None, approximate)


def _shared_from(owned: np.ndarray) -> np.ndarray:
    """For every message, the first of the messages without tokens of their own right
    before it (itself if there are none): the first message whose text its region may hold."""
    out = np.arange(len(owned))
    for m in range(1, len(owned)):
        if not owned[m - 1]:
            out[m] = out[m - 1]
    return out
