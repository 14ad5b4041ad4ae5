"""Randomized mixtures pinned against digests recorded from the reader at cb2712e (before
session 46's rewrite of the per-chunk fill: cached Block plus periods ``q``, the last
schedule found by identity, ``fill_runs`` in one loop, cursors rebuilt by a plain loop).

The oracle is that record, not the code under test. Each configuration comes from a seeded
generator (``random.Random``, no global RNG): 1-6 sources of very different sizes, shard
counts and sample lengths (one shorter than ``seq_len``, one masked where its bytes are
corrupt), static weights with extreme ratios or schedules of 1-4 pieces with zeros, 1-4
ranks, skips to just before a multiple of the first piece's period, a stop rule, document
boundaries; and per configuration every batch and ``state_dict()`` of the run, resumes from
its states (elastic to another world size with the same global batch, another
``chunk_batches``, a schedule changed from the saved step on), the same loader reloaded,
``batch_at`` and the rows masked. A failure after an *intended* change of the sequence means
saved states change meaning: bump ``MIXTURE_ORDER_VERSION`` and re-pin (``python
tests/test_mixture_pinned_random.py DIR`` prints the digests).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from wdstream import Loader
from wdstream.testing import write_synthetic_dataset

pytestmark = pytest.mark.timeout(120)

DATASETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_docs=6, sample_tokens=9, samples_per_shard=2),
    "small": dict(n_docs=30, sample_tokens=17, samples_per_shard=5),
    "mid": dict(n_docs=120, sample_tokens=33, samples_per_shard=40),
    "docs": dict(n_docs=40, mode="docs", samples_per_shard=7),
    "u16": dict(n_docs=60, sample_tokens=21, samples_per_shard=9, dtype="uint16"),
    "long": dict(n_docs=30, sample_tokens=257, samples_per_shard=3),
    "bad": dict(n_docs=30, sample_tokens=17, samples_per_shard=5),  # corrupted below
}
# Integers (extreme ratios, long periods) or decimals, never both in one vector: periods
# stay under MAX_PERIOD (at most 6 * 3001 rows, or lcm(3, 4, 5, 1000) * 6).
WEIGHTS = ([1, 2, 3, 7, 37, 60, 1000, 3001], [0.6, 0.25, 1 / 3, 0.001, 0.999])

# sha256 of each configuration's run (_run), recorded at cb2712e (see the module docstring).
GOLDEN: list[str] = [
    "277c81956afb10f6aea16b24567df723a13491a94372c7e35cb85c65d06df279",
    "d6b70655c9e1ca4560ec99427e55b73946eab7b61723b8a0c27f9254da6855b3",
    "00553778792b5eace8d7915f5c9f891b46f0b4cfa692f451e690aced3db8b394",
    "322ec0c3112711f26f3d32de267c47b1a77624c79dd840d89812c6c003153f2b",
    "1fa7bb7cf226407897a1b448faf9f56027d3dfdb3c9a5e1de9d066d398fe7704",
    "8197619f82ede50101dba16951acf909e1254e7e45a746d894cbafc23dd93ea4",
    "f30bde7c6c9dfaf5b6200f9aaa0d5b9dcab885cf5cb6f79455938d12dd71a03f",
    "8e483c920dcfeca591674bb16a2c878b8057b88a8505532877590b0b1aadde8f",
    "71eec10788b58ebf90a929f4580d206ff37e124dd8e2cde4813cb5ca36c5f7da",
    "6579339460ae4b4774872c5f20352ad139ea428735de6c79ad8e99573ba4e739",
    "0b85a7d6cb9159e0acd250473a3b7ba39fa73ba0b22851b7bf69a7145636f66b",
    "4c4283c5d3f6f3dec28a80f5083da48eded53f56432fa9e42ea4d6deee5f193c",
    "a2a673f2ddbb17b4003e2c1d90bfe3b488438a2fd852a36f0edf9452fb7ec4c9",
    "94e7a42fd0592c37ac0db8c0691786ad82fbd7e38e68134802752323b7831ffe",
    "cc16e1cb76832e0588587e7cdfd6b8fe00e25ddfab1de88d5ea286fb82445ae7",
    "b0f640a61536288376dade52bb2e1453d7585b72f178fd2b24b7afceaa85fdfe",
    "901902c097f1eff9773b2ae00a36db4f5d88248163408e3d279ab9d411963055",
    "6c1c3ee7c7d1077abb31e6b9026da62da4b7282816c70f4347f940f736bd48d3",
    "c52389256c34f130ac7ac9899c6c44e91f85ba39bccdd9ea7e4c1db81bdbdbdb",
    "a7816b79ae4505d995e003f019d23fbcdad88cb9ae45e1a06682a180d41121da",
    "78f13ed680b91c87efde731bcbb0345b00b62321091400f852c6e8e818835f76",
    "a5e769078f8362245d39f0257230ddda4bc2608b3738fb9459d9cfe8f860a135",
    "e1679ca19dcebc6a6270e284fda214c1e43232d71f587d50038cda3398824b2a",
    "5932da19dcc5cc0ac39aeacde6943acc9c1f5ab946fec9794ef4eaba715477eb",
    "eb12f77dd5fb7b53f488015edd42fc8446680c00519169faeb5676a16dd65ca3",
    "efd9cf7f63ab5ca8c12cc8bcdbbf3d0db256aa0f93b20474a944dd436f824008",
    "5317ae7a9eb8e75889a7344bb68211a504a0fa2026377db32227f4fde0b33b00",
    "029c609b27108fea4ab595b509b9e1b7e03e0a133cdfe13fca12e328da86891b",
    "7761356975460eed81688abf847c59ab5adf50d1b31b0b429c71421d8b3a49ce",
    "3e9887c675464c677db2503db905993d559c8d91f16df3c0cbd711e0b4e3b3be",
    "555b9dfda97e1a23e3fa0329f1405e1c864efef7a5ea1a4504d3f9a33a05ed74",
    "b0d5ba4170d98bf005e964bce9652270207f4507cc8fbf6beddfcafcd0af7efe",
    "5ab6662dec159c3b554c27d9c816c198562c24adb103f362d81f6a563c479937",
    "4bbc5337ba8c64ff1f64ba0abfbdfbde114d9976d199b172a2ad5a1459deb4b1",
    "0bba4e8d3698e71eb3acc9f51d9169e5bf4dc34a3ed47b5408fe476928bfef3f",
    "abbc077e591a1c4d27eba474341ddd3d664bae24e9a297fe57b0bbd59caf22ee",
    "6ae638c7c951693e2dcc7fa158aca7d66d0195efe6729dbbeb9ff2d8ebfdcee5",
    "8d44424fb31ceec9571f07709ec051c07ddfd13d7929f8169fc3cd0b7544846e",
    "86af7dfe8cd4b0acb1708cf16ea6517768d5a5d65cb9340be5fc7065e7885c9b",
    "56af9a38323e4fbb7197dad9515259d14131b179f05ba896db27b7830deb1370",
]


def write_datasets(root: Path) -> dict[str, str]:
    """The datasets, ``bad`` with two bytes flipped in each of its first three shards."""
    for i, (name, kw) in enumerate(DATASETS.items()):
        write_synthetic_dataset(str(root / name), seed=i, name=name, **kw)
    for shard in sorted((root / "bad").glob("*.tar"))[:3]:
        data = bytearray(shard.read_bytes())
        for at in (512 + 40, len(data) // 2 + 7):
            data[at] ^= 0x5A
        shard.write_bytes(bytes(data))
    return {name: str(root / name) for name in DATASETS}


def _weights(rng: random.Random, names: list[str], zeros: bool) -> dict[str, Any]:
    pool = [*rng.choice(WEIGHTS), *([0] if zeros else [])]
    while True:
        w = {n: rng.choice(pool) for n in names}
        if sum(w.values()) > 0:
            return w


def configs(seed: int, n: int) -> list[dict[str, Any]]:
    """``n`` configurations (see the module docstring)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        names = sorted(rng.sample(sorted(DATASETS), rng.choice([1, 2, 3, 4, 6])))
        steps, world, b = rng.randint(8, 20), rng.choice([1, 1, 2, 3, 4]), rng.choice([1, 2, 3, 5])
        if rng.random() < 0.4:
            weights: Any = _weights(rng, names, False)
        else:
            pieces = sorted(rng.sample(range(1, steps), rng.randint(0, 3)))
            weights = [[s, _weights(rng, names, True)] for s in [0, *pieces]]
            weights[0][1] = _weights(rng, names, False)
        loader = dict(seq_len=rng.choice([1, 3, 16, 31, 300]), batch_size=b, world_size=world,
                      rank=rng.randrange(world), chunk_batches=rng.choice([1, 2, 3, 16]),
                      seed=rng.randrange(1000), num_workers=0, weights=weights,
                      shuffle_window=rng.choice([4, 16, 64]), shuffle_lanes=2,
                      stop=rng.choice([None, None, "first_exhausted", "all_exhausted"]),
                      return_doc_boundaries=rng.random() < 0.3, on_corrupt="mask",
                      max_quarantined=10**12)  # fmt: skip
        resumes = []
        for _ in range(2):
            g = world * b
            w = rng.choice([x for x in (1, 2, 3, 4) if g % x == 0])
            resumes.append(dict(at=rng.randrange(steps + 1), steps=rng.randint(3, 8),
                                world_size=w, batch_size=g // w, rank=rng.randrange(w),
                                chunk_batches=rng.choice([1, 2, 5]),
                                reweigh=[rng.randrange(4), _weights(rng, names, True)]
                                if rng.random() < 0.5 else None))  # fmt: skip
        out.append(dict(names=names, loader=loader, steps=steps, resumes=resumes,
                        skip=rng.choice([0, rng.randrange(1, 3000)]),
                        batch_at=[rng.randrange(10**6) for _ in range(2)]))  # fmt: skip
    return out


class _Digest:
    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def batch(self, batch: dict[str, Any]) -> None:
        for key in sorted(batch):
            t = batch[key].contiguous().numpy()
            self.h.update(f"{key} {t.dtype} {t.shape}".encode())
            self.h.update(t.astype(t.dtype.newbyteorder("<")).tobytes())

    def text(self, obj: Any) -> None:
        self.h.update(json.dumps(obj, sort_keys=True).encode())

    def walk(self, loader: Loader, steps: int) -> list[dict[str, Any]]:
        """``steps`` batches, the state before each and after the last."""
        states = [loader.state_dict()]
        for batch in itertools.islice(loader, steps):
            self.batch(batch)
            states.append(loader.state_dict())
        for state in states:
            self.text(state)
        self.text(len(states))
        return states


def _run(c: dict[str, Any], paths: dict[str, str]) -> str:
    """The digest of one configuration's batches, states, resumes, reloads and batch_at."""
    d, sources = _Digest(), {n: paths[n] for n in c["names"]}
    main = Loader(sources, **c["loader"])
    if c["skip"]:
        main.skip_steps(c["skip"])
    states = d.walk(main, c["steps"])
    d.text([(e.step, e.rank, e.row, Path(e.shard).name, e.sample) for e in main.quarantined])
    for r in c["resumes"]:
        state = states[min(r["at"], len(states) - 1)]
        opts = dict(c["loader"], world_size=r["world_size"], batch_size=r["batch_size"],
                    rank=r["rank"], chunk_batches=r["chunk_batches"])  # fmt: skip
        if r["reweigh"] is not None:  # the schedule from the saved step on changed
            w, step = c["loader"]["weights"], state["step"]
            kept: list[list[Any]] = (
                [[0, w]] if isinstance(w, dict) else [p for p in w if p[0] < step]
            )
            begins = max(step, kept[-1][0] + 1) + r["reweigh"][0]
            opts["weights"] = [*kept, [begins, r["reweigh"][1]]]
        resumed = Loader(sources, **opts)
        resumed.load_state_dict(state)
        d.walk(resumed, r["steps"])
    for state in (states[len(states) // 2], states[0]):  # the same loader, reloaded
        main.load_state_dict(state)
        d.walk(main, 5)
    for step in c["batch_at"]:
        d.batch(main.batch_at(step))
    return d.h.hexdigest()


def digests(root: Path) -> list[str]:
    paths = write_datasets(root)
    return [_run(c, paths) for c in configs(46, len(GOLDEN) or 40)]


def test_random_mixtures_are_the_pinned_ones(tmp_path: Path) -> None:
    assert digests(tmp_path) == GOLDEN


if __name__ == "__main__":  # re-pin: python tests/test_mixture_pinned_random.py EMPTY_DIR
    print(json.dumps(digests(Path(sys.argv[1])), indent=4))
