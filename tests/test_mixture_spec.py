"""Mixture spec files (JSON and TOML) and the errors of bad mixtures: each names the file,
key or source and says what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from wdstream import Loader
from wdstream.read.mixture.spec import read_spec
from wdstream.testing import write_synthetic_dataset

OPTS = dict(seq_len=16, batch_size=4, num_workers=0, shuffle_window=8, shuffle_lanes=2)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spec")
    write_synthetic_dataset(str(root / "web"), n_docs=30, sample_tokens=17, samples_per_shard=8)
    write_synthetic_dataset(str(root / "code"), n_docs=10, sample_tokens=17, seed=1)
    return root


def _batches(loader: Loader, n: int) -> list[dict[str, torch.Tensor]]:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            return out
    return out


def test_json_and_toml_specs_read_like_the_arguments(root: Path) -> None:
    schedule = [(0, {"web": 0.7, "code": 0.3}), (4, {"web": 0.2, "code": 0.8})]
    direct = Loader(
        {"web": str(root / "web"), "code": str(root / "code")}, weights=schedule, **OPTS
    )
    want = _batches(direct, 9)
    (root / "mix.json").write_text(
        json.dumps(
            {
                "sources": {"web": "web", "code": str(root / "code")},  # relative and absolute
                "schedule": [{"step": s, "weights": w} for s, w in schedule],
            }
        )
    )
    (root / "mix.toml").write_text(
        'stop = "first_exhausted"\n[sources]\nweb = "web"\ncode = "code"\n'
        "[[schedule]]\nstep = 0\nweights = { web = 0.7, code = 0.3 }\n"
        "[[schedule]]\nstep = 4\nweights = { web = 0.2, code = 0.8 }\n"
    )
    for spec, stop in (("mix.json", None), ("mix.toml", "first_exhausted")):
        loader = Loader(str(root / spec), **OPTS)
        assert loader.sources == ["web", "code"]
        got = _batches(loader, 9)
        for a, b in zip(got, want, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in b)
        assert read_spec(root / spec).stop == stop


def _spec(root: Path, body: str, name: str = "bad.json") -> str:
    (root / name).write_text(body)
    return str(root / name)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"sources": {"web": "web"}, "weights": {"web": 1}, "mix": 1}', "unknown key 'mix'"),
        ('{"sources": {}, "weights": {}}', "'sources' must map names to dataset URLs"),
        ('{"sources": {"web": 3}, "weights": {"web": 1}}', "source 'web' must be a URL or path"),
        ('{"sources": {"web": "web"}}', "exactly one of 'weights' and 'schedule'"),
        (
            '{"sources": {"web": "web"}, "weights": {"web": 1}, "schedule": []}',
            "exactly one of 'weights' and 'schedule'",
        ),
        ('{"sources": {"web": "web"}, "weights": {"web": 1}, "stop": "never"}', "stop must be"),
        ('{"sources": {"web": "web"}, "weights": {"web": 1}', "not valid JSON"),
        (
            '{"sources": {"web": "web", "code": "code"}, "weights": {"web": 1, "math": 1}}',
            "weights: unknown source 'math'; the sources are web, code",
        ),
        (
            '{"sources": {"web": "web", "code": "code"}, "weights": {"web": 0, "code": 0}}',
            "weights: weights must sum to a positive total",
        ),
        (
            '{"sources": {"web": "web", "code": "code"}, "weights": {"web": -1, "code": 2}}',
            "weights: weight of source 'web' must be >= 0, got -1",
        ),
        (
            '{"sources": {"web": "web", "code": "code"}, '
            '"schedule": [{"step": 0, "weights": {"web": 1, "code": 1}}, '
            '{"step": 5, "weights": {"web": 1}}]}',
            "schedule piece 1 (step 5): no weight for source 'code'",
        ),
    ],
)
def test_bad_specs_name_the_file_and_key(root: Path, body: str, message: str) -> None:
    path = _spec(root, body)
    with pytest.raises(ValueError) as err:
        Loader(path, **OPTS)
    assert message in str(err.value)


def test_bad_toml_and_missing_files(root: Path) -> None:
    with pytest.raises(ValueError, match="bad.toml: not valid TOML"):
        Loader(_spec(root, "[sources\n", "bad.toml"), **OPTS)
    with pytest.raises(FileNotFoundError, match="nope.json: mixture spec file not found"):
        Loader(str(root / "nope.json"), **OPTS)


def test_options_that_do_not_fit_a_mixture(root: Path) -> None:
    sources = {"web": str(root / "web"), "code": str(root / "code")}
    w = {"web": 1, "code": 1}
    spec = _spec(root, json.dumps({"sources": sources, "weights": w}), "ok.json")
    cases = [
        (dict(source=spec, weights=w), "the spec file gives the weights"),
        (dict(source=sources, weights=w, epochs=1), "epochs= counts epochs of one dataset"),
        (dict(source=sources, weights=w, order="streams"), "read in the global order"),
        (dict(source=sources, weights=w, stop="sometimes"), "stop must be one of"),
        (dict(source=sources), "a mixture needs weights"),
        (dict(source=sources["web"], weights=w), "weights= and stop= are options of a mixture"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            Loader(**{**OPTS, **kwargs})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a mixture"):
        Loader(sources["web"], **OPTS).progress()


def test_sources_with_different_tokenizers_are_refused_naming_both(root: Path) -> None:
    other = root / "other"
    write_synthetic_dataset(str(other), n_docs=10, sample_tokens=17)
    index = json.loads((other / "index.json").read_text())
    index["tokenizer"] = {**index["tokenizer"], "name": "cl100k_base", "ranks_sha256": "ab" * 32}
    (other / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError) as err:
        Loader({"web": str(root / "web"), "other": str(other)}, weights={"web": 1, "other": 1},
               **OPTS)  # fmt: skip
    text = str(err.value)
    assert "sources 'web' and 'other' were packed with different tokenizers" in text
    assert "synthetic" in text and "cl100k_base" in text


def test_a_source_too_small_for_one_row_is_named(root: Path) -> None:
    tiny = root / "tiny"
    write_synthetic_dataset(str(tiny), doc_lens=[5], sample_tokens=17)
    with pytest.raises(ValueError, match="source 'tiny': dataset too small"):
        Loader({"web": str(root / "web"), "tiny": str(tiny)}, weights={"web": 1, "tiny": 1},
               **OPTS)  # fmt: skip
