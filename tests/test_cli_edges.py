"""Options and outputs that harm (issue 33, item 11): ``stats --plot`` over a dataset's own
files or through a symlink, and reader options one command took while the Loader refused
them (``explain --seq-len 0`` printed rows, ``--seq-len -1`` was a ZeroDivisionError).

Oracles: the files' bytes before and after (read with open), PNG pictures decoded by
matplotlib, and the Loader's own refusal of each option value.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import wdstream
from tests.edges_support import one_error, run_cli
from wdstream.testing import write_synthetic_dataset

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli-edges") / "ds"
    write_synthetic_dataset(str(root), n_docs=30, sample_tokens=33, samples_per_shard=9)
    return root


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def test_plot_over_a_dataset_file_is_refused_even_when_asked(dataset: Path) -> None:
    pytest.importorskip("matplotlib")
    before = _files(dataset)
    for name in ["index.json", "data-000000.tar", "data-000000.idx"]:
        for ask in ([], ["--overwrite-plot"]):
            said = one_error(run_cli("stats", str(dataset), "--plot", str(dataset / name), *ask))
            assert f"--plot {dataset / name}" in said and "dataset" in said
    assert _files(dataset) == before


def test_plot_through_a_symlink_is_refused(dataset: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    victim = tmp_path / "notes.txt"
    victim.write_text("keep me")
    png = tmp_path / "old.png"
    png.write_bytes(PNG + b"old")
    before = _files(dataset)
    for target in (victim, png, dataset / "index.json"):
        link = tmp_path / f"link-{target.name}.png"
        link.symlink_to(target)
        for ask in ([], ["--overwrite-plot"]):
            said = one_error(run_cli("stats", str(dataset), "--plot", str(link), *ask))
            assert "a symlink" in said
        assert link.is_symlink() and os.readlink(link) == str(target)
    assert victim.read_text() == "keep me" and png.read_bytes() == PNG + b"old"
    assert _files(dataset) == before


def test_plot_over_a_file_that_is_no_picture_needs_asking(dataset: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    other = tmp_path / "report.csv"
    other.write_text("a,b\n")
    said = one_error(run_cli("stats", str(dataset), "--plot", str(other)))
    assert "not a PNG picture" in said and "--overwrite-plot" in said
    assert other.read_text() == "a,b\n"
    proc = run_cli("stats", str(dataset), "--plot", str(other), "--overwrite-plot")
    assert proc.returncode == 0, proc.stderr
    assert other.read_bytes().startswith(PNG) and imread(str(other), format="png").ndim == 3
    old = tmp_path / "again.png"  # an existing picture is replaced without asking
    old.write_bytes(PNG + b"stale")
    assert run_cli("stats", str(dataset), "--plot", str(old)).returncode == 0
    assert imread(str(old), format="png").ndim == 3
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_plot_into_a_missing_folder_is_refused_before_reading(
    dataset: Path, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    said = one_error(run_cli("stats", str(dataset), "--plot", str(tmp_path / "no" / "p.png")))
    assert f"the folder {tmp_path / 'no'} does not exist" in said


def test_plot_over_the_mixture_spec_is_refused(dataset: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    spec = tmp_path / "mix.json"
    spec.write_text(json.dumps({"sources": {"a": str(dataset)}, "weights": {"a": 1.0}}))
    before = spec.read_bytes()
    args = ["stats", str(spec), "--steps", "4", "--batch-size", "2", "--seq-len", "32"]
    said = one_error(run_cli(*args, "--plot", str(spec), "--overwrite-plot"))
    assert "mixture spec" in said and spec.read_bytes() == before


BAD = [("--seq-len", "0"), ("--seq-len", "-1"), ("--shuffle-window", "0"),
       ("--shuffle-lanes", "0"), ("--batch-size", "0"), ("--seed", "-1")]  # fmt: skip
LOADER_NAME = {"--seq-len": "seq_len", "--shuffle-window": "shuffle_window",
               "--shuffle-lanes": "shuffle_lanes", "--batch-size": "batch_size",
               "--seed": "seed"}  # fmt: skip


@pytest.mark.parametrize(("option", "value"), BAD)
def test_explain_refuses_what_the_loader_refuses(dataset: Path, option: str, value: str) -> None:
    name = LOADER_NAME[option]
    with pytest.raises(ValueError, match=name) as refused:
        wdstream.Loader(str(dataset), **{"seq_len": 32, "batch_size": 2, "num_workers": 0,
                                         name: int(value)})  # fmt: skip
    args = ["explain", str(dataset), "--step", "0", "--batch-size", "2", option, value]
    proc = run_cli(*args)
    assert one_error(proc) == f"Error: {refused.value}" and proc.stdout == ""


def test_stats_refuses_a_bad_run_option(dataset: Path, tmp_path: Path) -> None:
    spec = tmp_path / "mix.json"
    spec.write_text(json.dumps({"sources": {"a": str(dataset)}, "weights": {"a": 1.0}}))
    for option, value in (("--seq-len", "-1"), ("--seq-len", "0")):
        args = ["stats", str(spec), "--steps", "4", "--batch-size", "2", option, value]
        assert "seq_len must be an integer" in one_error(run_cli(*args))


def test_good_options_still_explain(dataset: Path) -> None:
    proc = run_cli("explain", str(dataset), "--step", "0", "--batch-size", "2", "--seq-len", "8",
                   "--shuffle-window", "1", "--shuffle-lanes", "1")  # fmt: skip
    # this synthetic dataset has no provenance: explain refuses it, but not for the options
    assert "must be an integer" not in proc.stderr and "Traceback" not in proc.stderr


def test_pack_refuses_a_row_length_no_reader_takes_before_writing(tmp_path: Path) -> None:
    src = tmp_path / "one.jsonl"
    src.write_text('{"text": "a b"}\n')
    for seq_len in ("1099511627776", "2147483647", "0"):
        out = tmp_path / f"o{seq_len}"
        said = one_error(run_cli("pack", str(src), "-o", str(out), "--seq-len", seq_len, "-q"))
        assert "seq_len must be in [1, 2147483646]" in said and not out.exists()
    said = one_error(run_cli("pack", str(src), "-o", str(tmp_path / "t"), "--text-key", ""))
    assert "text_key must be a non-empty str" in said
