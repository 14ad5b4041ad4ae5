"""Trust at the data's own edges (issue 33 items 3, 4, 5, 7, 8): which targets a masked
dataset supervises, ids that are no tokens, missing sidecars, states claiming an older
form, and mixture specs that name or read nothing.

Oracles outside the reader: the shards decoded with tarfile + msgpack (stored ids and
their bit 31, ``docs/FORMAT.md``'s rule applied here), the records written, the clean
dataset's uninterrupted run, and ``wdstream`` run as a process.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from faultlib.common import (
    READ,
    Attempt,
    clean_dataset,
    labelled,
    run_checked,
    stored_samples,
)
from faultlib.quarantine import _masked_outcome
from wdstream import Loader, StateMismatchError, WdstreamError

EOT, N_VOCAB, BIT = 100257, 100277, 1 << 31
SEQ = 31


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    """Masked records; every third holds EOT inside its ids with the next id supervised."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        size = int(rng.integers(4, 25))
        ids = [1000 + i] + rng.integers(1, 999, size - 1).tolist()
        mask = rng.integers(0, 2, size).tolist()
        if i % 3 == 0:
            at = int(rng.integers(1, size - 1))
            ids[at], mask[at + 1] = EOT, 1
        mask[-1] = 1
        out.append({"input_ids": ids, "loss_mask": mask})
    return out


def _masked_pack(work: Path, mode: str) -> Path:
    """A masked pre-tokenized pack of the records above (made once per mode)."""
    import wdstream

    root = work / f"trust-masked-{mode}"
    if not (root / "index.json").exists():
        src = work / "trust-records.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in _records(150, 4)))
        wdstream.pack([str(src)], str(root), mode=mode, seq_len=SEQ, shard_samples=12,
                      pretokenized=True, mask_key="loss_mask", tokenizer="cl100k_base",
                      workers=0)  # fmt: skip
    return root


def _stored_targets(stored: np.ndarray) -> list[int]:
    """FORMAT.md: a target is the next id without bit 31, -100 where the next has the bit."""
    return [-100 if int(x) >= BIT else int(x) for x in stored[1:]]


def stored_mask_targets(work: Path, scale: float) -> Iterator[Attempt]:
    """Every row's labels of masked best-fit and concat packs (EOS ids inside documents,
    next token supervised) at 0 and 2 workers, ``mask_doc_ends`` None / True / False: the
    stored bits decide every target (oracle: tarfile + msgpack)."""
    for mode in ("bestfit", "concat"):
        root = _masked_pack(work, mode)
        samples = stored_samples(str(root))
        stream = np.concatenate(samples)
        for workers in (0, 2):
            for rule in (None, True, False):

                def attempt(root: Path = root, workers: int = workers, rule: Any = rule,
                            samples: list = samples, stream: np.ndarray = stream) -> str:  # fmt: skip
                    kw = dict(seq_len=SEQ, batch_size=4, num_workers=workers, epochs=1, seed=3,
                              mask_doc_ends=rule)  # fmt: skip
                    try:
                        batches = list(Loader(str(root), **kw))  # type: ignore[arg-type]
                    except WdstreamError as exc:
                        return f"crash: a clean masked pack refused: {exc}"[:300]
                    plain = stream & (BIT - 1)
                    for b in batches:
                        for ids, labels in zip(b["input_ids"].tolist(), b["labels"].tolist(),
                                               strict=True):  # fmt: skip
                            want = _row_targets(ids, plain, stream)
                            if want is None:
                                return "silent wrong: a row that is no piece of the stored stream"
                            if labels != want:
                                return "silent wrong: labels differ from the stored mask"
                    return "handled"

                yield attempt


def _row_targets(ids: list[int], plain: np.ndarray, stream: np.ndarray) -> list[int] | None:
    """The stored targets of the row whose inputs are ``ids``, found in the stored stream
    (ids are unique enough: each record starts with its own number)."""
    first = np.flatnonzero(plain == ids[0])
    for at in first.tolist():
        if at + len(ids) < len(plain) and plain[at : at + len(ids)].tolist() == ids:
            return _stored_targets(stream[at : at + len(ids) + 1])
    return None


def _edited(root: Path, to: Path, edits: dict[str, Any]) -> Path:
    shutil.copytree(root, to)
    index = json.loads((to / "index.json").read_text())
    for k, v in edits.items():
        if v is ...:
            index.pop(k, None)
        else:
            index[k] = v
    (to / "index.json").write_text(json.dumps(index, indent=1))
    return to


def _ids_outcome(read: Callable[[], list[dict]], n_vocab: int) -> str:
    """A clear error, or every id delivered a token of the vocabulary (else silent)."""
    try:
        batches = read()
    except WdstreamError as exc:
        return "clear error" if str(exc) else "crash"
    for b in batches:
        if int(b["input_ids"].min()) < 0 or int(b["input_ids"].max()) >= n_vocab:
            return "silent wrong: an id outside the vocabulary was delivered"
    return "handled"


def token_ids(work: Path, scale: float) -> Iterator[Attempt]:
    """index.json of a masked pack with ``loss_mask`` deleted, nulled, or ``n_vocab``,
    ``bos_id``, ``eos_id`` edited past the ids (alone and as a mixture source); ``pack``
    with ``--bos-id`` outside the vocabulary; pre-tokenized ids that are no integers."""
    root = _masked_pack(work, "bestfit")
    kw = dict(seq_len=SEQ, batch_size=4, num_workers=0, epochs=1)
    edits: list[dict[str, Any]] = [{"loss_mask": ...}, {"loss_mask": None}]
    edits += [{"bos_id": v} for v in (N_VOCAB, 2**31, 2**31 + 5, 2**32 - 1)]
    edits += [{"tokenizer": {**json.loads((root / "index.json").read_text())["tokenizer"],
                             "n_vocab": 500}}]  # fmt: skip
    for j, edit in enumerate(edits):
        for mixed in (False, True):

            def attempt(edit: dict = edit, j: int = j, mixed: bool = mixed) -> str:
                bad = _edited(root, work / f"trust-ids-{j}-{int(mixed)}", edit)
                if mixed:

                    def read() -> list[dict]:
                        src = {"a": str(root), "b": str(bad)}
                        mix = Loader(src, weights={"a": 1, "b": 1}, seq_len=SEQ, batch_size=4)
                        return [b for _, b in zip(range(40), mix, strict=False)]
                else:

                    def read() -> list[dict]:
                        return list(Loader(str(bad), **kw))  # type: ignore[arg-type]

                vocab = edit["tokenizer"]["n_vocab"] if "tokenizer" in edit else N_VOCAB
                return _ids_outcome(read, vocab)

            yield attempt
    text = work / "trust-text.jsonl"
    text.write_text(json.dumps({"text": "hello world"}) + "\n")
    for bos in (2**31, 2**31 + 1, 2**32, 2**64, -1, N_VOCAB):

        def pack_bos(bos: int = bos) -> str:
            out = work / f"trust-bos-{bos}"
            return run_checked(["pack", str(text), "-o", str(out), "--bos-id", str(bos), "--workers", "0"],
                               120, lambda: f"--bos-id {bos} packed", names="bos_id")  # fmt: skip

        yield pack_bos
    good = [{"input_ids": [100 + i, 200 + i, 300 + i]} for i in range(4)]
    for k, value in enumerate(("null", "18446744073709551615", "9223372036854775808", "-5",
                               "1.0", "true", '"7"', "[1]", str(N_VOCAB))):  # fmt: skip
        for skip in (False, True):

            def pack_ids(value: str = value, k: int = k, skip: bool = skip) -> str:
                src = work / f"trust-ids-{k}.jsonl"
                lines = [json.dumps(r) for r in good[:2]] + [f'{{"input_ids": [5, {value}, 7]}}']
                src.write_text("\n".join(lines + [json.dumps(r) for r in good[2:]]) + "\n")
                out = work / f"trust-ids-out-{k}-{int(skip)}"
                args = ["pack", str(src), "-o", str(out), "--pretokenized", "--seq-len", "8", "--mode",
                        "docs", "--workers", "0", *(["--on-error", "skip"] if skip else [])]  # fmt: skip

                def wrong() -> str | None:
                    got = [s.tolist() for s in stored_samples(str(out))]
                    want = [r["input_ids"] + [EOT] for r in good]
                    return None if skip and got == want else f"stored {got[:3]}"

                return run_checked(args, 120, wrong, names=f"{src.name}:3")

            yield pack_ids


def missing_sidecars(work: Path, scale: float) -> Iterator[Attempt]:
    """A format-v2 dataset with one shard's sidecar deleted (and, half the time, a token
    byte of that shard flipped), read at 0 and 2 workers, token and document windows:
    refused naming the sidecar, or with ``on_corrupt="mask"`` every row the clean run's or
    masked whole and recorded; never read unchecked."""
    from wdstream.format.sidecar import ShardSidecar

    root, _ = clean_dataset(work)
    index = json.loads((Path(root) / "index.json").read_text())
    names = [s["name"] for s in index["shards"]]
    firsts = np.cumsum([0] + [s["samples"] for s in index["shards"]]).tolist()
    want = list(Loader(root, **{**READ, "seq_len": 20}))
    rng = np.random.default_rng(33)
    for i in range(max(4, int(24 * scale))):
        shard = int(rng.integers(len(names)))
        flip, workers, docs, mask = i % 2, 2 * ((i // 2) % 2), (i // 4) % 2 == 1, i % 3 == 0

        def attempt(shard: int = shard, flip: int = flip, workers: int = workers,
                    docs: bool = docs, mask: bool = mask, i: int = i) -> str:  # fmt: skip
            dst = work / f"trust-sidecar-{i}"
            shutil.copytree(root, dst)
            side = dst / index["shards"][shard]["sidecar"]
            if flip:
                offsets = ShardSidecar.from_bytes(side.read_bytes()).offsets
                data = bytearray((dst / names[shard]).read_bytes())
                data[int(offsets[len(offsets) // 2]) + 20] ^= 0x10
                (dst / names[shard]).write_bytes(bytes(data))
            side.unlink()
            opts = {**READ, "seq_len": 20, "num_workers": workers, "return_doc_boundaries": docs}
            if mask:
                loader = Loader(str(dst), on_corrupt="mask", max_quarantined=10**6, **opts)  # type: ignore[arg-type]
                got = list(loader)
                clean = [{k: v for k, v in b.items() if k in ("input_ids", "labels")}
                         for b in want]  # fmt: skip

                def sample_of(e: Any) -> int:
                    return firsts[names.index(e.shard.rsplit("/", 1)[1])] + e.sample

                return _masked_outcome(got, loader.quarantined, clean, sample_of)
            try:
                list(Loader(str(dst), **opts))  # type: ignore[arg-type]
            except WdstreamError as exc:
                return "clear error" if side.name in str(exc) else f"crash: {exc}"[:300]
            return "silent wrong: a shard whose sidecar is missing was read unchecked"

        yield attempt


def _state_after(make: Callable[[], Loader]) -> tuple[dict, list, list]:
    loader = make()
    it = iter(loader)
    for _ in range(4):
        next(it)
    it.close()
    loader.skip_steps(2)
    it = iter(loader)
    for _ in range(2):
        next(it)
    it.close()
    state = json.loads(json.dumps(loader.state_dict()))
    after = [b["input_ids"].tolist() for _, b in zip(range(3), loader, strict=False)]
    return state, after, [loader.data_step(t) for t in range(9)]


def state_downgrades(work: Path, scale: float) -> Iterator[Attempt]:
    """Global and mixture states (4 batches, 2 steps skipped, 2 batches) whose ``skips``
    were kept, edited or removed while their ``check`` was cut back to the placing fields'
    tags, removed, or kept; ``quarantined`` added. A StateMismatchError, or exactly the
    uninterrupted run (a recomputed check is forgery, which tags do not claim to stop)."""
    root, _ = clean_dataset(work)
    other = work / "trust-mix-b"
    if not other.exists():
        from wdstream.testing import write_synthetic_dataset

        write_synthetic_dataset(str(other), n_docs=20, sample_tokens=17, samples_per_shard=5,
                                seed=1)  # fmt: skip
    opts = dict(seq_len=16, batch_size=4, num_workers=0, seed=5)
    makers: dict[str, Callable[[], Loader]] = {
        "global": lambda: Loader(root, **opts),  # type: ignore[arg-type]
        "mixture": lambda: Loader({"a": root, "b": str(other)}, weights={"a": 1, "b": 1}, **opts),  # type: ignore[arg-type]  # fmt: skip
    }
    for kind, make in makers.items():
        state, after, steps = _state_after(make)
        edits: list[tuple[str, Callable[[dict], None]]] = []
        for skips in ([[4, 2]], [[4, 3]], [[3, 2]], [[4, 1]], [[4, 2], [5, 1]], []):
            edits.append((f"skips {skips}", lambda s, v=skips: s.__setitem__("skips", v)))
        edits.append(("skips removed", lambda s: s.pop("skips")))
        cuts = {
            "global": {"older check": lambda s: s.__setitem__("check", s["check"][:48])},
            "mixture": {"older check": lambda s: s.__setitem__("check", s["check"][:48])},
        }
        forms = {"kept check": lambda s: None, "no check": lambda s: s.pop("check"), **cuts[kind]}
        for label, edit in [*edits, ("quarantined 2", lambda s: s.__setitem__("quarantined", 2))]:
            for form, cut in forms.items():

                def attempt(edit: Callable = edit, cut: Callable = cut, make: Callable = make,
                            state: dict = state, after: list = after, steps: list = steps,
                            name: str = f"{kind} state, {label}, {form}") -> str:  # fmt: skip
                    return labelled(name, _downgrade(edit, cut, make, state, after, steps))

                yield attempt


def _downgrade(edit: Callable, cut: Callable, make: Callable[[], Loader], state: dict,
               after: list, steps: list) -> str:  # fmt: skip
    bad = copy.deepcopy(state)
    edit(bad)
    cut(bad)
    loader = make()
    try:
        loader.load_state_dict(bad)
    except StateMismatchError:
        return "clear error"
    got = [b["input_ids"].tolist() for _, b in zip(range(3), loader, strict=False)]
    mapping = [loader.data_step(t) for t in range(9)]
    return "handled" if (got, mapping) == (after, steps) else "silent wrong"


def spec_names_and_weights(work: Path, scale: float) -> Iterator[Attempt]:
    """Mixture specs (files and ``Loader`` mappings, and ``wdstream explain`` of the file)
    with a source named ``''`` or ``' '``, or a static weight of 0, 0.0 or -0.0: a clear
    error naming it; a 0 inside a schedule piece: read, that source absent there."""
    root, _ = clean_dataset(work)
    cases: list[tuple[dict, Any]] = [
        ({"": root, "b": root}, {"": 1, "b": 1}),
        ({" ": root, "b": root}, {" ": 1, "b": 1}),
        ({"a": root, "b": root}, {"a": 0, "b": 1}),
        ({"a": root, "b": root}, {"a": 0.0, "b": 1}),
        ({"a": root, "b": root}, {"a": 1, "b": -0.0}),
    ]
    for k, (sources, weights) in enumerate(cases):

        def in_code(sources: dict = sources, weights: Any = weights) -> str:
            try:
                Loader(sources, weights=weights, seq_len=16, batch_size=4)  # type: ignore[arg-type]
            except ValueError as exc:
                return "clear error" if "source" in str(exc) else f"crash: {exc}"[:300]
            return "silent wrong: accepted"

        def by_cli(sources: dict = sources, weights: Any = weights, k: int = k) -> str:
            spec = work / f"trust-spec-{k}.json"
            spec.write_text(json.dumps({"sources": sources, "weights": weights}))
            args = ["explain", str(spec), "--step", "0", "--batch-size", "4", "--seq-len", "16"]
            return run_checked(args, 120, lambda: "explained", names=spec.name)

        yield in_code
        yield by_cli

    def schedule_zero() -> str:
        pieces = [(0, {"a": 1, "b": 0}), (2, {"a": 1, "b": 1})]
        loader = Loader({"a": root, "b": root}, weights=pieces, seq_len=16, batch_size=4,
                        num_workers=0)  # fmt: skip
        src = [b["source"].tolist() for _, b in zip(range(4), loader, strict=False)]
        return "handled" if all(s == 0 for b in src[:2] for s in b) else "silent wrong"

    yield schedule_zero
